"""Prompt lookup: the n-gram index against a brute-force search, and how the decoder uses its proposals."""
import random

import pytest

from dynasd.decoders import make_decoder
from dynasd.lookup import NgramIndex
from dynasd.options import DecoderOptions
from dynasd.trace import run_from_dict, run_to_dict


def brute_force(tokens: list[int], max_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Longest tail n-gram first; its latest earlier occurrence that has a continuation."""
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        tail = tokens[-n:]
        for end in range(len(tokens) - 1, n - 1, -1):  # end = index just after the occurrence
            if tokens[end - n:end] == tail:
                return tokens[end:end + max_tokens]
    return []


@pytest.mark.parametrize("min_n,max_n", [(1, 1), (1, 3), (2, 3), (3, 4)])
def test_index_matches_brute_force_as_the_context_grows(min_n, max_n):
    rng = random.Random(min_n * 10 + max_n)
    for _ in range(30):
        index, tokens = NgramIndex(min_n, max_n), []
        for _ in range(60):
            tokens += [rng.randrange(5) for _ in range(rng.randint(1, 4))]  # steps commit 1-4 tokens
            want = rng.randint(1, 8)
            assert index.propose(tokens, want) == brute_force(tokens, want, min_n, max_n), tokens


def test_no_proposal_without_an_earlier_occurrence():
    assert NgramIndex(2, 3).propose([1, 2, 3, 4, 5], 4) == []
    assert NgramIndex(1, 3).propose([7], 4) == []
    with pytest.raises(ValueError):
        NgramIndex(3, 2)


def test_lookup_steps_skip_the_draft_and_are_recorded(tiny_pair):
    prompt = tiny_pair.encode_prompt("the cat sat on the mat. the cat sat on the mat. the cat")
    run = make_decoder(tiny_pair, DecoderOptions(method="sd", gamma=3, lookup=6)).generate(prompt, 40)
    lookup_steps = [s for s in run.steps if s.nodes and s.nodes[0].origin == "lookup"]
    assert lookup_steps, "the prompt repeats itself: lookup must fire"
    for step in lookup_steps:
        assert step.draft_forwards == 0
        assert all(n.origin == "lookup" and n.q == 1.0 for n in step.nodes)
        assert [n.parent for n in step.nodes] == list(range(-1, len(step.nodes) - 1))  # a chain
        assert len(step.nodes) <= 6
        assert step.max_nodes == 6 and step.max_depth == 6
    assert any(o == "lookup" for s in lookup_steps for o in s.committed_origins)
    assert run.config["options"]["lookup"] == 6
    assert run_from_dict(run_to_dict(run)).steps[0].nodes == run.steps[0].nodes  # the trace round-trips
    assert run.summary()["acceptance_rate"] > 0


def test_lookup_never_proposes_past_max_new_tokens(tiny_pair):
    prompt = tiny_pair.encode_prompt("abababababababababab")
    decoder = make_decoder(tiny_pair, DecoderOptions(method="sd", gamma=2, lookup=16, lookup_ngram=1))
    run = decoder.generate(prompt, 5)
    assert len(run.new_token_ids) <= 5
    assert all(len(s.nodes) <= 5 for s in run.steps)


def test_lookup_is_refused_where_it_makes_no_sense(tiny_pair):
    with pytest.raises(ValueError, match="ti-mcsd"):
        make_decoder(tiny_pair, DecoderOptions(method="ti-mcsd", width=1, depth=2, lookup=4))
    with pytest.raises(ValueError):
        make_decoder(tiny_pair, DecoderOptions(method="sd", lookup=-1))
    with pytest.raises(ValueError, match="limit"):
        make_decoder(tiny_pair, DecoderOptions(method="sd", lookup=10_000))


def test_lookup_steps_are_drawn_and_explained(tiny_pair):
    import viz

    prompt = tiny_pair.encode_prompt("the cat sat on the mat. the cat sat on the mat. the cat")
    run = make_decoder(tiny_pair, DecoderOptions(method="pld", lookup=5)).generate(prompt, 30)
    assert run.config["options"]["lookup"] == 5 and run.lossless
    index = next(i for i, s in enumerate(run.steps) if s.nodes)
    tree = viz.tree_figure(run.steps[index]).to_dict()
    symbols = set()
    for trace in tree["data"]:
        symbol = trace.get("marker", {}).get("symbol")
        symbols.update([symbol] if isinstance(symbol, str) else symbol or [])
    assert "square" in symbols and "circle" not in symbols  # lookup nodes, no draft-model nodes
    assert "Prompt lookup" in viz.step_story(run, index)
    assert any(label.startswith("accepted lookup") for _, label in viz.text_spans(run) if label)
    plain = next(i for i, s in enumerate(run.steps) if not s.nodes)  # no match: a plain target step
    assert "No draft" in viz.step_story(run, plain)
