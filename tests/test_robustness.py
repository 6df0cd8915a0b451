"""Bad input gets a clear message, never a traceback, and never touches another session.

Unit level (Session, PairCache, load_trace) for every kind of bad input, then the same kinds through the running
app (in-process, so a test can also break one session's model on purpose and watch the others carry on).
"""
import json
import time
from dataclasses import replace

import pytest
import torch

from dynasd.decoders import make_decoder
from dynasd.explorer.failures import SessionFailed
from dynasd.explorer.inputs import CUSTOM, MAX_PROMPT_CHARS, Settings, UserError, settings_of_trace
from dynasd.explorer.pairs import PairCache, pairs_from_env
from dynasd.explorer.sessions.registry import SessionRegistry
from dynasd.explorer.sessions.session import Session, load_trace
from dynasd.loading.models import ModelLoadError, load_pair, tiny_llama, tiny_random_pair, tiny_tokenizer
from dynasd.options import MAX_TREE_NODES, DecoderOptions
from dynasd.trace import run_to_dict, save_run
from viz.text import shown_piece

OUT = dict(text=0, tree=1, mask=2, pq=3, stop=4, timeline=5, summary=6, status=7, story=8, scrubber=9)
TINY = dict(pair="tiny-random", method="mcsd", max_new_tokens=16)
ONE_TOKEN_PER_STEP = dict(pair="tiny-random", method="ar", max_new_tokens=512)  # step n is "Step n" for long


class TinyLoader:
    """Hands out one shared tiny pair; anything else is an unknown model."""

    def __init__(self):
        self.pair = tiny_random_pair()
        self.calls = 0

    def __call__(self, name=None, target=None, draft=None, device=None, dtype=None, allowed_root=None):
        self.calls += 1
        if name != "tiny-random":
            raise ModelLoadError(f"cannot load '{name or target}'")
        return self.pair


@pytest.fixture(scope="module")
def pairs():
    return PairCache(loader=TinyLoader())


# -- every kind of bad setting is a UserError with a reason, refused before any model is built ----------------------

