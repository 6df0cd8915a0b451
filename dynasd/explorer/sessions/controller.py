"""A session's life as one state machine: one method per thing a learner does, each returning one Outcome.

The session (session.py) is data: its run, the steps ahead, the decoder's snapshot and its `mode`, a Mode. This
module moves the mode for a learner's actions and says what each one did; ui/ draws the Outcome and Gradio never
appears here. The transitions (an action not listed leaves the mode as it is):

    EMPTY, STEPPING, FINISHED, REPLACE_ASKED, FAILED --step/run_begin/run--> STEPPING (a new run started, or the
        one on show goes on) then RUNNING for a Run; a model call that fails --> FAILED
    FINISHED --step/run_begin/run, same settings and prompt--> REPLACE_ASKED (nothing runs; the run stays on show)
    REPLACE_ASKED --step/run_begin/run, same settings and prompt--> a new run in place of the finished one
    FAILED --step/run_begin/run, same settings and prompt--> FAILED (SessionFailed: press Reset)
    RUNNING --run_next--> RUNNING, or after the run's last step FINISHED
    RUNNING --stop--> STOPPING --run_next, or the step in progress ends--> STEPPING ("Stopped after ...")
    RUNNING --run_next with the page's Stop--> STOPPED_BY_PAGE --stop (the request on its way)--> STEPPING/FINISHED
    RUNNING (a paced Run not asked for its next step for PACED_RUN_TIMEOUT_S) --any action--> STEPPING/FINISHED
    FINISHED --follow_up--> STEPPING (the next turn)
    any --load/example--> REPLAYING;  any --reset--> EMPTY
    REPLAYING --next_recorded--> REPLAYING (the recorded step after the one on show; a replay has no model to step)

Errors are exceptions with the learner's words in them: UserError for anything the learner can fix (bad input,
nothing to step), SessionFailed for a model call that failed (this session only). Call the methods without holding
`session.lock`: they take it around the session's data, and Stop never waits for it.
"""
from __future__ import annotations

import sys
import time
import traceback
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterator

from ...loading.models import pick_device
from ...trace import RunTrace, StepTrace
from ...tree import TreeShape
from ..costs.both_sides import example_note
from ..failures import SessionFailed
from ..inputs import Settings, UserError
from ..lessons import predict
from ..lessons.predict import Reveal
from . import share
from .calls import ModelCalls
from .session import Mode, Session, load_trace

RUNNING, STOPPING = "Running…", "Stopping after the current step…"  # statuses of a Run (the page reads RUNNING)
WIDE_TREE_NODES = 8  # the narrow recipe's (2, 1, 1, 1) tree; wider ones lost to ar on every CPU measured


class Show(Enum):
    """What the step's views do after an action."""

    STEP = "step"      # draw the step `index` of the run on show (the last when None)
    KEEP = "keep"      # leave every view as it is; only the status line changes (when `said` is not None)
    EMPTY = "empty"    # clear the views: there is no run
    NOTHING = "nothing"  # send nothing at all (a paced Run's request after its end)


@dataclass(frozen=True)
class Outcome:
    """What one action did, for the page to show: the status line's message and its kind (None: the status line
    stays as it is), which step to draw, whether a paced Run asks for another step, and the run whose prompt and
    settings go to the controls (a loaded trace), or a scored guess."""

    said: str | None = None
    kind: str = "info"     # "info", "ok", "warn" or "error" (ui/status.py)
    show: Show = Show.STEP
    index: int | None = None
    more: bool = False
    loaded: RunTrace | None = None
    reveal: Reveal | None = None


