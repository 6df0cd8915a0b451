"""What one session's page shows, output by output, so that an update sends only the outputs that changed.

Why: a Step, a scrub or a paced Run's step returns five figures, tens of kB of Plotly JSON on the embedded pair,
and the page rebuilds every figure it receives. A figure whose content did not change (the step on show shown
again, the last update of a stopped Run, a figure that does not depend on the step) need not travel nor be drawn
again: the handler leaves it out (Gradio's `gr.skip()`) and the page keeps the one it has.

The server can leave an output out only while it knows what the page holds. It remembers a fingerprint of each
output it sent, and:
- updates of one session are built one at a time (`update()` holds a lock); an update that had to wait for
  another one forgets every fingerprint and sends in full, since the two may reach the page in either order;
- an update that fails while it is built forgets every fingerprint too, so the next one sends in full.
An output counts as sent once its handler returns: Gradio queues a plain function's value for the page as it
returns. (A generator's last value is sent twice, once more as its result, which is why the handlers that send
figures are plain functions.)
"""
from __future__ import annotations

import hashlib
import threading
import weakref
from contextlib import contextmanager
from typing import Iterator


def fingerprint(content: str) -> bytes:
    return hashlib.blake2b(content.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class Update:
    """One update being built: `changed(name, content)` says whether the output must be sent, and records it."""

    def __init__(self, sent: dict[str, bytes]) -> None:
        self._sent = sent
        self.left_out: list[str] = []

    def changed(self, name: str, content: str) -> bool:
        key = fingerprint(content)
        if self._sent.get(name) == key:
            self.left_out.append(name)
            return False
        self._sent[name] = key
        return True


class SentOutputs:
    """Fingerprints of the outputs last sent to one session's page (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent: dict[str, bytes] = {}

    @contextmanager
    def update(self) -> Iterator[Update]:
        waited = not self._lock.acquire(blocking=False)
        if waited:
            self._lock.acquire()
        try:
            if waited:
                self._sent.clear()
            yield Update(self._sent)
        except BaseException:
            self._sent.clear()
            raise
        finally:
            self._lock.release()


_PAGES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a session's page, gone with its session
_PAGES_LOCK = threading.Lock()


def page_of(session) -> SentOutputs:
    """What `session`'s page was sent. Kept beside the session, not in it: a session is data that travels to
    other processes, and what one page holds is known only to the process that serves it."""
    with _PAGES_LOCK:
        if session not in _PAGES:
            _PAGES[session] = SentOutputs()
        return _PAGES[session]
