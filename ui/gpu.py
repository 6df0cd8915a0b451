"""Every model call of the page, and where it runs: in a `spaces.GPU` call on a ZeroGPU Space, in place elsewhere.

On ZeroGPU each call runs in a forked child process: its arguments arrive by the fork (or pickled, when a child
is reused), only its return value comes back (pickled), and nothing it changes in memory reaches this process.
So each function here is a function of data: settings, a prompt, a decoder's snapshot, a run's token ids in;
Progress records, RunTraces and check results out (dynasd/explorer/engine.py). The handlers (play.py, learn.py)
run in this process, keep every session's state here and call these; none of them runs a model itself.

GPU time is asked for by what the call will do: a session's own measured seconds per step when it has them
(Session._expected), else by the number of tokens; never more than GPU_MAX_S, so work that would take longer is
split into calls that each fit. A Step on ZeroGPU computes GPU_STEP_CHUNK steps in one call and shows the rest
without a GPU; a Run computes as much of the run as fits in one call and the page plays it back (the next call
goes on from its snapshot); Compare runs each interleaved round (every method one chunk of steps) in a call of
its own, and each whole peer run in another; the losslessness check draws its samples in calls of at most
SAMPLES_PER_CALL.
ZeroGPU's own failures (quota spent, task aborted, no GPU free) become one line with a way on. Our own failures
inside a GPU call come back as data (dynasd/explorer/failures.py, or Progress.error): ZeroGPU passes only
gradio's errors through with their message, any other exception reaches the serving process as its class name.
On ZeroGPU the serving process runs under the `spaces` package's CUDA emulation, whose torch modes are entered on
the importing thread only: a pair loaded there from a handler thread is loaded on a thread that enters them.
"""
from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import replace
from typing import Any, Callable, Iterator

import gradio as gr

from dynasd.explorer import engine
from dynasd.explorer.costs import measuring
from dynasd.explorer.engine import UNTIL_DONE, Progress, Request
from dynasd.explorer.failures import Failed, SessionFailed, failures_as_data
from dynasd.explorer.inputs import MAX_NEW_TOKENS_LIMIT, Settings, UserError, first_line
from dynasd.explorer.lessons import losslessness, side_by_side
from dynasd.explorer.measure import compare as compare_model
from dynasd.explorer.measure.peer import run_peer
from dynasd.explorer.model_thread import on_the_model_thread
from dynasd.explorer.sessions.calls import ModelCalls, on_model_thread, read_kept_costs
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
# GPU_MAX_S: what one learner's action may ask for. ZeroGPU's daily quota is 2 minutes for a visitor who is not
# logged in and 3.5 minutes for a free account, and a request for more than is left is refused outright, so no call
# asks for more than half of the smaller quota; longer work is split into calls that each fit.
GPU_BASE_S, GPU_S_PER_TOKEN, GPU_MAX_S = 8, 0.1, 60
GPU_STEP_CHUNK = 8  # steps one Step computes per GPU call on ZeroGPU; the next Steps show them without a GPU
# The losslessness check's draws: a prefill and one step each, 0.05 s with room to spare on a GPU; 500 of them ask
# for 58 s, within GPU_MAX_S
GPU_S_PER_SAMPLE, SAMPLES_PER_CALL = 0.05, 500


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


def _request_seconds(request: Request) -> int:
    return _seconds(_tokens(request.settings, request.steps), request.expected_s)


def _run_whole_seconds(settings, *_, **__) -> int:
    return _seconds(_tokens(settings, UNTIL_DONE))


def _one_step_seconds(settings, *_, **__) -> int:
    return _seconds(2)  # a prefill and one step of each of two methods


def _round_seconds(settings, compared=None, *_, **__) -> int:
    methods = len(getattr(compared, "methods", ())) or len(METHODS)
    return _seconds(0, methods * compare_model.CHUNK_S)  # a chunk of about CHUNK_S per method, and a margin


def _samples_seconds(settings, prompt, method, seed, samples, **__) -> int:
    count = samples if isinstance(samples, (int, float)) else SAMPLES_PER_CALL
    return _seconds(0, GPU_S_PER_SAMPLE * max(1, count))


def fit_steps(settings, steps: int, expected_s: float) -> tuple[int, float]:
    """At most as many of `steps` as one call's GPU time allows, and their expected seconds: the rest of a Run is
    computed by the next call, from the snapshot this one returns. Without a measurement every step may be a token
    at GPU_S_PER_TOKEN; with one, the measured seconds scale with the steps."""
    fits_s = (GPU_MAX_S - GPU_BASE_S) / 2  # the request is the base plus twice the expected time
    tokens = _tokens(settings, steps)
    if isinstance(expected_s, (int, float)) and expected_s > fits_s and tokens > 1:
        fitted = max(1, int(tokens * fits_s / expected_s))
        return fitted, expected_s * fitted / tokens
    most = int((GPU_MAX_S - GPU_BASE_S) / GPU_S_PER_TOKEN)
    return (min(steps, most) if isinstance(steps, int) else steps), expected_s


