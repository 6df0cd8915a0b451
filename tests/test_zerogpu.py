"""ZeroGPU, the parts that need no GPU process: what each GPU call asks ZeroGPU for, work split into calls that
each fit, nothing touching CUDA while the app is imported, the start-up pair placed on "cuda" before serving, and
ZeroGPU's own failures said as one line. The app as a Space runs it, every model call in a forked child, is
tests/test_zerogpu_space.py (tests/zerogpu_double); the real `spaces` package's CUDA emulation is
tests/test_spaces_emulation.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dynasd.explorer.engine import Advance, StartRun
from dynasd.explorer.inputs import Settings

REPO = Path(__file__).resolve().parent.parent
OUT_STATUS, OUT_TREE = 7, 1


def test_the_gpu_durations_follow_the_work_asked_for_and_each_fits_a_visitors_quota():
    """A call asks ZeroGPU for the time its work should take: a session's measured time when it has one (with a
    margin), else by the tokens it may produce. No call asks for more than GPU_MAX_S, at most 60 s: ZeroGPU refuses
    outright a request over what a visitor has left of the day (2 minutes when not logged in), so work that would
    take longer is split into calls that each fit instead of one request that is refused or cut off."""
    from ui import gpu

    assert gpu.GPU_MAX_S <= 60
    # The model calls are functions of data, not handlers: a handler keeps its session's state in the serving
    # process, which a GPU process's changes would never reach (tests/test_zerogpu_space.py: each runs its model
    # in GPU calls, and no other endpoint makes one).
    wrapped = gpu.GPU_CALLS
    assert set(wrapped) == {"gpu_serve", "gpu_compare_round", "gpu_compare_peer", "gpu_start_measuring",
                            "gpu_measure_part", "gpu_side_by_side", "gpu_target_p", "gpu_first_token_draws"}
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


def test_the_losslessness_check_split_into_gpu_calls_draws_what_one_call_draws(monkeypatch):
    """Its samples are drawn in calls of at most SAMPLES_PER_CALL, with the seeds one call would use: the same
    counts, the same p-values."""
    from dynasd.explorer.lessons import losslessness
    from dynasd.explorer.pairs import PairCache
    from ui import gpu, state

    monkeypatch.setattr(state, "PAIRS", PairCache(device="cpu"))
    monkeypatch.setattr(gpu, "SAMPLES_PER_CALL", 7)
    settings = Settings(pair="tiny-random", temperature=1.0, seed=3)
    split = gpu.check_losslessness(settings, "hello", ["sd", "ti-mcsd"], 20)
    whole = losslessness.check_first_tokens(state.PAIRS, settings, "hello", ["sd", "ti-mcsd"], 20)
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


def test_on_zero_gpu_the_start_up_pair_is_placed_on_cuda_before_serving(monkeypatch):
    """ZeroGPU's pattern: the models go to "cuda" at start-up, outside the handlers, and the load finishes before
    the server starts (the GPU process is forked from this one); elsewhere it loads in the background."""
    import threading

    import app
    from dynasd.explorer.pairs import PairCache
    from ui import state

    monkeypatch.setattr(state, "PAIRS", PairCache())
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


def test_zerogpus_own_failures_become_one_line_with_a_way_on(monkeypatch):
    """A spent quota or an aborted GPU task (raised by the spaces package, not by our code) reaches the page as
    one status line that says what happened and what still works; the steps on show stay."""
    import gradio as gr

    from dynasd.explorer.pairs import PairCache
    from ui import gpu, play, state

    monkeypatch.setattr(state, "PAIRS", PairCache(device="cpu"))
    session = state.SESSIONS.get(None)
    tiny = dict(pair="tiny-random", method="sd", max_new_tokens=12)
    assert play.on_step(session.id, "hello", **tiny)[OUT_STATUS].startswith("✓ Step 0")
    monkeypatch.setenv("SPACES_ZERO_GPU", "1")  # ZeroGPU's failures are told as such on ZeroGPU only
    # the pair is loaded (the Step above); placing it again would enter the real package's CUDA emulation, which
    # needs a CUDA build of torch here (tests/spaces_emulation.py runs it where it can)
    monkeypatch.setattr(gpu, "load_in_serving_process", lambda settings: None)
    for message in ("You have exceeded your GPU quota (60s requested vs. 13s left). Try again in 0:04:00",
                    "GPU task aborted"):
        def refuse(*args, message=message, **kwargs):
            raise gr.Error(message)

        monkeypatch.setattr(gpu, "gpu_serve", refuse)
        with pytest.warns(UserWarning):  # gradio's toast, outside a request
            said = play.on_step(session.id, "hello", **tiny)[OUT_STATUS]
        assert said.startswith("⚠ no GPU for this call") and message.splitlines()[0][:60] in said, said
        assert "example trace" in said and "\n" not in said
        assert len(session.run.steps) == 1 and session.error is None, "the step on show stays, the session is whole"
