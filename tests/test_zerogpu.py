"""ZeroGPU: on a ZeroGPU Space a model may run only inside a `spaces.GPU` call, so every handler that runs a model
must be wrapped, and nothing may touch CUDA while the app is imported.

A fake `spaces` module (put into sys.modules before app.py and the ui package are imported) records what it wraps
and whether a call is inside a wrapped handler; forward hooks on every model of the served pair then show which API
endpoints ran a model. The property is measured both ways: no model forward outside a wrapped handler, no wrapped
handler that runs no model.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from dynasd.explorer.engine import Advance, StartRun
from dynasd.explorer.inputs import Settings
from dynasd.loading.models import tiny_random_pair

REPO = Path(__file__).resolve().parent.parent
OUT_STATUS, OUT_TREE = 7, 1


class FakeSpaces(types.ModuleType):
    """`spaces.GPU(duration=...)` as the real package offers it, recording the handlers it wraps and their
    durations, and counting how deep the current call is inside wrapped handlers."""

    def __init__(self):
        super().__init__("spaces")
        self.wrapped: dict[str, object] = {}
        self.inside = 0

    def GPU(self, task=None, *, duration=None):  # noqa: N802 (the real package's name)
        def decorate(handler):
            self.wrapped[handler.__name__] = duration
            if inspect.isgeneratorfunction(handler):
                @functools.wraps(handler)
                def generator(*args, **kwargs):
                    steps = handler(*args, **kwargs)
                    while True:
                        self.inside += 1
                        try:
                            value = next(steps)
                        except StopIteration:
                            return
                        finally:
                            self.inside -= 1
                        yield value
                return generator

            @functools.wraps(handler)
            def call(*args, **kwargs):
                self.inside += 1
                try:
                    return handler(*args, **kwargs)
                finally:
                    self.inside -= 1
            return call

        return decorate(task) if task is not None else decorate


def app_modules() -> list[str]:
    """app.py and the ui package's modules, as imported in this process."""
    return [name for name in sys.modules if name in ("app", "ui") or name.startswith("ui.")]


@pytest.fixture
def zero_gpu_app(monkeypatch):
    """app.py and the ui package imported afresh with the fake `spaces` (ui/gpu.py looks it up on import; the
    handlers are wrapped as ui/play.py and ui/learn.py are imported): the fresh app, ui.gpu and ui.state, and the
    fake. The original modules come back afterwards."""
    fake = FakeSpaces()
    monkeypatch.setitem(sys.modules, "spaces", fake)
    originals = {name: sys.modules.pop(name) for name in app_modules()}
    try:
        app = importlib.import_module("app")
        fresh = SimpleNamespace(app=app, gpu=sys.modules["ui.gpu"], state=sys.modules["ui.state"])
        assert fresh.gpu.spaces is fake, "the fake reached ui/gpu.py"
        yield fresh, fake
    finally:
        for name in app_modules():
            sys.modules.pop(name, None)
        sys.modules.update(originals)


class WatchedLoader:
    """Loads tiny-random and puts a hook on every model's embedding (the first module of each forward, stock or
    lean) that notes the endpoint being called and whether the call is inside a wrapped handler."""

    def __init__(self, fake: FakeSpaces):
        self.fake, self.endpoint, self.forwards = fake, None, []

    def __call__(self, name=None, target=None, draft=None, device=None, dtype=None):
        from dynasd.kernels import accelerate

        pair = accelerate(tiny_random_pair(device="cpu"))
        for model in (pair.target, pair.draft, pair.feature_draft):
            model.model.embed_tokens.register_forward_pre_hook(self.hook)
        return pair

    def hook(self, module, inputs):
        self.forwards.append((self.endpoint, self.fake.inside > 0))


