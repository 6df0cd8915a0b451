"""One thread runs every model call of the serving process (on a CPU; ZeroGPU runs them in its own processes).

Why: torch's CPU operators split their work with OpenMP, and GNU OpenMP keeps a team of helper threads for every
thread that starts parallel work. Its helpers wait for the next piece of work spinning, which hands it over in
~15 us, but only while the process's OpenMP threads number no more than the CPUs; past that they sleep at once and
every parallel operator pays a wake-up (~100 us). Gradio runs each event on whichever worker thread is free, so
model calls made there give several threads teams of their own, and every forward pays the wake-ups (the cost:
docs/benchmarks.md, "The explorer in a real browser"). Calls funnelled through one long-lived thread keep one team.

The handlers wait for their call here as before; calls from several sessions run one after another, as they already
did on the pair's lock. A call made from this thread (a model call that makes another) runs at once, in place.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

Result = TypeVar("Result")

_THREAD_NAME = "dynasd-model"
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=_THREAD_NAME)


def on_the_model_thread(function: Callable[..., Result], *args, **kwargs) -> Result:
    """`function(*args, **kwargs)` run on the model thread; its result returned, its exception raised, here."""
    if threading.current_thread().name.startswith(_THREAD_NAME):
        return function(*args, **kwargs)
    return _executor.submit(function, *args, **kwargs).result()


def start_on_the_model_thread(function: Callable[..., object], *args, **kwargs) -> None:
    """`function(*args, **kwargs)` queued for the model thread without waiting for it (loading the start-up pair:
    the first Step then waits behind it rather than loading the pair a second time)."""
    _executor.submit(function, *args, **kwargs)