# Every GPU call of the page by name, and the seconds it asks ZeroGPU for (its duration function): what runs in a
# spaces.GPU process is this list and nothing else (tests/test_zerogpu.py).
GPU_CALLS: dict[str, Callable[..., int]] = {}


def on_gpu(duration: Callable[..., int]):
    """`spaces.GPU(duration=...)` where `spaces` is importable, nothing elsewhere; listed in GPU_CALLS."""
    def decorate(function: Callable) -> Callable:
        GPU_CALLS[function.__name__] = duration
        return function if spaces is None else spaces.GPU(duration=duration)(function)
    return decorate


# -- the model calls: functions of data --------------------------------------------------------------------------

@on_gpu(_request_seconds)
def gpu_serve(request: Request) -> Progress:
    """A session's request (a StartRun, an Advance or a FollowUp: dynasd/explorer/engine.py) served in a ZeroGPU
    process, and this device's kept costs read there after its steps (sessions/calls.py). One GPU function for the
    three: ZeroGPU keeps a worker per decorated function, and the live decoder a call leaves (engine.LIVE) spares
    the next call a prefill only in the same worker."""
    return engine.serve(state.PAIRS, request, after_steps=read_kept_costs)


@on_gpu(_round_seconds)
@failures_as_data
def gpu_compare_round(settings: Settings, compared: compare_model.CompareState) -> compare_model.CompareState:
    """One round of an interleaved Compare (dynasd/explorer/measure/compare.py): every unfinished method one chunk of
    steps, from the Compare's state as data to its next state."""
    return compare_model.compare_round(state.PAIRS, compared)


@on_gpu(_run_whole_seconds)
@failures_as_data
def gpu_compare_peer(settings: Settings, prompt: str):
    """transformers' assisted generation for Compare (a PeerRun)."""
    return run_peer(state.PAIRS, settings, prompt)


@on_gpu(_one_step_seconds)
@failures_as_data
def gpu_start_measuring(settings: Settings, context_ids: list[int], again: bool = False,
                        bigger_targets: bool = False) -> measuring.Measuring:
    """What this device's costs need measured (dynasd/explorer/costs/measuring.py): nothing where kept costs
    stand, else calibration rounds and, for Where would it pay?, the bigger targets."""
    return measuring.start_measuring(state.PAIRS, settings, context_ids, again, bigger_targets)


@on_gpu(_run_whole_seconds)
@failures_as_data
def gpu_measure_part(settings: Settings, measured: measuring.Measuring) -> measuring.Measuring:
    """One part of a measurement (a calibration round, or one bigger target), from its state as data to the
    next: the page says how far it got between two parts, and Stop ends it there."""
    return measuring.measure_part(state.PAIRS, settings, measured)


@on_gpu(_one_step_seconds)
@failures_as_data
def gpu_side_by_side(settings: Settings, methods: tuple[str, str], ids: list[int], prompt: str) -> dict:
    return side_by_side.side_by_side(state.PAIRS, settings, methods, ids, prompt)


@on_gpu(_run_whole_seconds)
@failures_as_data
def gpu_target_p(settings: Settings, prompt: str):
    return losslessness.target_p(state.PAIRS, settings, prompt)


@on_gpu(_samples_seconds)
@failures_as_data
def gpu_first_token_draws(settings: Settings, prompt: str, method: str, seed: int, samples: int):
    return losslessness.first_token_draws(state.PAIRS, settings, prompt, method, seed, samples)


# -- calling them from the serving process -----------------------------------------------------------------------

def load_in_serving_process(settings: Settings) -> None:
    """On ZeroGPU, the settings' pair loaded (placed on "cuda") in the serving process: ZeroGPU's pattern, the GPU
    process is forked from this one and finds it loaded. The loading runs on a thread of its own that enters the
    emulation's torch modes (thread-local: entered by `import spaces` on the importing thread only; a handler's
    thread has none, and a pair placed on "cuda" there reaches the real CUDA initialisation, which refuses)."""
    if not on_zero_gpu():
        return
    enter_mode = None
    if getattr(spaces, "__path__", None) is not None:  # a package: a stand-in module has no emulation to enter
        try:
            from spaces.zero.torch import enter_mode
        except ImportError:  # a `spaces` without the emulation: no modes to enter
            pass
    failure: list[BaseException] = []

    def load() -> None:
        try:
            if enter_mode is not None:
                enter_mode()
            state.PAIRS.get(settings.normalised())
        except BaseException as exc:
            failure.append(exc)

    loader = threading.Thread(target=load, name="dynasd-load-pair", daemon=True)
    loader.start()
    loader.join()
    if failure:
        raise failure[0]


