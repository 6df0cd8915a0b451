"""The JSON Lines log every training command keeps in its working folder (`log.jsonl`).

Why a module of its own: all three training commands write one, and resumed runs append to it, so a working
folder holds one history that tests and people read back.
"""
from __future__ import annotations

import json
import time
from pathlib import Path


def open_log(out: Path):
    """A JSON Lines training log in `out` (appended to, so resumed runs keep one history): `log(record)` writes one
    line stamped with the time; `log.close()` closes the file."""
    out.mkdir(parents=True, exist_ok=True)
    log_file = (out / "log.jsonl").open("a")

    def log(record: dict) -> None:
        log_file.write(json.dumps({"time": round(time.time(), 1), **record}) + "\n")
        log_file.flush()

    log.close = log_file.close
    return log