def test_every_model_running_handler_and_no_other_goes_through_spaces_gpu(zero_gpu_app, tmp_path, monkeypatch):
    """On a ZeroGPU Space (elsewhere a session's requests go to the model thread with no spaces.GPU around them)."""
    from conftest import free_port
    from gradio_client import Client, handle_file

    from dynasd.explorer.pairs import PairCache

    fresh, fake = zero_gpu_app
    loader = WatchedLoader(fake)
    fresh.state.PAIRS = PairCache(loader=loader, device="cpu")
    monkeypatch.setenv("SPACES_ZERO_GPU", "1")
    port = free_port()
    demo = fresh.app.serve(fresh.app.build_app("tiny-random"), "127.0.0.1", port, block=False)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        tiny = dict(pair="tiny-random", method="mcsd", max_new_tokens=40)  # more than one GPU call of a Step computes
        calls = {"/step": lambda: client.predict(prompt="hello", **tiny, api_name="/step"),
                 "/show_step": lambda: client.predict(0, api_name="/show_step"),
                 "/save_trace": lambda: client.predict(api_name="/save_trace"),
                 "/run": lambda: client.predict(prompt="hello", **tiny, api_name="/run"),
                 "/learn_step": lambda: client.predict(0, api_name="/learn_step"),
                 "/cost_model": lambda: client.predict(0, True, **tiny, api_name="/cost_model"),
                 "/side_by_side": lambda: client.predict(0, "sd", "mcsd", **tiny, api_name="/side_by_side"),
                 "/share_link": lambda: client.predict("hello", 0, **tiny, api_name="/share_link"),
                 "/follow_up": lambda: client.predict("and then?", api_name="/follow_up"),  # after the Run
                 "/goto_step": lambda: client.predict("hello", 1, **tiny, api_name="/goto_step"),
                 "/losslessness": lambda: client.predict("hello", "sd", 50, **dict(tiny, temperature=1.0),
                                                         api_name="/losslessness"),
                 "/reset": lambda: client.predict(api_name="/reset"),
                 "/stop": lambda: client.predict(api_name="/stop"),
                 "/compare": lambda: client.predict(prompt="hello", pair="tiny-random", max_new_tokens=6,
                                                    api_name="/compare")}
        results = {}
        for endpoint, call in calls.items():
            loader.endpoint = endpoint
            results[endpoint] = call()
        loader.endpoint = "/load_trace"
        trace_path = results["/save_trace"][0]
        results["/load_trace"] = Client(f"http://127.0.0.1:{port}/", verbose=False).predict(
            handle_file(trace_path), api_name="/load_trace")
    finally:
        demo.close()

    assert results["/step"][OUT_STATUS].startswith("✓ Step 0"), results["/step"][OUT_STATUS]
    assert json.loads(results["/step"][OUT_TREE])["layout"]["title"]["text"].startswith("Step 0")
    assert "Loaded" in results["/load_trace"][OUT_STATUS], "a trace replays with no model, outside spaces.GPU"
    outside = sorted({endpoint for endpoint, inside in loader.forwards if not inside})
    assert not outside, f"models ran outside spaces.GPU in {outside}"
    ran_models = {endpoint.strip("/") for endpoint, _ in loader.forwards}
    model_endpoints = {"step", "run", "compare", "follow_up", "cost_model", "side_by_side", "losslessness",
                       "goto_step"}
    assert ran_models == model_endpoints, "each of these endpoints runs a model, the others none"
    # The model calls are functions of data (ui/gpu.py), not handlers: a handler keeps its session's state in
    # the serving process, which a GPU process's changes would never reach.
    calls = {"gpu_serve", "gpu_compare_round", "gpu_compare_peer", "gpu_start_measuring", "gpu_measure_part",
             "gpu_side_by_side", "gpu_target_p", "gpu_first_token_draws"}
    assert set(fake.wrapped) == calls, "only the model calls are wrapped"


