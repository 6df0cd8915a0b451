"""Every model call of the page, and where it runs: in a `spaces.GPU` call on a ZeroGPU Space, in place elsewhere.

On ZeroGPU each call runs in a forked child process: its arguments arrive by the fork (or pickled, when a child
is reused), only its return value comes back (pickled), and nothing it changes in memory reaches this process.
So each function here is a function of data: settings, a prompt, a decoder's snapshot, a run's token ids in;
Progress records, RunTraces and check results out (dynasd/explorer/engine.py). The handlers (play.py, learn.py)
run in this process, keep every session's state here and call these; none of them runs a model itself.

GPU time is asked for by what the call will do: a session's own measured seconds per step when it has them
(Session._expected), else by the number of tokens. A Step on ZeroGPU computes GPU_STEP_CHUNK steps in one call
and shows the rest without a GPU; a Run computes the whole run in one call and the page plays it back.
ZeroGPU's own failures (quota spent, task aborted, no GPU free) become one line with a way on.
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator

from dynasd.explorer import cost as cost_model
from dynasd.explorer import engine, losslessness, side_by_side
from dynasd.explorer.engine import UNTIL_DONE, Progress
from dynasd.explorer.inputs import MAX_NEW_TOKENS_LIMIT, Settings, UserError, one_line
from dynasd.explorer.peer import run_peer
from dynasd.explorer.session import Compute, SessionFailed, compare_methods
from dynasd.options import METHODS

from . import state

try:  # a Hugging Face ZeroGPU Space: every model call must run inside spaces.GPU (elsewhere it changes nothing)
    import spaces
except ImportError:
    spaces = None

# The GPU time asked for when a session has no measurement yet: a shorter request is scheduled sooner, one that
# runs out is cut off. 0.1 s a token is several times a token's cost on a GPU for the embedded pair; the base
# covers a GPU process's start and loading a pair there (one not loaded at start-up). With a measurement, the
# request is the base plus twice the measured time.
GPU_BASE_S, GPU_S_PER_TOKEN, GPU_MAX_S = 20, 0.1, 300
GPU_STEP_CHUNK = 8  # steps one Step computes per GPU call on ZeroGPU; the next Steps show them without a GPU


def on_zero_gpu(environ=os.environ) -> bool:
    """Whether this process is a ZeroGPU Space (the variable its runtime sets; `spaces` is then importable)."""
    return spaces is not None and environ.get("SPACES_ZERO_GPU", "") not in ("", "0", "false")


def _seconds(tokens: float, expected_s: float = 0.0) -> int:
    estimate = 2 * expected_s if expected_s > 0 else GPU_S_PER_TOKEN * max(1.0, tokens)
    return int(min(GPU_MAX_S, GPU_BASE_S + estimate))


def _tokens(settings, steps) -> float:
    limit = getattr(settings, "max_new_tokens", MAX_NEW_TOKENS_LIMIT)
    limit = limit if isinstance(limit, (int, float)) else MAX_NEW_TOKENS_LIMIT
    return min(limit, steps) if isinstance(steps, (int, float)) else limit


def _run_seconds(settings, *_, steps=0, expected_s=0.0, **__) -> int:
    return _seconds(_tokens(settings, steps), expected_s if isinstance(expected_s, (int, float)) else 0.0)


def _runs_seconds(runs: int) -> Callable[..., int]:
    return lambda settings, *_, **__: _seconds(runs * _tokens(settings, UNTIL_DONE))


def _samples_seconds(settings, prompt, methods, samples, **__) -> int:
    per_sample = 0.05  # a prefill and one step of each method on a GPU, with room to spare
    count = samples if isinstance(samples, (int, float)) else losslessness.MAX_SAMPLES
    return _seconds(0, per_sample * max(1, count) * max(1, len(methods)) / 2)


def on_gpu(duration: Callable[..., int]):
    """`spaces.GPU(duration=...)` where `spaces` is importable, nothing elsewhere."""
    if spaces is None:
        return lambda function: function
    return spaces.GPU(duration=duration)


# -- the model calls: functions of data --------------------------------------------------------------------------

@on_gpu(_run_seconds)
def gpu_start(settings: Settings, prompt: str, steps: int = 0, expected_s: float = 0.0) -> Progress:
    return engine.start_run(state.PAIRS, settings, prompt, steps)


@on_gpu(_run_seconds)
def gpu_advance(settings: Settings, snapshot, steps: int = 1, expected_s: float = 0.0) -> Progress:
    return engine.advance(state.PAIRS, settings, snapshot, steps)


@on_gpu(_run_seconds)
def gpu_follow_up(settings: Settings, snapshot, turns: list[str], steps: int = 0,
                  expected_s: float = 0.0) -> Progress:
    return engine.follow_up(state.PAIRS, settings, snapshot, turns, steps)


@on_gpu(_runs_seconds(len(METHODS) + 1))
def gpu_compare(settings: Settings, prompt: str) -> Iterator[tuple]:
    """("run", method, RunTrace) as each method finishes, ("ours done", None, None), then ("peer", PeerRun or
    None, why not); ("error", exception name, message) ends it early."""
    try:
        for method, run in compare_methods(state.PAIRS, settings, prompt):
            yield "run", method, run
        yield "ours done", None, None
        try:
            yield "peer", run_peer(state.PAIRS, settings, prompt), ""
        except UserError as exc:
            yield "peer", None, str(exc)
    except (UserError, SessionFailed) as exc:
        yield "error", type(exc).__name__, str(exc)
    except Exception as exc:
        yield "error", "SessionFailed", f"the model call failed ({one_line(exc)}); other sessions are not affected"


@on_gpu(_runs_seconds(1))
def gpu_calibrate(settings: Settings, context_ids: list[int], again: bool = False) -> cost_model.MeasuredCosts:
    return cost_model.calibrate_context(state.PAIRS, settings, context_ids, again)


@on_gpu(_runs_seconds(2))
def gpu_side_by_side(settings: Settings, methods: tuple[str, str], ids: list[int], prompt: str) -> dict:
    return side_by_side.side_by_side(state.PAIRS, settings, methods, ids, prompt)


@on_gpu(_samples_seconds)
def gpu_losslessness(settings: Settings, prompt: str, methods: list[str], samples: int):
    return losslessness.check_first_tokens(state.PAIRS, settings, prompt, methods, samples)


# -- calling them from the serving process -----------------------------------------------------------------------

@contextlib.contextmanager
def _from_serving_process(settings: Settings) -> Iterator[None]:
    """Around a model call made from the serving process. On ZeroGPU the settings' pair is loaded here first
    (ZeroGPU's pattern: the GPU process is forked from this one and finds it loaded), and ZeroGPU's own failures
    come back as one line that says what to do."""
    try:
        if on_zero_gpu():
            state.PAIRS.get(settings.normalised())
        yield
    except (UserError, SessionFailed):
        raise
    except Exception as exc:
        if spaces is None:
            raise
        raise UserError(no_gpu(exc)) from exc


def call(function: Callable, settings: Settings, *args, **kwargs):
    """`function(settings, *args, **kwargs)` from the serving process (_from_serving_process)."""
    with _from_serving_process(settings):
        return function(settings, *args, **kwargs)


def no_gpu(exc: BaseException) -> str:
    """ZeroGPU's failure as one line with a way on: the steps on show stay, and an example trace replays with no
    GPU at all."""
    text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    return (f"no GPU for this call ({text}); what is on show stays. Try again in a while, or replay an example "
            "trace (Learn → Share & examples), which needs no GPU")


def _through(function: Callable) -> Callable:
    return lambda settings, *args, **kwargs: call(function, settings, *args, **kwargs)


def compute() -> Compute:
    """Where a session's runs are computed: in place (one step per Step), or on ZeroGPU in chunks."""
    return Compute(start=_through(gpu_start), advance=_through(gpu_advance), follow_up=_through(gpu_follow_up),
                   chunk=GPU_STEP_CHUNK if on_zero_gpu() else 1)


def run_steps() -> int:
    """How many steps a Run computes per model call: all of them on ZeroGPU (one GPU call, played back by the
    page), one at a time elsewhere (the page draws each as it comes)."""
    return UNTIL_DONE if on_zero_gpu() else 1


def compare(settings: Settings, prompt: str) -> Iterator[tuple]:
    """gpu_compare's events, from the serving process (a generator: ZeroGPU may fail mid-stream)."""
    with _from_serving_process(settings):
        yield from gpu_compare(settings, prompt)
