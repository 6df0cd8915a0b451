"""What Compare measured on this machine, kept in the cache folder: every speed figure the page calls measured is a
ratio against ar from one of these (speed.py quotes it), and the Recipe menu marks what they found here.

Why kept, and per what: a ratio against ar measured by Compare (each method paired round by round with ar,
compare.py) is the one measured answer to "is it faster?"; every other view of a run quotes it, so it must outlive
the Compare that made it. It holds for one machine (dynasd/device_info.py: machine_line, the CPU kind and its
threads), one model pair, the settings the methods ran with and one prompt (acceptance, and so the speed-up,
follows the text), so a Compare is kept under all four: one file per machine and pair holding the last
KEPT_COMPARES Compares, newest first, a new Compare of the same settings and prompt replacing the old. Each keeps,
per method, its ratio against ar with its range and the pairs behind it, then its own tokens / s (second: they move
15% between two quiet runs), the load it ran under and whether the machine was busy. The Recipe menu marks a recipe
only where a kept Compare ran exactly its settings, and stars one only as a clear winner (its range above every
other's, on a machine that was not busy); the recipes' own labels claim nothing about speed.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ...loading.embedded import cache_dir
from ...options import OPTIONS

MAX_KEPT_BYTES = 400_000
KEPT_COMPARES = 16           # Compares kept per machine and pair, newest first
PROMPT_KEPT_CHARS = 400      # the prompt as kept, for the page to name it (matching uses the whole prompt's key)
RUN_CONTROLS = ("max_new_tokens",)  # run settings a Compare's speed-ups depend on besides the methods' options


def prompt_key(prompt: str) -> str:
    return hashlib.sha1(prompt.encode("utf-8", "replace")).hexdigest()[:16]


@dataclass(frozen=True)
class Measured:
    """One method's row of a kept Compare: its ratio against ar paired round by round (`ratio`, its range
    `ratio_low`-`ratio_high` over `pairs` pairs; None where ar was not run), then its own tokens / s and their
    range over its chunks (compare.py: rate_range)."""

    method: str
    tokens_per_s: float
    low: float
    high: float
    ratio: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None
    pairs: int = 0

    @property
    def span(self) -> tuple[float, float]:
        """What this row can be told apart by: its ratio's range (ar: exactly 1), else its tokens / s range."""
        if self.method == "ar":
            return (1.0, 1.0)
        if self.ratio is not None and self.ratio_low is not None and self.ratio_high is not None:
            return (self.ratio_low, self.ratio_high)
        return (self.low, self.high)

    @property
    def speed(self) -> float:
        return 1.0 if self.method == "ar" else self.ratio if self.ratio is not None else self.tokens_per_s


@dataclass(frozen=True)
class KeptCompare:
    measured_at: str         # UTC, "2026-12-05 03:10"
    machine: str             # dynasd/device_info.py: machine_line() of the process that ran it
    pair: str
    controls: dict           # the settings Compare ran every method with (their control values)
    rows: list[Measured]
    busy: str = ""           # "measured on a busy machine: ..." (compare.py), "" when it was not
    prompt: str = ""         # its first PROMPT_KEPT_CHARS characters
    prompt_key: str = ""     # prompt_key of the whole prompt ("": a Compare kept before prompts were)
    load: str = ""           # "load 1.2 on 2 threads": the highest load average around its rounds
    rounds: int = 0
    seconds: float = 0.0     # how long the whole Compare took (0: kept before it was recorded)

    def row(self, method: str) -> Measured | None:
        return next((r for r in self.rows if r.method == method), None)

    def fastest(self) -> tuple[Measured, bool] | None:
        """The fastest row (by its ratio against ar where there are ratios) and whether it is a clear winner (its
        range above every other row's, on a machine that was not busy: load that comes and goes widens every range
        and can still favour one method). A row timed once is compared by its one value."""
        rows = [r for r in self.rows if r.method == "ar" or r.ratio is not None] if self.row("ar") else self.rows
        if not rows:
            return None
        best = max(rows, key=lambda r: r.speed)
        return best, not self.busy and all(r.span[1] < best.span[0] for r in rows if r is not best)

    def ran(self, method: str, controls: dict) -> bool:
        """This Compare ran `method` with these control values: every option the method reads, and the budget."""
        names = [name for name, option in OPTIONS.items()
                 if option.read_by(method) and name != "method"] + list(RUN_CONTROLS)
        return self.row(method) is not None and all(str(self.controls.get(n)) == str(controls.get(n))
                                                    for n in names)

    def said(self) -> str:
        """When, where and under what load, in a few words: "Compare at 2026-12-05 03:10 UTC, load 1.2 on 2
        threads"."""
        return f"Compare at {self.measured_at} UTC" + (f", {self.load}" if self.load else "")


