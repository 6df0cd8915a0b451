"""Server-side state: the model pairs (loaded once per process), the browser sessions and the classes (a lecturer's
run and its learners' answers: dynasd/explorer/sessions/classroom.py). Never in gr.State, which only holds the
session id. Read as `state.PAIRS` / `state.SESSIONS` / `state.CLASSES` at call time, so that the launcher (and
the tests) may replace them."""
from __future__ import annotations

from dynasd.explorer.pairs import pairs_from_env
from dynasd.explorer.sessions.classroom import ClassRegistry
from dynasd.explorer.sessions.registry import SessionRegistry

PAIRS = pairs_from_env()
SESSIONS = SessionRegistry(max_sessions=64, ttl_s=3600)
CLASSES = ClassRegistry(max_classes=8, ttl_s=3 * 3600)
