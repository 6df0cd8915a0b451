"""Server-side state: the model pairs (loaded once per process) and the browser sessions. Never in gr.State,
which only holds the session id. Read as `state.PAIRS` / `state.SESSIONS` at call time, so that the launcher (and
the tests) may replace them."""
from __future__ import annotations

from dynasd.explorer.pairs import pairs_from_env
from dynasd.explorer.sessions.registry import SessionRegistry

PAIRS = pairs_from_env()
SESSIONS = SessionRegistry(max_sessions=64, ttl_s=3600)
