"""The last Compare measured on this machine, kept in the cache folder, and which recipe it found fastest here.

Why: the recipes' labels say where they were measured fastest (docs/benchmarks.md: "with float32 weights on an
AVX-512 CPU"), which is no advice on another machine. What this machine measured is kept, per machine and model
pair, with each method's tokens / s, its range over its chunks of steps (compare.py), the settings it ran with and
whether the machine was busy, so that the Recipe menu can mark the recipe measured fastest *here* (only a clear
winner: one whose range overlaps no other's, measured on a machine that was not busy) and otherwise say that
nothing, or nothing decisive, was measured here.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ...embedded import cache_dir
from ...options import OPTIONS

MAX_KEPT_BYTES = 200_000


@dataclass(frozen=True)
class Measured:
    """One method's row of a kept Compare."""

    method: str
    tokens_per_s: float
    low: float               # its tokens / s range over its chunks of steps (compare.py: rate_range)
    high: float


@dataclass(frozen=True)
class KeptCompare:
    measured_at: str         # UTC, "2026-12-05 03:10"
    machine: str             # dynasd/device_info.py: machine_line() of the process that ran it
    pair: str
    controls: dict           # the settings Compare ran every method with (their control values)
    rows: list[Measured]
    busy: str = ""           # "measured on a busy machine: ..." (compare.py), "" when it was not

    def fastest(self) -> tuple[Measured, bool] | None:
        """The fastest row and whether it is a clear winner (its range above every other row's, on a machine that
        was not busy: load that comes and goes widens every range and can still favour one method)."""
        if not self.rows:
            return None
        best = max(self.rows, key=lambda r: r.tokens_per_s)
        return best, not self.busy and all(r.high < best.low for r in self.rows if r is not best)


def compare_file(machine: str, pair: str) -> Path:
    key = hashlib.sha1(f"{machine}|{pair}".encode()).hexdigest()[:12]
    return cache_dir() / "measured" / f"compare-{key}.json"


def keep_compare(kept: KeptCompare) -> None:
    """Written atomically (a rename); a cache that cannot be written keeps nothing, silently."""
    path = compare_file(kept.machine, kept.pair)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        partial.write_text(json.dumps({"measured_at": kept.measured_at, "machine": kept.machine, "pair": kept.pair,
                                       "controls": kept.controls, "busy": kept.busy,
                                       "rows": [r.__dict__ for r in kept.rows]}, default=str))
        partial.replace(path)
    except OSError:
        pass


def read_compare(machine: str, pair: str) -> KeptCompare | None:
    """This machine's kept Compare of this pair, or None (none kept, or unreadable)."""
    path = compare_file(machine, pair)
    try:
        if path.stat().st_size > MAX_KEPT_BYTES:
            return None
        obj = json.loads(path.read_text(encoding="utf-8"))
        rows = [Measured(str(r["method"]), float(r["tokens_per_s"]), float(r["low"]), float(r["high"]))
                for r in obj["rows"]]
        return KeptCompare(str(obj["measured_at"]), str(obj["machine"]), str(obj["pair"]), dict(obj["controls"]),
                           rows, busy=str(obj.get("busy", "")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def now_utc() -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime())


def measured_recipe(kept: KeptCompare, values: dict) -> Measured | None:
    """The kept row that ran exactly this recipe's settings (every option its method reads), or None."""
    method = values.get("method")
    row = next((r for r in kept.rows if r.method == method), None)
    if row is None:
        return None
    for name, value in values.items():
        if name == "method" or not OPTIONS[name].read_by(method):
            continue
        if str(OPTIONS[name].record(value)) != str(kept.controls.get(name)):
            return None
    return row


def fastest_recipe_here(kept: KeptCompare | None, recipes: dict[str, dict]) -> str | None:
    """The label of the recipe the kept Compare ran that was the clear winner of it, if any."""
    if kept is None or kept.fastest() is None:
        return None
    best, clear = kept.fastest()
    if not clear:
        return None
    return next((label for label, values in recipes.items() if measured_recipe(kept, values) is best), None)
