"""The KV-cache ledger (dynasd/explorer/lessons/ledger.py), derived from the trace alone, agrees with the decoders' real
caches after every step of every method and variant (the same cases as the snapshot tests, greedy and sampled):
the target's cached rows, the draft's cached rows, and the tree rows each forward wrote. Its figure draws each
cache's rows, and the shipped examples have a ledger with no model."""
import json

import pytest
from test_snapshot import METHODS, PROMPT, case_id

from dynasd.cache import CachedModel
from dynasd.decoders import make_decoder
from dynasd.explorer.lessons.ledger import ledger_markdown, run_ledger
from dynasd.explorer.sessions.share import example_traces, load_example
from dynasd.options import DecoderOptions
from viz.ledger import ledger_figure

SAMPLING = [dict(temperature=0.0), dict(temperature=0.8, top_p=0.9)]
MAX_NEW_TOKENS = 16


def draft_cache(decoder) -> CachedModel | None:
    """The draft model's cache inside the decoder's sources (behind a fallback or a target-rooted tree)."""
    seen, todo = set(), list(getattr(decoder, "sources", []))
    while todo:
        source = todo.pop()
        if id(source) in seen:
            continue
        seen.add(id(source))
        if isinstance(getattr(source, "cache", None), CachedModel):
            return source.cache
        todo += list(getattr(source, "sources", [])) + [getattr(source, "draft", None)] * hasattr(source, "draft")
    return None


def recording(cache: CachedModel | None, log: list) -> None:
    """Record (committed rows, tree rows) of every forward of `cache` into `log`."""
    if cache is None:
        return
    forward = cache.forward

    def recorded(chain, nodes, *args, **kwargs):
        log.append((len(chain), len(nodes)))
        return forward(chain, nodes, *args, **kwargs)

    cache.forward = recorded


@pytest.mark.parametrize("sampling", SAMPLING, ids=["T0", "T0.8"])
@pytest.mark.parametrize("method,options", METHODS, ids=[case_id(m, o) for m, o in METHODS])
def test_the_ledger_matches_the_real_caches_after_every_step(tiny_pair, method, options, sampling):
    decoder = make_decoder(tiny_pair, DecoderOptions(method=method, seed=7, **sampling, **options))
    decoder.start(tiny_pair.encode_prompt(PROMPT), MAX_NEW_TOKENS, PROMPT)
    draft = draft_cache(decoder)
    assert (draft is not None) == (method in ("sd", "mcsd", "ti-mcsd", "dynamic"))
    target_log, draft_log = [], []
    recording(decoder.target, target_log)
    recording(draft, draft_log)
    real = []
    while not decoder.done:
        before = (decoder.target.cached_len, draft.cached_len if draft else None)
        target_log.clear(), draft_log.clear()
        decoder.step()
        assert decoder.target.tree_len == 0 and (draft is None or draft.tree_len == 0)
        real.append((before, (decoder.target.cached_len, draft.cached_len if draft else None),
                     [sum(rows) for rows in zip(*target_log)] or [0, 0],
                     [sum(rows) for rows in zip(*draft_log)] or [0, 0]))
    ledger = run_ledger(decoder.run)
    assert len(ledger) == len(real) > 3
    for entry, (before, after, target_wrote, draft_wrote) in zip(ledger, real):
        where = f"step {entry.index}"
        assert (entry.target.before, entry.target.after) == (before[0], after[0]), where
        assert [entry.target.chain, entry.target.tree] == target_wrote, where
        assert 0 <= entry.target.pending <= 1 and entry.target.kept + entry.target.cropped == entry.target.tree
        if draft is None:
            assert entry.draft is None
            continue
        assert (entry.draft.before, entry.draft.after) == (before[1], after[1]), where
        assert [entry.draft.chain, entry.draft.tree] == draft_wrote, where


def test_the_ledger_figure_draws_both_caches_of_an_example_and_says_where_the_next_step_starts():
    for name in example_traces():
        run = load_example(name)
        ledger = run_ledger(run)
        assert len(ledger) == len(run.steps)
        shown = next(i for i, e in enumerate(ledger) if e.target.cropped and e.target.kept)  # a rejection
        figure = ledger_figure(run, ledger, shown)
        data = json.loads(figure.to_json())
        assert "KV cache" in data["layout"]["title"]["text"]
        names = {trace.get("name") for trace in data["data"]}
        assert {"cached before", "kept (accepted path)", "cropped"} <= names
        lanes = {lane for trace in data["data"] for lane in trace["y"]}
        drafts = {"draft · this step", "draft · after"} if ledger[shown].draft is not None else set()
        assert lanes == {"target · this step", "target · after"} | drafts
        assert (ledger[shown].draft is not None) == (run.method in ("sd", "mcsd", "ti-mcsd", "dynamic"))
        assert "next step starts" in json.dumps(data["layout"]["annotations"])
        assert f"row {ledger[shown].target.after}" in ledger_markdown(ledger[shown])


def test_the_kv_cache_endpoint_shows_the_ledger_of_a_replayed_example(explorer_url):
    from gradio_client import Client

    client = Client(explorer_url, verbose=False)
    assert "no step to show yet" in client.predict(0, api_name="/kv_cache")[1]
    client.predict("mcsd-greedy", api_name="/replay_example")
    figure, text = client.predict(2, api_name="/kv_cache")
    assert "KV cache" in json.loads(figure["plot"])["layout"]["title"]["text"]
    assert text.startswith("**Step 2, target:**") and "cropped" in text
