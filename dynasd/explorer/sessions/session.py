"""Explorer sessions: what one browser session shows and the decoder state it goes on from, all of it data.

Why data: on a ZeroGPU Space every model call runs in a forked child process that shares no memory with the
process serving the page, and behind one URL several replicas may serve one visitor. So a Session holds no model,
no KV cache and no decoder: it holds the run on show (a RunTrace), the steps already computed but not yet shown
(`ahead`), and the decoder's snapshot after them. Model work goes through `ModelCalls` (calls.py: functions of
data, in a spaces.GPU process on a Space), and the session absorbs what comes back. A session pickles
(`state()`/`from_state()`) and goes on in another process exactly as it would have in this one.

A failing model call marks only its own session failed; other sessions and the loaded models carry on.
"""
from __future__ import annotations

import pickle
import threading
import time
from enum import Enum
from pathlib import Path

from ...decoders.snapshot import DecoderSnapshot
from ...trace import RunTrace, StepTrace, TraceError, load_run
from ..engine import Advance, FollowUp, Progress, RecordedStep, StartRun
from ..failures import SessionFailed, failed_during
from ..inputs import Settings, UserError, check_prompt
from ..pairs import PairCache
from .calls import ModelCalls, in_process


def _calls(where: ModelCalls | PairCache) -> ModelCalls:
    """The calls a session's model work goes through: a pair cache alone means in this process (the tests)."""
    return where if isinstance(where, ModelCalls) else in_process(where)


# What a session is, as data: these fields travel with state() and make a session whole in another process.
STATE_FIELDS = ("id", "settings", "prompt", "turns", "run", "ahead", "snapshot", "mode", "error", "load_seconds",
                "prefill_seconds", "seconds_per_step", "tree_note")


class Mode(Enum):
    """Where a session stands: its one state. The data methods below move it where the data changes (a run
    started, its last step shown, a failure, a loaded trace, a reset); the learner's other actions (a Run, Stop,
    the question before a finished run is replaced) move it in controller.py, which documents every transition."""

    EMPTY = "empty"                # no run on show
    STEPPING = "stepping"          # a run on show that Step and Run go on with (a stopped Run too)
    RUNNING = "running"            # a Run in progress: paced by the page (`paced_at`) or streamed to an API client
    STOPPING = "stopping"          # Stop heard during a Run: it ends after the current step
    STOPPED_BY_PAGE = "stopped by the page"  # the page ended its Run itself; the Stop request on its way says nothing
    FINISHED = "finished"          # the run on show is done; a follow-up turn goes on from it
    REPLACE_ASKED = "replace asked"  # Step or Run pressed once on the finished run: the next press replaces it
    REPLAYING = "replaying"        # a loaded trace: there is no decoder to step
    FAILED = "failed"              # a model call failed (`error` says how): no step until Reset or other settings