def compare_file(machine: str, pair: str) -> Path:
    key = hashlib.sha1(f"{machine}|{pair}".encode()).hexdigest()[:12]
    return cache_dir() / "measured" / f"compare-{key}.json"


def _as_dict(kept: KeptCompare) -> dict:
    return {"measured_at": kept.measured_at, "machine": kept.machine, "pair": kept.pair, "controls": kept.controls,
            "busy": kept.busy, "prompt": kept.prompt, "prompt_key": kept.prompt_key, "load": kept.load,
            "rounds": kept.rounds, "seconds": kept.seconds, "rows": [r.__dict__ for r in kept.rows]}


def _of_dict(obj: dict) -> KeptCompare:
    def number(value):
        return None if value is None else float(value)

    rows = [Measured(str(r["method"]), float(r["tokens_per_s"]), float(r["low"]), float(r["high"]),
                     number(r.get("ratio")), number(r.get("ratio_low")), number(r.get("ratio_high")),
                     int(r.get("pairs", 0)))
            for r in obj["rows"]]
    return KeptCompare(str(obj["measured_at"]), str(obj["machine"]), str(obj["pair"]), dict(obj["controls"]), rows,
                       busy=str(obj.get("busy", "")), prompt=str(obj.get("prompt", "")),
                       prompt_key=str(obj.get("prompt_key", "")), load=str(obj.get("load", "")),
                       rounds=int(obj.get("rounds", 0)), seconds=float(obj.get("seconds", 0.0)))


def keep_compare(kept: KeptCompare) -> None:
    """Kept first among this machine's and pair's Compares, replacing one of the same settings and prompt, at most
    KEPT_COMPARES; written atomically (a rename). A cache that cannot be written keeps nothing, silently."""
    path = compare_file(kept.machine, kept.pair)
    older = [k for k in read_compares(kept.machine, kept.pair)
             if not (k.prompt_key == kept.prompt_key and k.controls == kept.controls)]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        partial.write_text(json.dumps({"compares": [_as_dict(k) for k in [kept, *older][:KEPT_COMPARES]]},
                                      default=str))
        partial.replace(path)
    except OSError:
        pass


@functools.lru_cache(maxsize=8)
def _read(path: Path, _changed: tuple[int, int]) -> tuple[KeptCompare, ...]:
    """The Compares in `path`, read once per version of the file (`_changed`: its mtime and size), so that a Step
    that quotes one reads no file."""
    obj = json.loads(path.read_text(encoding="utf-8"))
    entries = obj["compares"] if isinstance(obj, dict) and "compares" in obj else [obj]
    return tuple(_of_dict(entry) for entry in entries)


def read_compares(machine: str, pair: str) -> list[KeptCompare]:
    """This machine's kept Compares of this pair, newest first ([] when none are kept, or unreadable)."""
    path = compare_file(machine, pair)
    try:
        seen = path.stat()
        if seen.st_size > MAX_KEPT_BYTES:
            return []
        return list(_read(path, (seen.st_mtime_ns, seen.st_size)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def read_compare(machine: str, pair: str) -> KeptCompare | None:
    """This machine's newest kept Compare of this pair, or None."""
    kept = read_compares(machine, pair)
    return kept[0] if kept else None


def compare_for(machine: str, pair: str, method: str, controls: dict, prompt: str) -> KeptCompare | None:
    """The newest kept Compare on this machine and pair that ran `method` with these control values on this
    prompt and measured its ratio against ar, or None: the one measurement a run of those settings may quote."""
    key = prompt_key(prompt)
    return next((k for k in read_compares(machine, pair)
                 if k.prompt_key == key and k.ran(method, controls)
                 and (method == "ar" or k.row(method).ratio is not None)), None)


def now_utc() -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime())


def measured_recipe(kept: KeptCompare, values: dict) -> Measured | None:
    """The kept row that ran exactly this recipe's settings (every option its method reads), or None."""
    method = values.get("method")
    row = kept.row(method)
    if row is None:
        return None
    for name, value in values.items():
        if name == "method" or not OPTIONS[name].read_by(method):
            continue
        if str(OPTIONS[name].record(value)) != str(kept.controls.get(name)):
            return None
    return row


def recipe_here(kept: list[KeptCompare], values: dict) -> tuple[KeptCompare, Measured] | None:
    """The newest kept Compare that ran this recipe's settings with a ratio against ar, and its row; or None."""
    for compare in kept:
        row = measured_recipe(compare, values)
        if row is not None and (row.method == "ar" or row.ratio is not None):
            return compare, row
    return None


def fastest_recipe_here(kept: KeptCompare | None, recipes: dict[str, dict]) -> str | None:
    """The label of the recipe the kept Compare ran that was the clear winner of it, if any."""
    if kept is None or kept.fastest() is None:
        return None
    best, clear = kept.fastest()
    if not clear:
        return None
    return next((label for label, values in recipes.items() if measured_recipe(kept, values) is best), None)