class Controller:
    """A learner's actions on one session, computed through `calls` (calls.ModelCalls)."""

    def __init__(self, session: Session, calls: ModelCalls) -> None:
        self.session, self.calls = session, calls

    # -- Play: Step, Run, Stop, Reset, follow-up ----------------------------------------------------------------
    def step(self, settings: Settings, prompt: str) -> Outcome:
        """Step: the next step of the run of these settings and prompt (a new run when they changed)."""
        session = self._not_during_a_run()
        with session.lock:
            note = self._ensure_run(settings, prompt, self.calls.chunk)
            if isinstance(note, Outcome):
                return note
            step = session.step(self.calls)
        said = step_time(step) + (f" ({note})" if note else "") + (" The run is finished." if session.done else "")
        return Outcome(said, "ok")

    def run_begin(self, settings: Settings, prompt: str) -> Outcome:
        """The page's Run: its first step; the page asks for each next one (run_next) once it has drawn this one,
        so a slow page slows the run down instead of falling behind it. On ZeroGPU the first request computes
        the whole run in one GPU call, which the page then plays back."""
        session = self.session
        with session.lock:
            self._not_during_a_run()  # under the lock: two Runs in one session cannot both pass
            note = self._ensure_run(settings, prompt, self.calls.run_chunk)
            if isinstance(note, Outcome):
                return note
            session.mode, session.paced_at = Mode.RUNNING, time.monotonic()
            return self._paced_step(note)

    def run_next(self, stop_pressed: bool = False) -> Outcome:
        """One more step of the page's Run, or its end: Stop (pressed in the page, which says so with this
        request: `stop_pressed`; or heard by stop()), Reset, or the run finished."""
        session = self.session
        if session.paced_at is None:  # Reset, a loaded trace or a new Step replaced the run: nothing to draw
            return Outcome(show=Show.NOTHING)
        with session.lock:
            if stop_pressed and session.mode is Mode.RUNNING:
                session.mode = Mode.STOPPED_BY_PAGE
            if session.mode is not Mode.RUNNING or session.done:
                return self._end_run()
            return self._paced_step("")

    def run(self, settings: Settings, prompt: str, every_s: float) -> Iterator[Outcome]:
        """The Run of API clients: an Outcome at most every `every_s` seconds, then the last, until the run is
        done or stopped (Stop is heard between steps, so a stopped run is a consistent one to go on with)."""
        session = self.session
        with session.lock:
            self._not_during_a_run()
            note = self._ensure_run(settings, prompt, self.calls.run_chunk)
            if isinstance(note, Outcome):
                yield note
                return
            run, session.mode, session.paced_at = session.run, Mode.RUNNING, None
        try:
            yield from self._stream(run, every_s)
        finally:
            stopped = session.mode is Mode.STOPPING
            if session.run is run and session.mode in (Mode.RUNNING, Mode.STOPPING):
                session.mode = session.settled()
            session.touch()
        if session.run is run:  # not replaced by a Reset or a loaded trace meanwhile
            yield Outcome(run_end(run, stopped), "ok")

    def _stream(self, run: RunTrace, every_s: float) -> Iterator[Outcome]:
        last_sent = 0.0
        while not run.finished and self.session.mode is Mode.RUNNING:
            with self.session.lock:
                if self.session.run is not run:
                    return
                self._shown_by_a_run(self.session.step(self.calls, self.calls.run_chunk))
            now = time.monotonic()
            if now - last_sent >= every_s and not run.finished:
                last_sent = now
                yield Outcome(f"{RUNNING} step {len(run.steps) - 1}")

    def stop(self) -> Outcome:
        """Stop takes effect before the next step; with nothing running it says so. The page's own Run is told by
        the page, which writes "Stopping…" at once: the reply then leaves the status alone, since it may arrive
        after the run's last update ("Stopped after …"), which it must not overwrite."""
        session = self.session
        if session.mode is Mode.STOPPED_BY_PAGE:  # this Stop's own click already ended the page's Run
            session.mode = session.settled()
            return Outcome(show=Show.KEEP)
        if not session.run_in_progress:
            return Outcome("Nothing is running: nothing to stop" + self._where() + ".", show=Show.KEEP)
        session.mode = Mode.STOPPING
        return Outcome(None if session.paced_run_alive else STOPPING, show=Show.KEEP)

    def _where(self) -> str:
        session = self.session
        steps = len(session.run.steps) if session.run is not None else 0
        if session.done:
            return f" (the run on show is finished: {steps} steps)"
        if steps:
            return f" (the run on show stopped after {steps} steps: Run or Step go on with it)"
        return " (Run to start one, Step to take one step)"

    def reset(self) -> Outcome:
        session = self.session
        if session.run_in_progress:
            session.mode = Mode.STOPPING  # a streamed Run ends at its next step, which reset() then replaces
        with session.lock:
            session.reset()
        return Outcome("Reset. Press **Step** or **Run** to start a new run.", show=Show.EMPTY)

    def follow_up(self, message: str) -> Outcome:
        session = self._not_during_a_run()
        with session.lock:
            session.follow_up(self.calls, message)
        return Outcome(f"Turn {len(session.turns)} of the conversation: press **Step** or **Run** to answer the "
                       "follow-up.", "ok")

    # -- which step is on show ----------------------------------------------------------------------------------
    def show_step(self, index) -> Outcome:
        if not self._has_steps():
            return Outcome("Nothing to show yet: press **Step** or **Run**.", show=Show.EMPTY)
        return Outcome(f"Showing step {int(index)}.", index=int(index))

    def back(self, index) -> Outcome:
        """Lecture mode's ←: the step before the one on show."""
        if not self._has_steps():
            return Outcome("Nothing to go back to yet: press → to take a step.", "warn")
        shown = max(0, int(index or 0) - 1)
        return Outcome(f"Back to step {shown}.", "ok", index=shown)

    def next_recorded(self, index) -> Outcome:
        """Lecture mode's → on a replayed run: the recorded step after the one on show (`index`). A replay has no
        model to step, and → must not throw it away for a new run; after its last step it says so, and Step or
        Run start a run like it."""
        session = self.session
        if not session.replay:
            raise UserError("the run on show is not a replay: Step goes on with it")
        last = len(session.run.steps) - 1
        shown = max(0, min(int(index or 0), last))
        if shown == last:
            return Outcome(f"This replay ends at its step {last}: ← goes back; Step or Run start a new run with its "
                           "settings.", "warn", show=Show.KEEP)
        return Outcome(f"Step {shown + 1} of the replay (recorded: no model runs).", "ok", index=shown + 1)

    def goto_step(self, settings: Settings, prompt: str, target) -> Outcome:
        """A shared link's step: the run of these settings (started or continued) until it has that step."""
        session = self._not_during_a_run()
        target = int(target or 0)
        if not 0 <= target <= share.MAX_LINK_STEP:
            raise UserError(f"the step must lie in [0, {share.MAX_LINK_STEP}]")
        with session.lock:
            if session.replay or not session.matches(settings, prompt):
                session.start(self.calls, settings, prompt, steps=target + 1)
            while len(session.run.steps) <= target and not session.done:  # one model call at most
                session.step(self.calls, target + 1 - len(session.run.steps))
        shown = min(target, len(session.run.steps) - 1)
        note = "" if shown == target else f" (the run finished after step {shown})"
        return Outcome(f"Showing step {shown}{note}.", "ok", index=shown)

    # -- replays ------------------------------------------------------------------------------------------------
    def load(self, path, drawable: Callable[[RunTrace], object]) -> Outcome:
        """Replay a trace file; its prompt and settings go to the controls, so Step starts a run like it. A trace
        that passed the schema checks but that `drawable` cannot draw is refused, and the session stays empty."""
        if not path:
            return Outcome("Choose a trace file (.json) to load.", "warn", show=Show.EMPTY)
        session = self._not_during_a_run()
        run = load_trace(path)
        if not run.steps:
            raise UserError("that trace has no steps")
        with session.lock:
            session.load(run)
            try:
                drawable(run)
            except Exception as exc:  # noqa: BLE001 - a stranger's file: logged, refused with a reason
                traceback.print_exception(exc, file=sys.stderr)
                session.reset()
                raise UserError("cannot show that trace: its steps do not describe a drawable tree") from exc
        return Outcome(f"Loaded a {run.method[:40]} trace of {len(run.steps)} steps on {run.pair[:80]}: replaying, "
                       "no model needed.", "ok", loaded=run)

    def example(self, name: str) -> Outcome:
        """Replay a shipped example trace from its first step: no model is needed."""
        session = self._not_during_a_run()
        run = share.load_example(name)
        with session.lock:
            session.load(run)
        note = f" {example_note(name)}" if example_note(name) else ""
        return Outcome(f"Replaying the example '{name}': {len(run.steps)} steps of {run.method} on {run.pair}; no "
                       f"model needed. Drag the step slider.{note}", "ok", index=0, loaded=run)

    # -- predict, then reveal -----------------------------------------------------------------------------------
    def predict_first(self, on: bool, index, said: str) -> Outcome:
        """'Let me predict first' or lecture mode turned on or off: the steps shown with their verdicts so far stay
        shown (a live run's every step was on show when it was taken; a replay's, up to the one on show), later
        steps wait for a guess (on); every step is shown (off)."""
        session = self.session
        if on and not session.predict_first and self._has_steps():
            with session.lock:
                run = session.run
                shown = int(index or 0) + 1 if session.replay else len(run.steps)
                predict.keep_seen(run, range(min(shown, len(run.steps))))
        session.predict_first = bool(on)
        return Outcome(said, "ok", index=index if self._has_steps() else None)

    def predict(self, index, node, guess) -> Outcome:
        """Score a guess about step `index` (node -1: how many tokens it commits), then show the step."""
        if guess is None or guess == "":
            raise UserError("type your guess first")
        index = int(index or 0)
        with self.session.lock:
            said = predict.predict(self.session.run, index, int(node if node is not None else -1), int(guess))
        return Outcome(f"Step {index} revealed.", "ok", index=index, reveal=said)

    def reveal(self, index) -> Outcome:
        """A presenter's reveal: the step's verdicts shown with no guess (never scored)."""
        index = int(index or 0)
        with self.session.lock:
            predict.reveal(self.session.run, index)
        return Outcome(f"Step {index} revealed.", "ok", index=index)

    # -- the parts ----------------------------------------------------------------------------------------------
    def _has_steps(self) -> bool:
        return self.session.run is not None and bool(self.session.run.steps)

    def _not_during_a_run(self) -> Session:
        session = self.session
        if session.run_in_progress:
            raise UserError("a Run is in progress in this session: press Stop first")
        if session.mode in (Mode.RUNNING, Mode.STOPPING):  # a page that stopped asking: its Run is over
            session.mode, session.paced_at = session.settled(), None
        return session

    def _ensure_run(self, settings: Settings, prompt: str, steps: int) -> str | Outcome:
        """A new run when there is none, or the settings or prompt changed, computing its first `steps` steps in
        the same model call: what to say about it ("" when the run on show goes on). A finished run is not
        replaced silently: the first Step or Run after it asks (an Outcome; the run stays on show), the second
        starts the new run. A failed session stays failed until Reset or a change of settings or prompt."""
        session = self.session
        same = session.settings == settings and session.prompt == prompt
        if session.mode is Mode.FAILED and same:
            raise SessionFailed(session.error)
        if session.matches(settings, prompt) and session.mode is not Mode.FAILED:
            if not session.done:
                return ""
            if session.mode is not Mode.REPLACE_ASKED:
                session.mode = Mode.REPLACE_ASKED
                return Outcome(f"This run is finished ({len(session.run.steps)} steps, still on show: use the step "
                               "slider). Press again to start a new run with these settings; it replaces this one "
                               "(save it under Trace file first to keep it).", show=Show.KEEP)
        replaced = session.run is not None and not session.replay
        reason = ("settings changed: started a new run" if replaced and not session.done
                  else "started a new run in place of the finished one" if replaced else "started a new run")
        session.start(self.calls, settings, prompt, steps=steps)
        speed = session.tree_note.rstrip(".") or wide_tree_on_a_cpu(settings, self.calls.gpu)
        return f"{reason}; {start_costs(session)}" + (f". {speed}" if speed else "")

    def _paced_step(self, note: str) -> Outcome:
        """A step of the page's Run (under the lock): the step, and whether the page asks for another."""
        session = self.session
        try:
            step = self._shown_by_a_run(session.step(self.calls, self.calls.run_chunk))
        except BaseException:
            session.paced_at = None
            if session.mode in (Mode.RUNNING, Mode.STOPPING):
                session.mode = session.settled()
            raise
        if session.mode is Mode.RUNNING and not session.done:
            session.paced_at = time.monotonic()
            return Outcome(f"{RUNNING} step {step.index}" + (f" ({note})" if note else ""), more=True)
        return self._end_run()  # finished, or a Stop heard during the step ends the run with it

    def _shown_by_a_run(self, step: StepTrace) -> StepTrace:
        """A Run shows its steps with their verdicts, predictions on or not (a Run asks nothing): they stay seen."""
        run = self.session.run
        if self.session.predict_first:
            predict.keep_seen(run, (len(run.steps) - 1,))  # the step shown is the run's last
        return step

    def _end_run(self) -> Outcome:
        session = self.session
        stopped = session.mode in (Mode.STOPPING, Mode.STOPPED_BY_PAGE)
        session.paced_at = None
        if session.mode in (Mode.RUNNING, Mode.STOPPING):
            session.mode = session.settled()
        return Outcome(run_end(session.run, stopped), "ok")


