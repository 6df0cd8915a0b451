"""Kinds of number a setting can hold: how text or a UI value becomes one, and the one-line problem of a value
outside its range. The options table (options.py) and SamplingConfig (sampling.py) check with the same objects, so a
range is written once."""
from __future__ import annotations

import math


class Int:
    def __init__(self, low: int, high: int | None = None, note: str = "") -> None:
        self.low, self.high, self.note = low, high, note

    def coerce(self, raw, title: str) -> int:
        """3, 3.0 and "3" are fine (sliders send floats, specs send text); 3.5, NaN, inf, True and "x" are not."""
        if isinstance(raw, bool) or raw is None:
            raise ValueError(f"{title} must be a whole number, got {raw!r}")
        if isinstance(raw, float):
            if not math.isfinite(raw) or raw != int(raw):
                raise ValueError(f"{title} must be a whole number, got {raw!r}")
            return int(raw)
        if isinstance(raw, str):
            text = raw.strip()
            try:
                if len(text) > 30:
                    raise ValueError
                return self.coerce(float(text), title) if "." in text or "e" in text.lower() else int(text)
            except (ValueError, OverflowError):
                raise ValueError(f"{title} must be a whole number, got {raw[:30]!r}") from None
        if isinstance(raw, int):
            return raw
        raise ValueError(f"{title} must be a whole number, got a {type(raw).__name__}")

    def problem(self, value, title: str) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{title} must be a whole number, got {value!r}"
        if self.high is None:
            return None if value >= self.low else f"{title} must be at least {self.low}, got {value}"
        if not self.low <= value <= self.high:
            note = f" ({self.note})" if self.note else ""
            return f"{title} must lie in [{self.low}, {self.high}]{note}, got {value}"
        return None

    def bounds(self) -> str:
        return f"{self.low}..{self.high}" if self.high is not None else f">= {self.low}"


class Float:
    def __init__(self, low: float, high: float, open_low: bool = False) -> None:
        self.low, self.high, self.open_low = low, high, open_low

    def coerce(self, raw, title: str) -> float:
        if isinstance(raw, bool) or raw is None or (isinstance(raw, str) and len(raw) > 30):
            raise ValueError(f"{title} must be a number, got {str(raw)[:30]!r}")
        try:
            number = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{title} must be a number, got {str(raw)[:30]!r}") from None
        if not math.isfinite(number):
            raise ValueError(f"{title} must be a finite number, got {raw!r}")
        return number

    def problem(self, value, title: str) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{title} must be a finite number, got {value!r}"
        inside = (self.low < value if self.open_low else self.low <= value) and value <= self.high
        if not inside:
            return f"{title} must lie in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}], got {value}"
        return None

    def bounds(self) -> str:
        return f"{'(' if self.open_low else '['}{self.low:g}, {self.high:g}]"
