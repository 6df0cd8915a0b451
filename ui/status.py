"""The status line's words: one message with a plain symbol for its kind, and the statuses of a Run (the page's
scripts read them too, ui/page_scripts.py)."""
from __future__ import annotations

from dynasd.explorer.sessions.controller import RUNNING, STOPPING  # statuses of a Run (the page reads RUNNING)

__all__ = ["RUNNING", "STOPPING", "status_line"]


def status_line(message: str, kind: str = "info") -> str:
    # plain symbols, not emoji: they render on machines without an emoji font (headless browsers, servers)
    icon = {"info": "→", "warn": "⚠", "error": "✗", "ok": "✓"}[kind]
    return f"{icon} {message}"