def step_time(step: StepTrace) -> str:
    ms = (step.draft_seconds + step.verify_seconds + step.accept_seconds) * 1000
    return f"Step {step.index} took {ms:.0f} ms (draft + verify + accept; prefill not included)."


def run_end(run: RunTrace, stopped: bool) -> str:
    summary = run.summary()
    verb = "Stopped" if stopped and not run.finished else "Done"
    return (f"{verb} after {summary['steps']} steps: {summary['new_tokens']} tokens, "
            f"{summary['tokens_per_target_forward']:.2f} tokens per target forward.")


def start_costs(session: Session) -> str:
    """What starting the run cost, said once, because no step's time includes it."""
    loaded = f"loading the models took {session.load_seconds:.1f} s, " if session.load_seconds >= 0.05 else ""
    tokens = len(session.run.prompt_ids)
    return f"{loaded}prefill of {tokens} prompt tokens took {session.prefill_seconds * 1000:.0f} ms"


def wide_tree_on_a_cpu(settings: Settings, on_gpu: bool = False) -> str:
    """Said at the start of a run whose tree is wider than any that paid on a CPU (docs/benchmarks.md), when the
    models run on one and this device's costs were never kept (then where.tree_note says what they measured):
    a learner's first Run would otherwise show speculation losing without a word of why."""
    settings = settings.normalised()
    branching = settings.options.for_method().branching()
    if not branching or settings.method not in ("mcsd", "ti-mcsd") or on_gpu:
        return ""
    nodes = TreeShape(branching).num_nodes
    if nodes <= WIDE_TREE_NODES or pick_device(None).type != "cpu":
        return ""
    return (f"On a CPU this {nodes}-node tree is expected to be slower than ar: each step verifies {nodes + 1} "
            f"rows and runs {len(branching)} draft forwards, which cost more here than the tokens they win (Learn → "
            "Cost model measures both on this machine)")
