"""A model call's failure as data, for calls that run in another process (a ZeroGPU Space's GPU process): only a
call's return value comes back from there, and an exception other than gradio's own reaches the caller as its
class name alone, so a call returns its failure (`Failed`) and the caller raises it again (`Failed.exception`).
A UserError or a ValueError (the learner can fix it) and a SessionFailed come back as themselves; any other
exception is a bug in this one call: its traceback goes to that process's log, and it comes back as SessionFailed
with its first line, so that one session fails and says so while every other goes on."""
from __future__ import annotations

import functools
import sys
import traceback
from dataclasses import dataclass
from typing import Callable

from .inputs import UserError, one_line


class SessionFailed(RuntimeError):
    """A model call failed inside one session; the message says so and how to recover."""


def failed_during(what: str, exc: BaseException | str) -> str:
    """A session's failure in one line: what failed, its first line, and the way on."""
    detail = exc if isinstance(exc, str) else one_line(exc)  # a model call in another process sends its line
    return f"the model call failed during {what} ({detail}); press Reset to start over"


@dataclass
class Failed:
    """An exception raised inside a model call, as data."""

    kind: str
    message: str

    def exception(self) -> Exception:
        return {"UserError": UserError, "ValueError": ValueError}.get(self.kind, SessionFailed)(self.message)


def failures_as_data(function: Callable) -> Callable:
    """`function`, returning a `Failed` instead of raising."""
    @functools.wraps(function)
    def body(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except (UserError, SessionFailed) as exc:
            return Failed(type(exc).__name__, str(exc))
        except ValueError as exc:
            return Failed("ValueError", str(exc))
        except Exception as exc:  # the one place a model call's bug becomes this session's failure
            traceback.print_exception(exc, file=sys.stderr)
            return Failed("SessionFailed", model_call_failed(exc))
    return body


def model_call_failed(exc: BaseException) -> str:
    return f"the model call failed ({one_line(exc)}); other sessions are not affected"
