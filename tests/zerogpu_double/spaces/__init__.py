"""A stand-in for Hugging Face's `spaces` package that behaves as ZeroGPU does where it matters to an app.

On a ZeroGPU Space every call of a `@spaces.GPU` function runs in a child process forked from the app's process.
The arguments reach the child by the fork, or pickled when an earlier child is reused; the return value (or each
value a generator yields) comes back pickled; nothing the call changes in Python objects reaches the app's
process; and CUDA must never be initialised in the app's process. This double does exactly that, strictly:
- every call runs in a forked child; arguments always travel pickled (so what a reused child would need, every
  call needs), and so do results;
- a call reuses an idle child of the same function with probability ZEROGPU_DOUBLE_REUSE (default 0.5, seeded
  by ZEROGPU_DOUBLE_SEED), otherwise it forks a fresh one: an app that relied on memory left in a child, or on a
  child's memory being fresh, fails some of the time. As in the package, each decorated function has children of
  its own: what one function's call leaves in memory never reaches another function's call;
- torch.cuda's lazy initialisation raises in the app's process, and so does a model's forward there (a pair served
  with `--device cpu` stands for one on "cuda", which only a GPU call may run): each language model's forward
  starts at its token embedding, and an embedding's forward outside a GPU call raises ModelInMainProcess;
- `duration` must give a positive number of seconds, at most ZEROGPU_DOUBLE_MAX_S (default 60: what a visitor
  who is not logged in may ask for in one call, with half the day's quota left);
- each call appends one JSON line to ZEROGPU_DOUBLE_LOG (when set): the function, the bytes of its arguments and
  of its results, whether a child was reused, the duration asked for; the tests count GPU calls with it;
- `fail_next(message)` makes the next call fail as ZeroGPU fails (quota spent, task aborted), for the tests of
  what the page then says.

Put its folder first on PYTHONPATH (with SPACES_ZERO_GPU=1) and `import spaces` finds it.

What the real package can check on a CPU-only machine is checked with it (tests/spaces_emulation.py: its CUDA
emulation with the pair on "cuda", its own fork-and-pickle workers, its handling of errors); this double stays for
what that cannot do without a GPU: serving the whole app as a process, with every GPU call's child running the
model for real (on the CPU, `--device cpu`), and counting the calls and the bytes that cross.
"""
from __future__ import annotations

import functools
import inspect
import json
import multiprocessing
import os
import pickle
import random
import threading
import traceback

__all__ = ["GPU", "fail_next", "calls"]

_FORK = multiprocessing.get_context("fork")
_FUNCTIONS: dict[str, object] = {}       # every decorated function, by name: a child forked later knows them all
_IDLE: dict[str, list["_Child"]] = {}    # by function: its children that finished a call and may be reused
_GUARD = threading.Lock()
_RANDOM = random.Random(int(os.environ.get("ZEROGPU_DOUBLE_SEED", "0")))
_FAILURES: list[str] = []
calls = 0                                # calls made in this process


class CudaInMainProcess(RuntimeError):
    """CUDA was about to be initialised in the app's process, which ZeroGPU forbids."""


class ModelInMainProcess(RuntimeError):
    """A model ran in the app's process: on ZeroGPU its pair is on "cuda", which only a GPU call may use."""


def fail_next(message: str) -> None:
    """The next GPU call raises as ZeroGPU raises (e.g. "You have exceeded your GPU quota ..." or "GPU task
    aborted"), before anything runs."""
    _FAILURES.append(message)


def GPU(task=None, *, duration=None):  # noqa: N802 (the real package's name)
    """`spaces.GPU`, `spaces.GPU(duration=seconds or callable)`: runs each call in a forked child."""
    def decorate(function):
        name = f"{function.__module__}.{function.__qualname__}"
        _FUNCTIONS[name] = function
        generator = inspect.isgeneratorfunction(function)

        @functools.wraps(function)
        def call(*args, **kwargs):
            seconds = _duration(duration, args, kwargs)
            child, reused = _take_child(name)
            request = pickle.dumps((name, args, kwargs))
            received, answered = 0, False
            try:
                child.send(request)
                while True:
                    kind, payload = child.receive()
                    received += len(payload)
                    if kind == "yield":
                        yield pickle.loads(payload)
                        continue
                    answered = True
                    if kind == "return":
                        return pickle.loads(payload)
                    raise pickle.loads(payload)  # "error": the child's exception, re-raised as ZeroGPU does
            finally:
                _log(name, len(request), received, reused, seconds)
                if answered:
                    _give_back(name, child)
                else:  # left mid-stream (the reader stopped, or no answer): the child cannot be reused
                    child.end()

        if generator:
            return functools.wraps(function)(lambda *a, **k: (yield from call(*a, **k)))

        @functools.wraps(function)
        def plain(*args, **kwargs):
            steps = call(*args, **kwargs)
            try:
                while True:
                    next(steps)
            except StopIteration as end:
                return end.value
        return plain

    return decorate(task) if callable(task) else decorate