BAD_SETTINGS = {
    "empty prompt": (dict(), "", "prompt is empty"),
    "whitespace prompt": (dict(), " \n\t ", "prompt is empty"),
    "prompt not text": (dict(), None, "prompt is empty"),
    "prompt over the character cap": (dict(), "a" * (MAX_PROMPT_CHARS + 1), "characters; the limit"),
    "prompt over the context limit": (dict(max_new_tokens=500), "long " * 200, "exceeds the model's context"),
    "max_new_tokens zero": (dict(max_new_tokens=0), "hi", "max new tokens"),
    "max_new_tokens over the cap": (dict(max_new_tokens=513), "hi", "max new tokens"),
    "max_new_tokens infinite": (dict(max_new_tokens=float("inf")), "hi", "whole number"),
    "max_new_tokens NaN": (dict(max_new_tokens=float("nan")), "hi", "whole number"),
    "max_new_tokens not a number": (dict(max_new_tokens="many"), "hi", "whole number"),
    "max_new_tokens fractional": (dict(max_new_tokens=3.5), "hi", "whole number"),
    "tree shape empty": (dict(k_config=""), "hi", "empty tree shape"),
    "tree shape zero": (dict(k_config="4,0"), "hi", "at least 1"),
    "tree shape negative": (dict(k_config="-2,2"), "hi", "at least 1"),
    "tree shape not numeric": (dict(k_config="4,x"), "hi", "comma-separated integers"),
    "tree shape missing level": (dict(k_config="4,,2"), "hi", "comma-separated integers"),
    "tree shape float": (dict(k_config="2.5,2"), "hi", "comma-separated integers"),
    "tree shape over the node cap": (dict(k_config="16,16"), "hi", f"limit is {MAX_TREE_NODES}"),
    "tree shape astronomically big": (dict(k_config="99999,99999,99999"), "hi", "limit is"),
    "tree shape text too long": (dict(k_config="1," * 150 + "1"), "hi", "characters long"),
    "tree shape not text": (dict(k_config=[4, 2]), "hi", "must be text"),
    "sd gamma zero": (dict(method="sd", gamma=0), "hi", "gamma must lie"),
    "sd gamma negative": (dict(method="sd", gamma=-3), "hi", "gamma must lie"),
    "sd gamma huge": (dict(method="sd", gamma=10**9), "hi", "gamma must lie"),
    "ti-mcsd width over the cap": (dict(method="ti-mcsd", width=300), "hi", "width must lie"),
    "ti-mcsd tree over the node cap": (dict(method="ti-mcsd", width=64, depth=8), "hi", "limit is"),
    "ti-mcsd depth zero": (dict(method="ti-mcsd", depth=0), "hi", "depth must lie"),
    "temperature negative": (dict(temperature=-0.5), "hi", "temperature must lie"),
    "temperature too high": (dict(temperature=11.0), "hi", "temperature must lie"),
    "temperature NaN": (dict(temperature=float("nan")), "hi", "finite"),
    "temperature not numeric": (dict(temperature="hot"), "hi", "temperature must be a number"),
    "top-p zero": (dict(top_p=0.0), "hi", "top-p must lie"),
    "top-p above one": (dict(top_p=1.5), "hi", "top-p must lie"),
    "top-p infinite": (dict(top_p=float("inf")), "hi", "finite"),
    "top-k negative": (dict(top_k=-1), "hi", "top-k must be"),
    "top-k fractional": (dict(top_k=2.5), "hi", "whole number"),
    "threshold above one": (dict(stop="confidence", threshold=1.5), "hi", "threshold must lie"),
    "seed negative": (dict(seed=-1), "hi", "seed must lie"),
    "seed beyond 64 bits": (dict(seed=2**64), "hi", "seed must lie"),
    "unknown method": (dict(method="beam"), "hi", "unknown method"),
    "unknown stop policy": (dict(stop="sometimes"), "hi", "unknown stop policy"),
    "lookup over the tree-node limit": (dict(lookup=MAX_TREE_NODES + 1), "hi", "prompt lookup must lie"),
    "lookup n-gram zero": (dict(lookup_ngram=0), "hi", "n-gram must lie"),
    "with replacement not a flag": (dict(with_replacement="sometimes"), "hi", "must be 1 or 0"),
    "target-initialized shape bad": (dict(method="ti-mcsd", ti_k_config="3,x"), "hi", "comma-separated integers"),
    "target-initialized shape of one level": (dict(method="ti-mcsd", ti_k_config="3"), "hi", "one draft level"),
    "unknown draft kind": (dict(draft_kind="pictures"), "hi", "unknown draft kind"),
    "decision model missing": (dict(stop="decision", decision_model="/no/such/model"), "hi", "no decision model"),
    "decision model not text": (dict(stop="decision", decision_model=5), "hi", "decision model must be text"),
    "unknown pair": (dict(pair="gpt-17"), "hi", "unknown model pair"),
    "pair that looks like a path": (dict(pair="../../secret"), "hi", "unknown model pair"),
    "pair not text": (dict(pair=None), "hi", "must be a string"),
    "custom pair without models": (dict(pair=CUSTOM), "hi", "needs both a target and a draft"),
    "custom model id too long": (dict(pair=CUSTOM, target="x" * 400, draft="y"), "hi", "at most"),
}


@pytest.mark.parametrize("kind", list(BAD_SETTINGS))
def test_bad_settings_are_refused_with_a_reason_and_leave_other_sessions_alone(pairs, kind):
    changes, prompt, message = BAD_SETTINGS[kind]
    registry = SessionRegistry()
    healthy, victim = registry.get(None), registry.get(None)
    healthy.start(pairs, Settings(**TINY), "hello")
    healthy.step(pairs)
    started = time.monotonic()
    with pytest.raises(UserError, match=message):
        victim.start(pairs, Settings(**{**TINY, **changes}), prompt)
    assert time.monotonic() - started < 5, "refused before building anything big"
    assert victim.run is None and victim.error is None
    assert healthy.step(pairs).index == 1


