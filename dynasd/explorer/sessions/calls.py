"""A session's model calls behind one named interface, `ModelCalls`: start a run, advance it, follow it up.

Why an interface: a session (session.py) asks for model work and absorbs what comes back as data; where that work
runs is not its business. `InProcess` runs it here (the command line, the tests, a notebook). The page's form
(ui/gpu.py: `PageCalls`) runs each call on the serving process's model thread, or on a ZeroGPU Space in a
`spaces.GPU` process, where only data crosses. Both forms hand the work over as one of three requests (`StartRun`,
`Advance`, `FollowUp`) and the process that holds the models runs it with `request.on(pairs, settings, steps)`:
the model work itself (engine.py), then what this device's kept costs say of the steps taken (costs/cost.py:
a step that contradicts them marks them to be measured again; measure/where.py: a new run's tree note). The three
requests go through one function on ZeroGPU because its worker per decorated function is what keeps a live decoder
(engine.LIVE) from one call to the next.

A Step, end to end: Controller.step → Session.step → ModelCalls.advance → the form's `run` (in place, or
ui/gpu.py's `gpu_send` on the model thread or a GPU process) → Advance.on → engine.advance.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from ...decoders.snapshot import DecoderSnapshot
from .. import engine
from ..costs.cost import check_kept_costs
from ..engine import Progress
from ..inputs import Settings
from ..measure.where import tree_note
from ..pairs import PairCache


def _with_costs_read(pairs: PairCache, settings: Settings, progress: Progress, started: bool) -> Progress:
    """`progress` after this device's kept costs have read its steps (and, for a new run, said of its tree)."""
    steps = [recorded.step for recorded in progress.steps]
    if steps:
        settings = settings.normalised()
        pair = pairs.get(settings)  # loaded by the steps just taken
        check_kept_costs(pair, steps)
        if started:
            progress.tree_note = tree_note(pair, settings, steps)
    return progress


@dataclass(frozen=True)
class StartRun:
    """A new run of `prompt`: load the pair where this process has not, prefill, take up to `steps` steps."""

    prompt: str

    def on(self, pairs: PairCache, settings: Settings, steps: int) -> Progress:
        progress = engine.start_run(pairs, settings, self.prompt, steps)
        return _with_costs_read(pairs, settings, progress, started=True)


@dataclass(frozen=True)
class Advance:
    """Up to `steps` more steps of the run whose decoder state is `snapshot`."""

    snapshot: DecoderSnapshot

    def on(self, pairs: PairCache, settings: Settings, steps: int) -> Progress:
        progress = engine.advance(pairs, settings, self.snapshot, steps)
        return _with_costs_read(pairs, settings, progress, started=False)


@dataclass(frozen=True)
class FollowUp:
    """The conversation's next turn after the finished run `snapshot`: `turns` are the user's messages, the new one
    last."""

    snapshot: DecoderSnapshot
    turns: tuple[str, ...]

    def on(self, pairs: PairCache, settings: Settings, steps: int) -> Progress:
        progress = engine.follow_up(pairs, settings, self.snapshot, list(self.turns), steps)
        return _with_costs_read(pairs, settings, progress, started=True)


RunRequest = StartRun | Advance | FollowUp


class ModelCalls(ABC):
    """Where a session's model calls run: one method per action, each taking and returning data, and `run`, the one
    thing a form implements. `chunk` is how many steps a Step computes at once (1 where a step is cheap to ask for,
    more where each call waits for a GPU; later Steps show the rest without one), `run_chunk` how many a Run computes
    per call (engine.UNTIL_DONE: as many as fit), `gpu` whether the models run on a GPU. `expected_s` is the session's
    own estimate of the call's time: a ZeroGPU call asks for GPU time by it."""

    chunk: int = 1
    run_chunk: int = 1
    gpu: bool = False

    def start(self, settings: Settings, prompt: str, steps: int = 0, expected_s: float = 0.0) -> Progress:
        return self.send(settings, StartRun(prompt), steps, expected_s)

    def advance(self, settings: Settings, snapshot: DecoderSnapshot, steps: int = 1,
                expected_s: float = 0.0) -> Progress:
        return self.send(settings, Advance(snapshot), steps, expected_s)

    def follow_up(self, settings: Settings, snapshot: DecoderSnapshot, turns: list[str], steps: int = 0,
                  expected_s: float = 0.0) -> Progress:
        return self.send(settings, FollowUp(snapshot, tuple(turns)), steps, expected_s)

    @abstractmethod
    def send(self, settings: Settings, request: RunRequest, steps: int, expected_s: float) -> Progress:
        """`request.on(...)` where this kind of call runs it (in place, or in a GPU process)."""


class InProcess(ModelCalls):
    """The calls run here, on the caller's thread, with the models of `pairs`."""

    def __init__(self, pairs: PairCache, chunk: int = 1) -> None:
        self.pairs, self.chunk = pairs, chunk

    def send(self, settings: Settings, request: RunRequest, steps: int, expected_s: float) -> Progress:
        return request.on(self.pairs, settings, steps)
