"""How a session's model work reaches the models: one callable, `ModelCalls.send`, handed a request (engine.py:
`StartRun`, `Advance`, `FollowUp`) and returning the engine's `Progress`; and this device's kept costs read against
the steps taken (`read_kept_costs`), a step of its own that the engine runs where the models are.

Why one callable: a session asks for model work and absorbs what comes back as data; where that work runs is not
its business. `in_process(pairs)` serves the requests here, on the caller's thread (the command line, the tests, a
notebook); `on_model_thread(pairs)` on the serving process's one model thread (model_thread.py says why one);
on a ZeroGPU Space the page's form (ui/gpu.py: `page_calls`) sends each request to a `spaces.GPU` process, where
only data crosses. Every form ends in `engine.serve`, the engine's one door.

A Step on a CPU, end to end: `Controller.step` → `Session.step` → `ModelCalls.send` (here:
`model_thread.on_the_model_thread`) → `engine.serve` → `Decoder.step`, and back as data.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from ...loading.models import ModelPair
from .. import engine
from ..costs.cost import check_kept_costs
from ..engine import Advance, Progress, Request
from ..measure.where import tree_note
from ..model_thread import on_the_model_thread
from ..pairs import PairCache


@dataclass(frozen=True)
class ModelCalls:
    """Where a session's model calls run: `send(request)`, and how many steps each asks for. `chunk` is how many
    steps a Step computes at once (1 where a step is cheap to ask for, more where each call waits for a GPU; later
    Steps show the rest without one), `run_chunk` how many a Run computes per call (engine.UNTIL_DONE: as many as
    fit), `gpu` whether the models run on a GPU."""

    send: Callable[[Request], Progress]
    chunk: int = 1
    run_chunk: int = 1
    gpu: bool = False


def read_kept_costs(pair: ModelPair, request: Request, progress: Progress) -> None:
    """This device's kept costs read against the steps `request` just took (engine.serve runs it where the models
    are, once they are taken): a step that contradicts them marks them to be measured again (costs/cost.py); a new
    run gets the sentence they say of its tree (measure/where.py)."""
    steps = [recorded.step for recorded in progress.steps]
    check_kept_costs(pair, steps)
    if not isinstance(request, Advance):
        progress.tree_note = tree_note(pair, request.settings.normalised(), steps)


def in_process(pairs: PairCache, chunk: int = 1) -> ModelCalls:
    """The requests served here, on the caller's thread, with the models of `pairs`."""
    return ModelCalls(functools.partial(engine.serve, pairs, after_steps=read_kept_costs), chunk=chunk)


def on_model_thread(pairs: PairCache) -> ModelCalls:
    """The requests served on the serving process's one model thread, one step a Step and one a Run's call (the
    page draws each as it comes)."""
    return ModelCalls(functools.partial(on_the_model_thread, engine.serve, pairs, after_steps=read_kept_costs))
