"""Explorer sessions by id: bounded in number, each dropped a while after its last use."""
from __future__ import annotations

import threading
import time
import uuid
from typing import Callable

from ..inputs import UserError
from .session import Session


class SessionRegistry:
    """Sessions by id, at most `max_sessions`, each dropped `ttl_s` seconds after its last use."""

    def __init__(self, max_sessions: int = 64, ttl_s: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self.clock = clock
        self._sessions: dict[str, Session] = {}
        self._guard = threading.Lock()

    def __len__(self) -> int:
        with self._guard:
            return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        with self._guard:
            return session_id in self._sessions

    def get(self, session_id: str | None) -> Session:
        """The session with this id, or a new one (new id) when it is unknown or expired."""
        with self._guard:
            now = self.clock()
            self._expire(now)
            session = self._sessions.get(session_id or "")
            if session is None:
                self._make_room()
                session = Session(uuid.uuid4().hex)
                session.created = now
                self._sessions[session.id] = session
            session.last_used = now
            return session

    def drop(self, session_id: str | None) -> None:
        with self._guard:
            self._sessions.pop(session_id or "", None)

    def _expire(self, now: float) -> None:
        for sid in [sid for sid, s in self._sessions.items() if now - s.last_used > self.ttl_s and not s.busy]:
            del self._sessions[sid]

    def _make_room(self) -> None:
        while len(self._sessions) >= self.max_sessions:
            idle = [s for s in self._sessions.values() if not s.busy]
            if not idle:
                raise UserError("the server is busy (every session slot is in use); try again in a minute")
            del self._sessions[min(idle, key=lambda s: s.last_used).id]

    def adopt(self, session: Session) -> Session:
        """Serve `session` (made whole from another process's Session.state()) under its own id from now on: how
        a second process goes on with a session the first one served."""
        with self._guard:
            self._expire(self.clock())
            if session.id not in self._sessions:
                self._make_room()
            session.last_used = self.clock()
            self._sessions[session.id] = session
            return session
