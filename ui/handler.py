"""The one decorator every handler of the page goes through: it looks the session up, calls the handler's body
with it, and sends the named views the body returns (ui/views.py) as Gradio's outputs. A failure is told one way,
with its message, in the views the handler sends (`Views.failure`):
- UserError (the learner can fix it): a warning, in a toast and in the view that says things;
- SessionFailed (a model call failed, this session only): the same as an error;
- anything else is a bug: its traceback goes to the server's log, the learner gets one line (`unexpected`).
A body that is a generator (a streamed Run, Compare) is sent as a stream of views, and a failure ends it."""
from __future__ import annotations

import functools
import inspect
import sys
import traceback
from typing import Callable, Iterator

import gradio as gr

from dynasd.explorer.failures import SessionFailed
from dynasd.explorer.inputs import UserError, one_line

from . import state
from .views import Views


def handler(views: type[Views]) -> Callable:
    """`@handler(StepViews)` over `def on_step(session, prompt, **controls) -> StepViews`: the event's first
    input is the session id (a gr.State), the body gets the session. A body may also return (or yield) a plain
    tuple of outputs, as Gradio takes them."""
    def wrap(body: Callable) -> Callable:
        if inspect.isgeneratorfunction(body):
            @functools.wraps(body)
            def stream(session_id, *args, **kwargs):
                yield from told(views, state.SESSIONS.get(session_id), body, *args, **kwargs)
            return stream

        @functools.wraps(body)
        def plain(session_id, *args, **kwargs):
            *_, last = told(views, state.SESSIONS.get(session_id), body, *args, **kwargs)
            return last
        return plain
    return wrap


def told(views: type[Views], session, produce: Callable, *args, **kwargs) -> Iterator[tuple]:
    """`produce(session, *args, **kwargs)`'s views (one, or a generator's) as outputs; on a failure, the failure in
    the views (`Views.failure`), or where even those cannot be drawn (a run on show that a bug stops drawing), in
    the bare views (`Views.bare`). Every handler of the app ends here, a class's learners' too (ui/classroom.py,
    with no session)."""
    words = None
    for attempt in (produce, views.failure, views.bare):
        try:
            made = attempt(session, *args, **kwargs) if words is None else attempt(session, *words)
            for sent in made if inspect.isgenerator(made) else (made,):
                yield sent.outputs() if isinstance(sent, Views) else sent
            return
        except Exception as exc:  # the one place a handler's failure becomes words for the learner
            if words is not None:  # the failure cannot be drawn either: logged, then said in the bare views
                unexpected(exc)
                continue
            words = said(exc)
            if views.TOAST:
                gr.Warning(words[0])


def said(exc: Exception) -> tuple[str, str]:
    """A failure's message and its kind ("warn" or "error")."""
    if isinstance(exc, UserError):
        return str(exc), "warn"
    if not isinstance(exc, SessionFailed):
        exc = unexpected(exc)
    return str(exc), "error"


def unexpected(exc: Exception) -> SessionFailed:
    """A bug, not a user mistake: the traceback goes to the server log, the user gets one line."""
    traceback.print_exception(exc, file=sys.stderr)
    return SessionFailed(f"something went wrong on the server ({one_line(exc)}); other sessions are not affected; "
                         "press Reset to start over")