def _duration(duration, args, kwargs) -> float:
    seconds = duration(*args, **kwargs) if callable(duration) else (60 if duration is None else duration)
    limit = float(os.environ.get("ZEROGPU_DOUBLE_MAX_S", "60"))
    if not (isinstance(seconds, (int, float)) and 0 < seconds <= limit):
        raise ValueError(f"spaces.GPU duration must be in (0, {limit:g}] seconds, got {seconds!r}")
    return float(seconds)


def _log(name: str, sent: int, received: int, reused: bool, seconds: float) -> None:
    global calls
    calls += 1
    path = os.environ.get("ZEROGPU_DOUBLE_LOG")
    if path:
        line = {"function": name.rsplit(".", 1)[-1], "args_bytes": sent, "result_bytes": received,
                "reused": reused, "duration_s": seconds}
        with open(path, "a") as log:
            log.write(json.dumps(line) + "\n")


class _Child:
    """One forked child that runs calls sent to it, one at a time, until it is told to end."""

    def __init__(self) -> None:
        self.requests, child_end = _FORK.Pipe()
        self.process = _FORK.Process(target=_serve, args=(child_end,), daemon=True)
        self.process.start()
        child_end.close()

    def send(self, request: bytes) -> None:
        self.requests.send_bytes(request)

    def receive(self) -> tuple[str, bytes]:
        if not self.requests.poll(float(os.environ.get("ZEROGPU_DOUBLE_TIMEOUT_S", "600"))):
            raise RuntimeError("GPU task aborted (the GPU process did not answer in time)")
        kind, payload = pickle.loads(self.requests.recv_bytes())
        return kind, payload

    def end(self) -> None:
        try:
            self.requests.close()
        finally:
            self.process.kill()
            self.process.join(5)


def _take_child(name: str) -> tuple[_Child, bool]:
    if _FAILURES:
        raise _zero_gpu_error(_FAILURES.pop(0))
    with _GUARD:
        idle = _IDLE.setdefault(name, [])
        if idle and _RANDOM.random() < float(os.environ.get("ZEROGPU_DOUBLE_REUSE", "0.5")):
            child = idle.pop()
            if child.process.is_alive():
                return child, True
            child.end()
    return _Child(), False


def _give_back(name: str, child: _Child) -> None:
    with _GUARD:
        idle = _IDLE.setdefault(name, [])
        if child.process.is_alive() and not idle:  # one idle child per function, as the package keeps one
            idle.append(child)
            return
    child.end()


def _zero_gpu_error(message: str) -> Exception:
    try:  # the real package raises gradio's Error, which a Gradio app shows as it is
        import gradio as gr
        return gr.Error(message)
    except ImportError:
        return RuntimeError(message)


def _serve(requests) -> None:
    """The child: calls arrive pickled; every yielded or returned value, or the exception, goes back pickled.

    It ends when the app's process is gone: the app's end of the pipe cannot tell it (every child forked later
    holds a copy of that end, so no end of file comes), so it looks at its parent between calls."""
    global _IN_GPU_PROCESS
    _IN_GPU_PROCESS = True
    _allow_cuda()
    parent = os.getppid()
    while True:
        while not requests.poll(1.0):
            if os.getppid() != parent:
                return
        try:
            request = requests.recv_bytes()
        except EOFError:
            return
        name, args, kwargs = pickle.loads(request)
        function = _FUNCTIONS[name]
        try:
            if inspect.isgeneratorfunction(function):
                for value in function(*args, **kwargs):
                    requests.send_bytes(pickle.dumps(("yield", pickle.dumps(value))))
                requests.send_bytes(pickle.dumps(("return", pickle.dumps(None))))
            else:
                requests.send_bytes(pickle.dumps(("return", pickle.dumps(function(*args, **kwargs)))))
        except Exception as exc:
            try:
                payload = pickle.dumps(exc)
            except Exception:
                payload = pickle.dumps(RuntimeError("".join(traceback.format_exception_only(type(exc), exc))))
            requests.send_bytes(pickle.dumps(("error", payload)))


# -- CUDA belongs to the GPU process only ---------------------------------------------------------------------
_ORIGINAL_LAZY_INIT = None


def _forbid_cuda() -> None:
    global _ORIGINAL_LAZY_INIT
    try:
        import torch.cuda
    except ImportError:
        return
    if torch.cuda.is_initialized():
        raise CudaInMainProcess("CUDA was initialised in the app's process before spaces was imported")
    _ORIGINAL_LAZY_INIT = torch.cuda._lazy_init

    def refuse():
        raise CudaInMainProcess("CUDA initialised in the app's process: on ZeroGPU only a spaces.GPU call may")

    torch.cuda._lazy_init = refuse


def _allow_cuda() -> None:
    if _ORIGINAL_LAZY_INIT is not None:
        import torch.cuda
        torch.cuda._lazy_init = _ORIGINAL_LAZY_INIT


_IN_GPU_PROCESS = False  # set in each forked child: only there may a model run


def _forbid_model_forwards() -> None:
    try:
        import torch
    except ImportError:
        return

    def refuse(module, inputs):
        if not _IN_GPU_PROCESS and isinstance(module, torch.nn.Embedding):
            raise ModelInMainProcess("a model ran in the app's process: on ZeroGPU only a spaces.GPU call may")

    torch.nn.modules.module.register_module_forward_pre_hook(refuse)


_forbid_cuda()
_forbid_model_forwards()
