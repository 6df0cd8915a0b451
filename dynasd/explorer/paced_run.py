"""The bookkeeping of a Run paced by the page: one step per request, the next asked for only once the page has
drawn the last, so a slow page slows the run down instead of falling behind it.

A session is in a paced run while `session.paced_at` is set (when its last step ended): a Stop then ends the run
after the current step. Stop reaches the server two ways, whichever comes first: the Stop event
(`stop_requested`), or the page's request for the next step, which says Stop was pressed (`stopped_by_page`
remembers that the page already ended the run, so the Stop event's own reply leaves the page's status alone).
Call these under `session.lock`.
"""
from __future__ import annotations

import time

from ..trace import StepTrace
from .session import Compute, Session


def first_step(session: Session, compute: Compute, steps: int = 1) -> tuple[StepTrace, bool]:
    """Begin the paced run with its first step: (the step, whether the run ended with it). A step not computed
    yet is computed with up to `steps` more in one model call (on ZeroGPU the whole run: one GPU call, which the
    page then plays back)."""
    session.stop_requested = session.stopped_by_page = False
    session.paced_at = time.monotonic()  # in progress from its first step on: a Stop then is heard
    step = session.step(compute, steps)
    return step, _after_step(session)


def next_step(session: Session, compute: Compute, stop_pressed: bool, steps: int = 1
              ) -> tuple[StepTrace | None, bool]:
    """One more step, or none when Stop was pressed (`stop_pressed`: the page saw it before its request reached
    the server) or heard, or the run is finished: (the step or None, whether the run has ended)."""
    if stop_pressed and not session.stop_requested:
        session.stop_requested = session.stopped_by_page = True
    run = session.run
    if session.stop_requested or run is None or run.finished:
        session.paced_at = None
        return None, True
    step = session.step(compute, steps)
    return step, _after_step(session)


def _after_step(session: Session) -> bool:
    ended = session.done or session.stop_requested  # a Stop heard during the step ends the run with it
    session.paced_at = None if ended else time.monotonic()
    return ended


def end(session: Session) -> None:
    """The paced run is over (a failure): the page's next request draws nothing."""
    session.paced_at = None