def test_a_prompt_the_tokenizer_cannot_read_is_a_user_error(pairs):
    session = SessionRegistry().get(None)
    with pytest.raises(UserError):
        session.start(pairs, Settings(**TINY), "lone surrogate \ud800 here")


# -- models: unknown, unreachable, incompatible, outside the allowed folder ------------------------------------------

def save_tiny_model(folder, vocab_size=None, seed=1):
    tokenizer = tiny_tokenizer()
    model = tiny_llama(vocab_size or len(tokenizer), seed=seed, layers=1)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    save_tiny_model(root / "target", seed=1)
    save_tiny_model(root / "draft", seed=2)
    save_tiny_model(root / "draft-small-vocab", vocab_size=50, seed=3)
    (root / "broken").mkdir()
    (root / "broken" / "config.json").write_text("{not json")
    outside = tmp_path_factory.mktemp("outside")
    save_tiny_model(outside / "model", seed=4)
    (root / "escape").symlink_to(outside / "model")
    return root, outside


def custom(target, draft):
    return Settings(pair=CUSTOM, target=str(target), draft=str(draft), max_new_tokens=8)


def test_unknown_and_unreachable_hub_ids_are_user_errors(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    session, pairs = SessionRegistry().get(None), PairCache(device="cpu")
    with pytest.raises(UserError, match="not in the local cache and the Hugging Face hub is unreachable"):
        session.start(pairs, custom("no-such-org/no-such-model", "no-such-org/other"), "hi")
    with pytest.raises(UserError, match="no model at local path"):
        session.start(pairs, custom("/nonexistent/model", "/nonexistent/model"), "hi")
    assert pairs._loading == {}, "failed loads leave nothing behind"


def test_a_tokenizer_incompatible_pair_is_refused(model_dir):
    root, _ = model_dir
    pairs = PairCache(device="cpu", model_dir=root)
    session = SessionRegistry().get(None)
    with pytest.raises(UserError, match="incompatible pair.*vocabulary"):
        session.start(pairs, custom(root / "target", root / "draft-small-vocab"), "hi")
    with pytest.raises(ModelLoadError, match="incompatible"):  # the engine check itself
        load_pair(target=str(root / "target"), draft=str(root / "draft-small-vocab"), device="cpu")


def test_a_corrupt_model_folder_or_a_crashing_loader_is_a_user_error(model_dir):
    root, _ = model_dir
    session = SessionRegistry().get(None)
    with pytest.raises(UserError, match="cannot load"):
        session.start(PairCache(device="cpu"), custom(root / "broken", root / "draft"), "hi")

    def crashing_loader(*args, **kwargs):
        raise RuntimeError("segfault-ish trouble in a loader")

    with pytest.raises(UserError, match="RuntimeError: segfault-ish"):
        session.start(PairCache(loader=crashing_loader), Settings(pair="tiny-random"), "hi")


def test_public_mode_with_a_model_dir_allows_only_models_inside_it(model_dir):
    root, outside = model_dir
    pairs = PairCache(device="cpu", model_dir=root, allow_hub=False)
    session = SessionRegistry().get(None)
    refused = {"parent traversal": "../outside/model", "absolute path outside": str(outside / "model"),
               "symlink leading outside": "escape", "system folder": "/etc",
               "hub id": "HuggingFaceTB/SmolLM2-135M-Instruct", "home folder": "~/model"}
    for kind, ref in refused.items():
        with pytest.raises(UserError, match="outside the server's model folder|no model named") as info:
            session.start(pairs, custom(ref, "draft"), "hi")
        assert str(outside) in ref or str(outside) not in str(info.value), f"{kind}: where a symlink leads stays secret"
    session.start(pairs, custom("target", "draft"), "hi")  # names inside the folder work
    assert session.step(pairs).index == 0


def test_public_mode_settings_come_from_the_environment(tmp_path):
    public = pairs_from_env({"DYNASD_PUBLIC": "1"})
    assert not public.allow_custom
    with pytest.raises(UserError, match="custom models are turned off"):
        public.get(Settings(pair=CUSTOM, target="/etc", draft="/etc"))
    confined = pairs_from_env({"DYNASD_PUBLIC": "1", "DYNASD_MODEL_DIR": str(tmp_path)})
    assert confined.allow_custom and not confined.allow_hub and confined.model_dir == tmp_path.resolve()
    private = pairs_from_env({"DYNASD_MODEL_DIR": str(tmp_path)})
    assert private.allow_hub and private.model_ref("org/name") == "org/name"
    assert not public.allow_decision_paths and not confined.allow_decision_paths and private.allow_decision_paths
    with pytest.raises(UserError, match="outside"):
        private.model_ref("/etc/passwd")


def test_a_public_server_offers_only_the_shipped_decision_models():
    from dynasd.stopping.policies import shipped_decision_models

    public = PairCache(loader=TinyLoader(), allow_custom=False, allow_hub=False, allow_decision_paths=False)
    session = SessionRegistry().get(None)
    for reference in ("/etc", "../decision", "/tmp", "decision-smollm2-hard/.."):
        with pytest.raises(UserError, match="only its shipped decision models"):
            session.start(public, Settings(**TINY, stop="decision", decision_model=reference), "hi")
    assert shipped_decision_models() == ["decision-smollm2-hard", "decision-smollm2-soft"]
    public.check_decision_model("decision-smollm2-soft")  # allowed (it reads SmolLM2's hidden states, not tiny's)
    for reference in (None, "decision-smollm2-hard"):
        session.start(public, Settings(**TINY, stop="decision", decision_model=reference), "hi")
        assert session.step(public).index == 0


def test_every_explorer_entry_point_keeps_the_public_servers_policy():
    """Compare, two methods on one step, the losslessness check and the peer all start through engine.prepare, so
    none of them opens a decision model a public server does not ship."""
    from dynasd.explorer.lessons import losslessness, side_by_side
    from dynasd.explorer.measure import peer
    from dynasd.explorer.measure.compare import run_compare

    public = PairCache(loader=TinyLoader(), allow_custom=False, allow_hub=False, allow_decision_paths=False)
    sneaky = Settings(**TINY, stop="decision", decision_model="/etc", temperature=1.0)
    entries = {"compare": lambda: list(run_compare(public, sneaky, "hi")),
               "side by side": lambda: side_by_side.one_step(public, sneaky, "sd", [1, 2, 3], "hi"),
               "losslessness": lambda: losslessness.check_first_tokens(public, sneaky, "hi", ["sd"], 10),
               "peer": lambda: peer.run_peer(public, sneaky, "hi")}
    for name, entry in entries.items():
        with pytest.raises(UserError, match="only its shipped decision models"):
            entry()
        assert public.loaded() == [], f"{name}: refused before any model loaded"


# -- trace files from strangers ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def good_trace(tiny_pair):
    run = make_decoder(tiny_pair, DecoderOptions()).generate(tiny_pair.encode_prompt("hello"), 12, "hello")
    return run_to_dict(run)


def hostile_traces(good: dict) -> dict:
    def with_step(**changes):
        obj = json.loads(json.dumps(good))
        obj["steps"][0].update(changes)
        return obj

    def with_node(**changes):
        obj = json.loads(json.dumps(good))
        obj["steps"][0]["nodes"][0].update(changes)
        return obj

    chain = [dict(good["steps"][0]["nodes"][0], parent=i - 1, level=i + 1) for i in range(300)]
    mask = ["1" * (i + 1) + "0" * (299 - i) for i in range(300)]
    return {
        "not JSON": b"this is not json",
        "pickle bytes": b"\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93.",
        "empty file": b"",
        "binary garbage": bytes(range(256)) * 4,
        "deeply nested": b"[" * 100_000 + b"]" * 100_000,
        "JSON array": b"[1, 2, 3]",
        "wrong format": {"format": "something-else/9"},
        "python object hook": {**good, "__reduce__": ["os.system", ["true"]]},
        "steps not a list": {**good, "steps": 5},
        "new token ids not a list": {**good, "new_token_ids": 5},
        "token ids not integers": {**good, "new_token_ids": ["x"]},
        "prompt not a string": {**good, "prompt": {"a": 1}},
        "config not an object": {**good, "config": "x"},
        "NaN probability": with_node(p=float("nan")),
        "probability above one": with_node(p=7.5),
        "level as text": with_node(level="1"),
        "level disagrees with parent": with_node(level=3),
        "token id fractional": with_node(token_id=1.5),
        "token string a number": with_node(token=5),
        "unknown node status": with_node(status="pwned"),
        "parent after child": with_node(parent=5),
        "accepted path not a chain": with_step(accepted_path=[0, 1]),
        "committed lists differ": with_step(committed_tokens=[]),
        "verify mask wrong size": with_step(verify_mask=["1"]),
        "step not an object": {**good, "steps": ["step"]},
        "tree over the node cap": with_step(nodes=chain, verify_mask=mask, accepted_path=[]),
        "step index text": with_step(index="zero"),
    }


def write_trace(folder, kind, payload):
    path = folder / (kind.replace(" ", "-") + ".json")
    if isinstance(payload, bytes):
        path.write_bytes(payload)
    else:
        path.write_text(json.dumps(payload))
    return path


def test_hostile_trace_files_are_refused_with_a_reason(good_trace, tmp_path):
    assert load_trace(write_trace(tmp_path, "good", good_trace)).steps
    for kind, payload in hostile_traces(good_trace).items():
        with pytest.raises(UserError, match="cannot load that trace") as info:
            load_trace(write_trace(tmp_path, kind, payload))
        assert "Traceback" not in str(info.value), kind


def test_a_trace_over_the_size_cap_is_refused_unread(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:  # sparse: 21 MB on paper, nothing on disk
        f.truncate(21 * 1024 * 1024)
    with pytest.raises(UserError, match="the limit is"):
        load_trace(path)
    with pytest.raises(UserError, match="expected a file"):
        load_trace(None)


@pytest.mark.parametrize("changes", [dict(method="sd", gamma=3, temperature=0.7, top_p=0.9, seed=5),
                                     dict(method="mcsd", k_config="3,2,1", dynamic_depth=True, stop="confidence",
                                          threshold=0.3, lookup=4, lookup_ngram=1, with_replacement=True),
                                     dict(method="ti-mcsd", width=2, depth=3, top_k=5),
                                     dict(method="ti-mcsd", ti_k_config="2,2,1", stop="cumulative"),
                                     dict(method="pld", lookup=6), dict(method="ar", seed=9)])
def test_a_saved_run_gives_back_the_settings_it_was_made_with(pairs, tmp_path, changes):
    """What the app puts into its controls when a trace is loaded: the settings that made the run."""
    settings = Settings(pair="tiny-random", max_new_tokens=12, **changes).normalised()
    session = Session("author")
    session.start(pairs, settings, "hello there")
    while not session.run.finished:
        session.step(pairs)
    path = tmp_path / "run.json"
    save_run(session.run, path)
    loaded = load_trace(path)
    restored = settings_of_trace(loaded)
    if loaded.finished != "length":  # ended on end-of-sequence: the trace cannot tell the budget
        restored = replace(restored, max_new_tokens=settings.max_new_tokens)
    assert restored == settings
    hand_edited = {**loaded.config, "options": {**loaded.config["options"], "temperature": "hot"}}
    assert settings_of_trace(replace(loaded, config=hand_edited)) is None


# -- failures inside one session's model calls ------------------------------------------------------------------------

def test_a_failing_prefill_marks_only_its_own_session(pairs):
    from dynasd.explorer import engine

    registry = SessionRegistry()
    healthy, broken = registry.get(None), registry.get(None)
    healthy.start(pairs, Settings(**TINY), "hello")
    engine.FAULTS.arm("poison", MemoryError("out of memory while prefilling (injected)"), during="prefill")
    with pytest.raises(SessionFailed, match="prefill.*MemoryError.*Reset"):
        broken.start(pairs, Settings(**TINY), "poison")
    assert broken.error and broken.snapshot is None and healthy.error is None
    assert healthy.step(pairs).index == 0
    assert not pairs.lock_for(pairs.get(healthy.settings)).locked()


def test_an_injected_fault_goes_off_once_in_the_run_of_its_prompt_only(pairs):
    """The engine's fault hook (what the soak and these tests break sessions with): a step's fault waits for a
    step of its own run, whatever other runs step meanwhile, goes off there once, and is gone."""
    from dynasd.explorer import engine

    registry = SessionRegistry()
    victim, bystander = registry.get(None), registry.get(None)
    victim.start(pairs, Settings(**TINY), "victim")
    bystander.start(pairs, Settings(**TINY), "bystander")
    engine.FAULTS.arm("victim", RuntimeError("CUDA error: device-side assert triggered (injected)"))
    assert bystander.step(pairs).index == 0 and bystander.step(pairs).index == 1
    with pytest.raises(SessionFailed, match="RuntimeError: CUDA error"):
        victim.step(pairs)
    victim.reset()
    victim.start(pairs, Settings(**TINY), "victim")
    assert victim.step(pairs).index == 0, "the fault went off once"
    with pytest.raises(ValueError, match="during"):
        engine.FAULTS.arm("victim", MemoryError(), during="render")


def test_a_finished_run_releases_its_caches(pairs):
    from dynasd.explorer import engine

    session = SessionRegistry().get(None)
    session.start(pairs, Settings(**{**TINY, "max_new_tokens": 4}), "hello")
    while not session.done:
        session.step(pairs)
    assert session.run.steps and session.snapshot is not None, "the run stays on show, its state as data"
    assert engine.LIVE.take(session.snapshot.fingerprint) is None, "no live decoder (no KV cache) is kept for it"
    with pytest.raises(UserError, match="finished"):
        session.step(pairs)


# -- the same through the running app --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(explorer_inprocess):
    return explorer_inprocess


@pytest.fixture
def connect(server):
    from gradio_client import Client

    return lambda: Client(server.url, verbose=False)


def status_or_error(client, api_name="/step", *args, **kwargs) -> str:
    """The status line, or the message of the error gradio raised while checking the inputs."""
    try:
        return client.predict(*args, **kwargs, api_name=api_name)[OUT["status"]]
    except Exception as exc:  # gradio_client's AppError
        return f"error: {exc}"


APP_BAD_INPUTS = {
    "empty prompt": (dict(prompt="", **TINY), "prompt is empty"),
    "whitespace prompt": (dict(prompt="   ", **TINY), "prompt is empty"),
    "prompt over the context": (dict(prompt="word " * 300, pair="tiny-random", max_new_tokens=500),
                                "exceeds the model's context"),
    "max new tokens over the cap": (dict(prompt="hi", pair="tiny-random", max_new_tokens=100_000),
                                    "max new tokens must lie in [1, 512], got 100000"),
    "tree zero": (dict(prompt="hi", pair="tiny-random", k_config="0"), "at least 1"),
    "tree negative": (dict(prompt="hi", pair="tiny-random", k_config="-4,2"), "at least 1"),
    "tree non-numeric": (dict(prompt="hi", pair="tiny-random", k_config="four"), "comma-separated integers"),
    "tree over the node cap": (dict(prompt="hi", pair="tiny-random", k_config="8,8,8"), "limit is 256"),
    "tree text huge": (dict(prompt="hi", pair="tiny-random", k_config="1," * 5000), "characters long"),
    "temperature out of range": (dict(prompt="hi", pair="tiny-random", temperature=50.0), "must lie in [0, 10]"),
    "top-p out of range": (dict(prompt="hi", pair="tiny-random", top_p=0.0), "top-p must lie in (0, 1]"),
    "top-k out of range": (dict(prompt="hi", pair="tiny-random", top_k=-3), "top-k must be at least 0"),
    "seed not a number": (dict(prompt="hi", pair="tiny-random", seed="abc"), "seed must be a whole number"),
    "slider sent null": (dict(prompt="hi", pair="tiny-random", gamma=None), "gamma must be a whole number"),
    "unknown pair": (dict(prompt="hi", pair="gpt-17"), "not in the list of choices"),
    "unknown method": (dict(prompt="hi", pair="tiny-random", method="beam"), "not in the list of choices"),
    "target-initialized shape non-numeric": (dict(prompt="hi", pair="tiny-random", method="ti-mcsd",
                                                  ti_k_config="a,b"), "comma-separated integers"),
    "lookup n-gram over its slider": (dict(prompt="hi", pair="tiny-random", lookup_ngram=50), "must lie in [1, 32]"),
    "missing decision model": (dict(prompt="hi", pair="tiny-random", stop="decision",
                                    decision_model="/no/such/model"), "no decision model"),
    "unreachable hub id": (dict(prompt="hi", pair=CUSTOM, target="no-org/no-model", draft="no-org/no-model"),
                           "hub is unreachable"),
    "missing local model": (dict(prompt="hi", pair=CUSTOM, target="/nonexistent/m", draft="/nonexistent/m"),
                            "no model at local path"),
}


REFUSED_BY_GRADIO = {"unknown pair", "unknown method"}


def test_bad_input_through_the_app_gets_a_clear_message_and_other_sessions_carry_on(connect):
    healthy, client = connect(), connect()
    assert "Step 0" in status_or_error(healthy, prompt="hello", **ONE_TOKEN_PER_STEP)
    for number, (kind, (kwargs, message)) in enumerate(APP_BAD_INPUTS.items(), start=1):
        status = status_or_error(client, **kwargs)
        assert message in status, f"{kind}: {status}"
        # Only a choice that is not in a list is refused by Gradio itself (the page offers no way to send one);
        # every number, typed outside its control's range too, reaches the handler and its status line.
        assert status.startswith("⚠") or kind in REFUSED_BY_GRADIO, f"{kind}: {status}"
        assert "Traceback" not in status and "verbose error reporting" not in status, f"{kind}: {status}"
        assert not status.startswith("✓"), kind
        assert f"Step {number}" in status_or_error(healthy, prompt="hello", **ONE_TOKEN_PER_STEP), kind
    assert "Step 0" in status_or_error(client, prompt="now a good one", **TINY)


def test_hostile_trace_uploads_are_refused_and_the_session_still_works(connect, good_trace, tmp_path):
    from gradio_client import handle_file

    client = connect()
    traces = hostile_traces(good_trace)
    for kind in ("not JSON", "pickle bytes", "deeply nested", "level as text", "NaN probability",
                 "tree over the node cap", "accepted path not a chain"):
        status = status_or_error(client, "/load_trace", handle_file(str(write_trace(tmp_path, kind,
                                                                                      traces[kind]))))
        assert status.startswith("⚠") and "cannot load that trace" in status, f"{kind}: {status}"
    assert "Step 0" in status_or_error(client, prompt="hello", **TINY)


def test_a_failing_model_call_fails_one_session_and_the_server_stays_up(connect):
    from dynasd.explorer import engine

    victim, bystander = connect(), connect()
    assert "Step 0" in status_or_error(victim, prompt="victim prompt", **TINY)
    assert "Step 0" in status_or_error(bystander, prompt="bystander prompt", **TINY)
    engine.FAULTS.arm("victim prompt", torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB "
                                                              "(injected)"))
    status = status_or_error(victim, prompt="victim prompt", **TINY)
    assert status.startswith("✗") and "OutOfMemoryError: CUDA out of memory" in status and "Reset" in status
    assert "Step 1" in status_or_error(bystander, prompt="bystander prompt", **TINY)
    assert "OutOfMemoryError" in status_or_error(victim, prompt="victim prompt", **TINY), "stays failed"
    assert "Reset" in status_or_error(victim, "/reset")
    assert "Step 0" in status_or_error(victim, prompt="victim prompt", **TINY)
    assert "Step 2" in status_or_error(bystander, prompt="bystander prompt", **TINY)


def test_an_unexpected_bug_while_drawing_is_one_line_not_a_traceback(server, connect, monkeypatch):
    import viz

    client = connect()

    def broken_figure(*args, **kwargs):
        raise KeyError("a bug in a figure builder")

    monkeypatch.setattr(viz, "tree_figure", broken_figure)
    status = status_or_error(client, prompt="hello", **TINY)
    assert status.startswith("✗") and "something went wrong on the server (KeyError" in status
    monkeypatch.undo()
    assert "Step 1" in status_or_error(client, prompt="hello", **TINY)


def greedy_text(tiny_pair, prompt, method, max_new_tokens, **options) -> str:
    run = make_decoder(tiny_pair, DecoderOptions(method=method, **options)).generate(
        tiny_pair.encode_prompt(prompt), max_new_tokens)
    return "".join(shown_piece(t) for t in tiny_pair.token_strings(run.new_token_ids))  # as the text panel shows it


def spans_text(outputs) -> str:
    value = outputs[OUT["text"]]
    if isinstance(value, dict) and value.get("__type__") == "update":
        value = value.get("value")
    return "".join(span["token"] for span in value or [])


def stop_soon(client, job, deadline_s=60):
    deadline = time.monotonic() + deadline_s
    while not job.outputs() and time.monotonic() < deadline:
        time.sleep(0.02)
    client.predict(api_name="/stop")
    return job.result()


def test_stop_mid_run_leaves_a_session_that_continues_to_the_uninterrupted_text(connect, tiny_pair):
    settings = dict(pair="tiny-random", method="sd", gamma=2, max_new_tokens=200)
    expected = greedy_text(tiny_pair, "stop and go", "sd", 200, gamma=2)
    client = connect()
    stopped = stop_soon(client, client.submit(prompt="stop and go", **settings, api_name="/run"))
    assert "Stopped" in stopped[OUT["status"]], stopped[OUT["status"]]
    partial = spans_text(stopped)
    assert partial and expected.startswith(partial) and len(partial) < len(expected)
    assert "Step" in status_or_error(client, prompt="stop and go", **settings)  # a Step continues it too
    final = client.predict(prompt="stop and go", **settings, api_name="/run")
    assert "Done" in final[OUT["status"]]
    assert spans_text(final) == expected
    # stopped then reset: a clean slate
    stop_soon(client, client.submit(prompt="stop and go", **settings, api_name="/run"))
    assert "Reset" in status_or_error(client, "/reset")
    assert "Step 0" in status_or_error(client, prompt="stop and go", **settings)


def test_heap_trimmer_starts_once_per_process():
    import threading

    from dynasd.explorer.sessions.memory import start_heap_trimmer

    assert start_heap_trimmer(3600) and start_heap_trimmer(3600)  # glibc on every machine this runs on
    assert sum(t.name == "heap-trimmer" for t in threading.enumerate()) == 1
