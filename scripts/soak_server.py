"""Run app.py as the soak's server process, with memory probes that stay out of app.py.

    .venv/bin/python scripts/soak_server.py --pair tiny-random --host 127.0.0.1 --port 7861   # same flags as app.py

Environment switches (all optional):
    SOAK_QUEUE_CONCURRENCY=N the queue's concurrency (app.QUEUE_CONCURRENCY) instead of the app's own
    SOAK_COMPARE_CONCURRENCY=N  Compares at a time in their own lane (ui.layout.COMPARE_CONCURRENCY); 0: no lane
    SOAK_TRACEMALLOC=N      tracemalloc.start(N) at the first probe (N frames per allocation); started any
                            earlier, it slows start-up enough that gradio's launch check of localhost fails
    SOAK_PROBE_DIR=DIR      on SIGUSR1: gc.collect(), then write DIR/probe-<n>.json (VmRSS, per-session stores,
                            live objects by type) and, with tracemalloc on, DIR/snap-<n>.pickle; probe-<n>.json
                            is written last (renamed into place), so its appearance means the probe is complete
scripts/soak.py --memory-only and scripts/classroom.py launch this and drive it over HTTP.
"""
from __future__ import annotations

import collections
import gc
import json
import os
import signal
import sys
import threading
import tracemalloc
from pathlib import Path

from soak import import_app  # this folder (a script's folder is on sys.path); sets the environment first

from dynasd.explorer.sessions.memory import process_rss_mb

app = import_app()
from ui import state  # noqa: E402  (import_app put the checkout on sys.path)

DEMO: list = []
_serve = app.serve


def _capture_serve(demo, *args, **kwargs):
    DEMO.append(demo)
    return _serve(demo, *args, **kwargs)


app.serve = _capture_serve
if os.environ.get("SOAK_QUEUE_CONCURRENCY"):
    app.QUEUE_CONCURRENCY = int(os.environ["SOAK_QUEUE_CONCURRENCY"])
if os.environ.get("SOAK_COMPARE_CONCURRENCY"):
    import ui.layout

    ui.layout.COMPARE_CONCURRENCY = int(os.environ["SOAK_COMPARE_CONCURRENCY"]) or None


def _stores() -> dict:
    """Sizes of the per-session stores on the server: ours and gradio's."""
    out = {"registry": len(state.SESSIONS)}
    if not DEMO:
        return out
    demo = DEMO[0]
    fastapi_app = getattr(demo, "app", None)
    holder = getattr(fastapi_app, "state_holder", None)
    if holder is not None:
        out["gradio state_holder"] = len(holder.session_data)
        out["gradio state_holder.time_last_used"] = len(holder.time_last_used)
    for name, value in (vars(fastapi_app) if fastapi_app is not None else {}).items():
        if isinstance(value, (dict, list, set)) or hasattr(value, "__len__") and hasattr(value, "keys"):
            out[f"app.{name}"] = len(value)
    queue = getattr(demo, "_queue", None)
    if queue is not None:
        for name, value in vars(queue).items():
            if hasattr(value, "__len__") and not isinstance(value, (str, bytes)):
                try:
                    out[f"queue.{name}"] = len(value)
                except TypeError:
                    pass
    return out


_probes = iter(range(10**6))


def probe(_signum=None, _frame=None) -> None:
    folder = Path(os.environ["SOAK_PROBE_DIR"])
    n = next(_probes)
    if n == 0 and os.environ.get("SOAK_TRACEMALLOC"):
        tracemalloc.start(int(os.environ["SOAK_TRACEMALLOC"]))
    rss_before_gc = process_rss_mb()
    gc.collect()
    info = {"n": n, "rss_mb_before_gc": rss_before_gc, "rss_mb": process_rss_mb(), "threads": threading.active_count(),
            "stores": _stores(),
            "objects": collections.Counter(type(o).__name__ for o in gc.get_objects()).most_common(25)}
    if tracemalloc.is_tracing():
        info["traced_mb"] = tracemalloc.get_traced_memory()[0] / 2**20
        tracemalloc.take_snapshot().dump(str(folder / f"snap-{n}.pickle"))
    tmp = folder / f".probe-{n}.json"
    tmp.write_text(json.dumps(info, indent=1))
    tmp.rename(folder / f"probe-{n}.json")


if __name__ == "__main__":
    if os.environ.get("SOAK_PROBE_DIR"):
        signal.signal(signal.SIGUSR1, probe)
    app.main(sys.argv[1:])