def test_the_gpu_durations_follow_the_work_asked_for_and_each_fits_a_visitors_quota(zero_gpu_app):
    """A call asks ZeroGPU for the time its work should take: a session's measured time when it has one (with a
    margin), else by the tokens it may produce. No call asks for more than GPU_MAX_S, at most 60 s: ZeroGPU refuses
    outright a request over what a visitor has left of the day (2 minutes when not logged in), so work that would
    take longer is split into calls that each fit instead of one request that is refused or cut off."""
    fresh, fake = zero_gpu_app
    gpu = fresh.gpu
    assert gpu.GPU_MAX_S <= 60
    wrapped = fake.wrapped
    serve = wrapped["gpu_serve"]

    def start(settings, prompt, steps):
        return serve(StartRun(settings, prompt, steps))

    def advance(settings, snapshot, steps, expected_s=0.0):
        return serve(Advance(settings, snapshot, steps, expected_s))

    longest = Settings(pair="tiny-random", max_new_tokens=gpu.MAX_NEW_TOKENS_LIMIT)
    one, chunk, whole = (advance(longest, None, steps=n) for n in (1, gpu.GPU_STEP_CHUNK, gpu.UNTIL_DONE))
    assert one <= chunk < whole <= gpu.GPU_MAX_S
    assert start(longest, "hi", steps=0) == gpu.GPU_BASE_S, "a prefill alone asks for the base"
    measured = advance(longest, None, steps=gpu.UNTIL_DONE, expected_s=3.0)
    assert measured == gpu.GPU_BASE_S + 6, "a measured expectation, with a margin of 2x"
    # every call at its largest still asks for what its work needs, under the cap (not clamped to it)
    ids = list(range(100))
    largest = {"gpu_compare_round": (longest, None), "gpu_compare_peer": (longest, "hi"),
               "gpu_start_measuring": (longest, ids), "gpu_measure_part": (longest, None),
               "gpu_side_by_side": (longest, ("sd", "mcsd"), ids, "hi"), "gpu_target_p": (longest, "hi"),
               "gpu_first_token_draws": (longest, "hi", "sd", 0, gpu.SAMPLES_PER_CALL)}
    for name, args in largest.items():
        asked = wrapped[name](*args)
        assert 0 < asked < gpu.GPU_MAX_S, (name, asked)
    # a Run's call computes the steps that fit: all of them without a measurement, fewer after a slow one
    assert gpu.fit_steps(longest, gpu.UNTIL_DONE, 0.0)[0] >= gpu.MAX_NEW_TOKENS_LIMIT
    steps, expected_s = gpu.fit_steps(longest, gpu.UNTIL_DONE, expected_s=500.0)
    assert 1 <= steps < gpu.MAX_NEW_TOKENS_LIMIT and gpu.GPU_BASE_S + 2 * expected_s <= gpu.GPU_MAX_S
    assert gpu.fit_steps(longest, 4, expected_s=2.0) == (4, 2.0), "work that fits is left as it is"
    assert not gpu.on_zero_gpu({}) and gpu.on_zero_gpu({"SPACES_ZERO_GPU": "true"})


def test_the_losslessness_check_split_into_gpu_calls_draws_what_one_call_draws(zero_gpu_app, monkeypatch):
    """Its samples are drawn in calls of at most SAMPLES_PER_CALL, with the seeds one call would use: the same
    counts, the same p-values."""
    from dynasd.explorer.lessons import losslessness
    from dynasd.explorer.pairs import PairCache

    fresh, fake = zero_gpu_app
    monkeypatch.setattr(fresh.state, "PAIRS", PairCache(device="cpu"))
    monkeypatch.setattr(fresh.gpu, "SAMPLES_PER_CALL", 7)
    settings = Settings(pair="tiny-random", temperature=1.0, seed=3)
    split = fresh.gpu.check_losslessness(settings, "hello", ["sd", "ti-mcsd"], 20)
    whole = losslessness.check_first_tokens(fresh.state.PAIRS, settings, "hello", ["sd", "ti-mcsd"], 20)
    assert split.samples == whole.samples == 20 and split.lossless == whole.lossless
    assert {m: (c.observed, c.p_value) for m, c in split.checks.items()} == {
        m: (c.observed, c.p_value) for m, c in whole.checks.items()}
    assert split.labels == whole.labels