class Session:
    """One browser session's run and the decoder state it goes on from, and its `mode`. Methods are called with
    `self.lock` held by the registry user."""

    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.lock = threading.RLock()
        self.created = self.last_used = time.monotonic()
        self.settings: Settings | None = None
        self.prompt: str = ""
        self.turns: list[str] = []   # the conversation's user messages: the prompt, then any follow-ups
        self.run: RunTrace | None = None
        self.ahead: list[RecordedStep] = []       # steps computed but not yet on show (a chunk, a recorded Run)
        self.snapshot: DecoderSnapshot | None = None  # the decoder's state after the last computed step
        self.mode = Mode.EMPTY
        self.error: str | None = None  # what failed, while the mode is FAILED
        # A Run paced by the browser: the page asks for each next step only once it has drawn the last one, so
        # the display is never more than a step behind. `paced_at` is the time of the last step it asked for
        # (None for a Run streamed to an API client); a page that was closed mid-run stops asking, and after
        # PACED_RUN_TIMEOUT_S the run counts as stopped.
        self.paced_at: float | None = None
        self.load_seconds = 0.0        # loading the model pair for the current run (0 when it was loaded already)
        self.prefill_seconds = 0.0     # the current run's prompt prefill: not part of any step's time
        self.seconds_per_step = 0.0    # measured in the last model call: how long the next call should take
        self.tree_note = ""            # what this device's kept costs say of the current run's tree (where.tree_note)
        self.predict_first = False     # a page setting, not a state: a step's verdicts wait for a guess

    # -- the session as data ----------------------------------------------------------------------------------
    def state(self) -> bytes:
        """This session as bytes: everything needed to go on with it in another process (from_state)."""
        return pickle.dumps({name: getattr(self, name) for name in STATE_FIELDS})

    @classmethod
    def from_state(cls, state: bytes) -> "Session":
        """A session made whole from state(), a Run in progress settled (its page's requests go to the process
        that began it); what the page was sent is not known here, so updates send in full."""
        fields = pickle.loads(state)
        session = cls(fields["id"])
        for name in STATE_FIELDS:
            setattr(session, name, fields[name])
        session.mode = session.settled()  # a Run is served where it began: here the run goes on with Step or Run
        return session

    def touch(self) -> None:
        self.last_used = time.monotonic()

    @property
    def paced_run_alive(self) -> bool:
        return self.paced_at is not None and time.monotonic() - self.paced_at < PACED_RUN_TIMEOUT_S

    @property
    def run_in_progress(self) -> bool:
        """A Run is under way: a server-side stream (API clients) or a browser-paced run still being asked for."""
        return self.mode in (Mode.RUNNING, Mode.STOPPING) and (self.paced_at is None or self.paced_run_alive)

    @property
    def replay(self) -> bool:
        """The run on show came from a trace file: there is no decoder to step."""
        return self.mode is Mode.REPLAYING

    @property
    def busy(self) -> bool:
        if self.run_in_progress:
            return True
        if self.lock.acquire(blocking=False):
            self.lock.release()
            return False
        return True

    @property
    def done(self) -> bool:
        return self.run is not None and bool(self.run.finished)

    @property
    def recorded(self) -> int:
        """Steps computed beyond the one on show: a later Step or Run shows them without a model call."""
        return len(self.ahead)

    def matches(self, settings: Settings, prompt: str) -> bool:
        return not self.replay and self.run is not None and self.settings == settings and self.prompt == prompt

    def settled(self) -> Mode:
        """The mode once no Run is in progress: the run on show finished, or one to go on with."""
        if self.mode in (Mode.FAILED, Mode.REPLAYING, Mode.EMPTY):
            return self.mode
        return Mode.FINISHED if self.done else Mode.STEPPING

    def reset(self) -> None:
        self.paced_at = None
        self.run = self.settings = self.snapshot = None
        self.ahead = []
        self.prompt, self.mode, self.error = "", Mode.EMPTY, None
        self.turns = []

    # -- model work, through ModelCalls ------------------------------------------------------------------------
    def start(self, calls: ModelCalls | PairCache, settings: Settings, prompt: str, steps: int = 0) -> RunTrace:
        """A new run: prefill the prompt (and take `steps` steps, kept ahead of the page). Raises UserError for
        anything the user can fix; the previous run stays on show until the new one has started."""
        settings = settings.normalised()  # a bad shape or sampling setting is refused before any model loads
        prompt = check_prompt(prompt)
        progress = _calls(calls).send(StartRun(settings, prompt, steps, self._expected(steps, settings)))
        if progress.run is None:  # nothing started: the old run stays as it was
            self._raise(progress, settings, prompt, started=False)
        self.reset()
        self.settings, self.prompt, self.turns, self.mode = settings, prompt, [prompt], Mode.STEPPING
        self._absorb(progress)
        self._raise(progress, settings, prompt, started=True)
        return self.run

    def follow_up(self, calls: ModelCalls | PairCache, message: str) -> RunTrace:
        """The next turn of the conversation: `message` after the finished run's answer, as a new run with the
        same settings (Step and Run then go on with it). The tokens are those of a fresh run over the whole
        conversation: prompt, answer, then prompts.follow_up_ids."""
        message = check_prompt(message)
        if self.mode is Mode.FAILED:
            raise SessionFailed(self.error)
        if self.replay or self.run is None or self.snapshot is None or not self.done:
            raise UserError("a follow-up message goes after a finished run: press Run (or Step to the end) first")
        turns = self.turns + [message]
        progress = _calls(calls).send(FollowUp(self.settings, self.snapshot, tuple(turns), 0,
                                               self._expected(0, self.settings)))
        if progress.run is None:
            self._raise(progress, self.settings, self.prompt, started=False)
        self.turns, self.ahead, self.mode = turns, [], Mode.STEPPING
        self._absorb(progress)
        self.load_seconds = 0.0
        self._raise(progress, self.settings, self.prompt, started=True)
        return self.run

    def step(self, calls: ModelCalls | PairCache, steps: int | None = None) -> StepTrace:
        """Show the next step: one computed already (`ahead`), or a model call that computes `steps` of them
        (default: the calls' chunk; UNTIL_DONE for a whole Run) and shows the first."""
        if self.mode is Mode.FAILED:
            raise SessionFailed(self.error)
        if self.replay:
            raise UserError("this run was loaded from a trace file: there is no model to step (press Reset)")
        if self.done:
            raise UserError("the run is finished; press Reset (or Step again) to start a new one")
        if self.run is None or (self.snapshot is None and not self.ahead):
            raise UserError("nothing to step: press Step or Run to start a run")
        if not self.ahead:
            calls = _calls(calls)
            count = calls.chunk if steps is None else steps
            progress = calls.send(Advance(self.settings, self.snapshot, count, self._expected(count, self.settings)))
            self._absorb(progress)
            if not self.ahead:
                self._raise(progress, self.settings, self.prompt, started=True)
        shown = self._reveal()
        if self.mode is Mode.FAILED:  # failed after computing this step: on show, and said
            raise SessionFailed(self.error)
        return shown

    def _absorb(self, progress: Progress) -> None:
        if progress.run is not None:
            self.run = progress.run
            self.load_seconds, self.prefill_seconds = progress.load_seconds, progress.prefill_seconds
            self.tree_note = progress.tree_note
        self.ahead.extend(progress.steps)
        if progress.steps:
            self.seconds_per_step = progress.step_seconds / len(progress.steps)
        if progress.snapshot is not None:
            self.snapshot = progress.snapshot
        if progress.failed:
            self.snapshot = None
            self.mode, self.error = Mode.FAILED, failed_during("the model call", progress.error)

    def _raise(self, progress: Progress, settings: Settings, prompt: str, started: bool) -> None:
        if progress.failed:
            if not started:  # a prefill that failed marks the session, and the old run is no longer on show
                self.reset()
                self.settings, self.prompt = settings, prompt
                self.mode, self.error = Mode.FAILED, failed_during("prefill", progress.error)
            raise SessionFailed(self.error)
        if progress.error:
            raise UserError(progress.error)

    def _reveal(self) -> StepTrace:
        recorded = self.ahead.pop(0)
        run = self.run
        run.steps.append(recorded.step)
        run.new_token_ids += recorded.step.committed
        run.text, run.finished = recorded.text, recorded.finished
        step = recorded.step
        run.seconds += step.draft_seconds + step.verify_seconds + step.accept_seconds
        if run.finished and self.mode is not Mode.FAILED:
            self.mode = Mode.FINISHED
        return step

    def _expected(self, steps: int, settings: Settings) -> float:
        """The seconds a model call of `steps` steps should take, from this session's own measurements (0 when
        there are none yet): ZeroGPU is asked for that much GPU time."""
        steps = min(steps, settings.max_new_tokens if settings else steps)
        return self.prefill_seconds + steps * self.seconds_per_step

    def load(self, run: RunTrace) -> None:
        self.reset()
        self.run, self.mode = run, Mode.REPLAYING


PACED_RUN_TIMEOUT_S = 30.0  # a browser-paced Run not asked for its next step this long was abandoned


def load_trace(path) -> RunTrace:
    """A trace file from a stranger: a run the figures can draw (dynasd/trace.py checks all of it), or UserError."""
    if not isinstance(path, (str, Path)):
        raise UserError("cannot load that trace: expected a file")
    try:
        return load_run(path)
    except (TraceError, OSError) as exc:
        raise UserError(f"cannot load that trace: {exc}") from exc