@contextlib.contextmanager
def _from_serving_process(settings: Settings) -> Iterator[None]:
    """Around a model call made from the serving process: the pair loaded first (load_in_serving_process), and
    ZeroGPU's own failures come back as one line that says what to do."""
    try:
        load_in_serving_process(settings)
        yield
    except (UserError, SessionFailed):
        raise
    except (gr.Error, RuntimeError) as exc:  # what the spaces package raises: gradio's errors, a lost queue
        if not on_zero_gpu():
            raise
        raise UserError(no_gpu(exc)) from exc


def call(function: Callable, settings: Settings, *args, **kwargs):
    """`function(settings, *args, **kwargs)` from the serving process (_from_serving_process), on the model thread
    where no ZeroGPU process runs it (dynasd/explorer/model_thread.py); a failure it returned as data is raised here."""
    with _from_serving_process(settings):
        # on ZeroGPU the call runs in a GPU process, started from this handler's thread (spaces reads its request)
        result = function(settings, *args, **kwargs) if on_zero_gpu() \
            else on_the_model_thread(function, settings, *args, **kwargs)
    if isinstance(result, Failed):
        raise result.exception()
    return result


# The failures a view that can do without a model call falls back from, saying why (`why_without`): UserError
# included; a bug still raises.
DONE_WITHOUT = (ValueError, SessionFailed)


def why_without(exc: BaseException) -> str:
    """A DONE_WITHOUT failure as the one line the view says beside its fallback."""
    return first_line(exc) or type(exc).__name__


def attempt(function: Callable, settings: Settings, *args, **kwargs) -> tuple[Any, str]:
    """(`call`'s result, "") or, where the call failed for a reason a learner is told, (None, that reason in one
    line): for a model call a view can do without (Compare's peer run), falling back and saying why."""
    try:
        return call(function, settings, *args, **kwargs), ""
    except DONE_WITHOUT as exc:
        return None, why_without(exc)


def no_gpu(exc: BaseException) -> str:
    """ZeroGPU's failure as one line with a way on: the steps on show stay, and an example trace replays with no
    GPU at all."""
    return (f"no GPU for this call ({first_line(exc) or type(exc).__name__}); what is on show stays. Try again in "
            "a while, or replay an example trace (Learn → Share & examples), which needs no GPU")


def page_calls() -> ModelCalls:
    """The page's form of a session's model calls (sessions/calls.py): on the model thread, one step a Step and a
    Run's call (the page draws each as it comes); on a ZeroGPU Space in a GPU process (`send_to_gpu`), where a
    Step computes GPU_STEP_CHUNK steps and a Run as many as fit in one call (the page plays them back)."""
    if on_zero_gpu():
        return ModelCalls(send_to_gpu, chunk=GPU_STEP_CHUNK, run_chunk=UNTIL_DONE, gpu=True)
    return on_model_thread(state.PAIRS)


def send_to_gpu(request: Request) -> Progress:
    """`request` served in a ZeroGPU process (gpu_serve), with no more steps than fit in one GPU call (fit_steps),
    ZeroGPU's own failures said as one line (_from_serving_process)."""
    steps, expected_s = fit_steps(request.settings, request.steps, request.expected_s)
    with _from_serving_process(request.settings):
        return gpu_serve(replace(request, steps=steps, expected_s=expected_s))


def say_pair_loads(settings: Settings) -> None:
    """A toast when the settings' pair loads first (tens of seconds on a CPU), sent at once in the event's own
    stream and so before its update, which a separate status event could not promise."""
    if settings.pair_key not in state.PAIRS.loaded():
        gr.Info(f"Loading the model pair {settings.pair_key[:80]} (first use: this can take a while on a CPU)…")


def compare(settings: Settings, prompt: str) -> Iterator[compare_model.CompareState]:
    """Compare's states as its interleaved rounds come (dynasd/explorer/measure/compare.py): one model call per
    round (on ZeroGPU, one GPU call each, which fits GPU_MAX_S whatever the run's length) and one per whole peer
    run, between the rounds. Raises UserError or SessionFailed."""
    compared = compare_model.new_compare(settings, prompt)
    yield from compare_model.interleaved(compared, lambda now: call(gpu_compare_round, settings, now),
                                         lambda: attempt(gpu_compare_peer, settings, prompt))


def check_losslessness(settings: Settings, prompt: str, methods: list[str], samples: int):
    """losslessness.check_first_tokens as GPU calls that each fit: the target's p, then each method's draws in
    calls of at most SAMPLES_PER_CALL (the same seeds as in one call), checked here (no model runs in the check)."""
    samples = losslessness.checked_request(settings, samples)
    settings = settings.normalised()
    probs = call(gpu_target_p, settings, prompt)
    draws: dict[str, list[int]] = {}
    lossless: dict[str, bool] = {}
    for method in methods:
        draws[method] = []
        for first in range(0, samples, SAMPLES_PER_CALL):
            count = min(SAMPLES_PER_CALL, samples - first)
            part, lossless[method] = call(gpu_first_token_draws, settings, prompt, method, settings.seed + first,
                                          count)
            draws[method] += part
    with _from_serving_process(settings):
        return losslessness.checks_of(state.PAIRS, settings, draws, lossless, probs)