@pytest.mark.slow(seconds=8)
def test_importing_the_app_touches_no_cuda():
    """In a fresh interpreter (an import earlier in this process would hide it): CUDA's lazy initialisation
    must not run while app.py, ui and dynasd are imported and the UI is built."""
    probe = ("import torch, torch.cuda\n"
             "calls = []\n"
             "torch.cuda._lazy_init = lambda *a, **k: calls.append('lazy_init')\n"
             "import app\n"
             "app.build_app('tiny-random')\n"
             "print(calls, torch.cuda.is_initialized())\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "GRADIO_ANALYTICS_ENABLED": "False",
                               "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO),
                               # the thread count a test worker gives its children (tests/conftest.py says why)
                               **({"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]}
                                  if "OMP_NUM_THREADS" in os.environ else {})})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[] False"


def test_on_zero_gpu_the_start_up_pair_is_placed_on_cuda_before_serving(zero_gpu_app, monkeypatch):
    """ZeroGPU's pattern: the models go to "cuda" at start-up, outside the handlers, and the load finishes before
    the server starts (the GPU process is forked from this one); elsewhere it loads in the background."""
    import threading

    fresh, _ = zero_gpu_app
    app, state = fresh.app, fresh.state
    events = []
    monkeypatch.setattr(app, "_preload", lambda settings: events.append(
        ("preload", settings.pair, state.PAIRS.device, threading.current_thread() is threading.main_thread())))
    monkeypatch.setattr(app, "serve", lambda *args, **kwargs: events.append(("serve",)))
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    app.main(["--pair", "tiny-random"])
    assert events == [("preload", "tiny-random", "cuda", True), ("serve",)]
    events.clear()
    monkeypatch.delenv("SPACES_ZERO_GPU")
    app.main(["--pair", "tiny-random"])
    deadline = time.monotonic() + 10
    while len(events) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state.PAIRS.device == "auto"
    assert sorted(events) == [("preload", "tiny-random", "auto", False), ("serve",)], "in a background thread"


def test_zerogpus_own_failures_become_one_line_with_a_way_on(zero_gpu_app, monkeypatch):
    """A spent quota or an aborted GPU task (raised by the spaces package, not by our code) reaches the page as
    one status line that says what happened and what still works; the steps on show stay."""
    import gradio as gr

    from dynasd.explorer.pairs import PairCache

    fresh, _ = zero_gpu_app
    play = sys.modules["ui.play"]
    monkeypatch.setattr(fresh.state, "PAIRS", PairCache(device="cpu"))
    session = fresh.state.SESSIONS.get(None)
    tiny = dict(pair="tiny-random", method="sd", max_new_tokens=12)
    assert play.on_step(session.id, "hello", **tiny)[OUT_STATUS].startswith("✓ Step 0")
    monkeypatch.setenv("SPACES_ZERO_GPU", "1")  # ZeroGPU's failures are told as such on ZeroGPU only
    for message in ("You have exceeded your GPU quota (60s requested vs. 13s left). Try again in 0:04:00",
                    "GPU task aborted"):
        def refuse(*args, message=message, **kwargs):
            raise gr.Error(message)

        monkeypatch.setattr(fresh.gpu, "gpu_serve", refuse)
        with pytest.warns(UserWarning):  # gradio's toast, outside a request
            said = play.on_step(session.id, "hello", **tiny)[OUT_STATUS]
        assert said.startswith("⚠ no GPU for this call") and message.splitlines()[0][:60] in said, said
        assert "example trace" in said and "\n" not in said
        assert len(session.run.steps) == 1 and session.error is None, "the step on show stays, the session is whole"
