"""What a step costs and the speed-up over ar that follows: plain arithmetic on seconds, no model and no device.

A step costs its draft forwards plus one verify forward over `rows` positions; ar pays one single-row target
forward per token. So

    speed-up = tokens per step * t_ar / (t_draft + t_verify(rows))

Why a module of its own, below the tree search and the explorer: the best-tree search scores shapes with these
formulas, and the explorer's cost views (dynasd/explorer/costs/cost.py) fill them with this device's measured
seconds; both read the one formula. Tests pin them on hand-made numbers.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepCosts:
    """Seconds on one device: one ar step, the verify forward as a line in its rows, and a draft forward: one
    figure (a run's own average), or where it was measured over several row counts those timings."""

    ar_s: float                 # one single-row target forward (an ar step)
    verify_base_s: float        # t_verify(rows) = verify_base_s + verify_per_row_s * rows
    verify_per_row_s: float
    draft_per_forward_s: float  # one draft forward (one tree level), as the run's own forwards averaged
    draft_timings: tuple[tuple[int, float], ...] = ()  # (rows, seconds) of one draft forward, where measured
    verify_floor_s: float = 0.0  # a one-row forward timed as a verify runs (after other forwards); 0: ar_s

    def verify_s(self, rows: int) -> float:
        """On the line, and never below a one-row verify (`verify_floor_s`, else one ar step): a line fitted over
        1..64 rows passes under its few-row points (here a 2-row verify read 0.8 of a one-row forward on it), and a
        forward over more rows costs no less. Why a floor of its own: an ar step, timed after ar steps, runs warmer
        than a verify, which follows a step's draft forwards."""
        return max(self.verify_base_s + self.verify_per_row_s * rows, self.verify_floor_s or self.ar_s)

    def step_s(self, rows: int, draft_forwards: int) -> float:
        return self.draft_per_forward_s * draft_forwards + self.verify_s(rows)

    def draft_s(self, rows: int) -> float:
        """One draft forward over `rows` rows: read on the measured timings (nearest_forward_s), else the run's own
        average forward."""
        if not self.draft_timings:
            return self.draft_per_forward_s
        return nearest_forward_s(dict(self.draft_timings), rows)

    def tree_draft_s(self, level_sizes: list[int]) -> float:
        """The draft forwards of a static tree with `level_sizes` nodes per level: the first reads the root, each
        further one the level above the one it drafts (the last level is drafted, never read). Why by rows: the
        draft forward of a wide level costs several times a chain's (a 16-row level ~3x a one-row one here), so
        one average figure would price a chain like the tree it was measured on."""
        return sum(self.draft_s(rows) for rows in [1, *level_sizes[:-1]])


def kept_forward_s(timings: dict[int, float], rows: float) -> float | None:
    """The kept forward time over `rows` rows, read on the line between the measured row counts around it; None
    outside the measured row counts."""
    measured = sorted(timings)
    if not measured or not measured[0] <= rows <= measured[-1]:
        return None
    below = max(r for r in measured if r <= rows)
    above = min(r for r in measured if r >= rows)
    if above == below:
        return timings[below]
    return timings[below] + (timings[above] - timings[below]) * (rows - below) / (above - below)


def nearest_forward_s(timings: dict[int, float], rows: float) -> float:
    """kept_forward_s with `rows` outside the measured row counts read at the nearest one (a draft level of more
    rows than were timed: priced as the most timed, not left unpriced)."""
    measured = sorted(timings)
    return kept_forward_s(timings, min(max(rows, measured[0]), measured[-1]))


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """The (intercept, slope) of a cost line through forward times `ys` over row counts `xs`: least squares on the
    times made non-decreasing in the rows (a forward over more rows never costs less: a smaller time after a larger
    one is noise, read as the larger), with a base and a per-row cost that are never negative (a negative base,
    which load on the few-row forwards gave, is refitted through zero; a falling line is flat at the mean). A single
    distinct x gives a flat line through the mean."""
    if not xs or len(xs) != len(ys):
        raise ValueError("fit_line needs as many y values as x values, at least one")
    pairs = sorted(zip(xs, ys))
    xs, ys, highest = [x for x, _ in pairs], [], float("-inf")
    for _, y in pairs:
        highest = max(highest, y)
        ys.append(highest)
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return mean_y, 0.0
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread
    base = mean_y - slope * mean_x
    if base < 0:  # through zero: the least-squares slope of y = slope * x
        return 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return base, slope


def expected_speedup(tokens_per_step: float, step_s: float, ar_s: float) -> float:
    """Tokens per step, each of which would have cost ar one ar_s, over the seconds the step took."""
    if step_s <= 0 or ar_s <= 0:
        raise ValueError("step and ar times must be positive")
    return tokens_per_step * ar_s / step_s


def chain_tokens_per_step(acceptance: float, depth: int) -> float:
    """Expected tokens a step commits on a chain of `depth` candidates each accepted with probability
    `acceptance` (independently): 1 + a + a^2 + ... + a^depth (the accepted prefix plus the bonus/correction)."""
    if not 0.0 <= acceptance <= 1.0 or depth < 0:
        raise ValueError("acceptance must lie in [0, 1] and depth be non-negative")
    return sum(acceptance ** i for i in range(depth + 1))


def break_even_acceptance(depth: int, step_s: float, ar_s: float, tolerance: float = 1e-6) -> float | None:
    """The acceptance at which a depth-`depth` chain with this step cost matches ar; None if even acceptance 1
    does not pay (the step costs more than depth + 1 ar steps)."""
    needed = step_s / ar_s
    if needed <= 1.0:
        return 0.0
    if chain_tokens_per_step(1.0, depth) < needed:
        return None
    low, high = 0.0, 1.0
    while high - low > tolerance:  # tokens per step grows with acceptance: bisect
        mid = (low + high) / 2
        low, high = (mid, high) if chain_tokens_per_step(mid, depth) < needed else (low, mid)
    return high


def break_even_row_cost(tokens_per_step: float, rows: int, draft_s: float, verify_base_s: float,
                        ar_s: float) -> float | None:
    """The per-row verify cost at which this step shape matches ar (None: the draft alone already costs more)."""
    budget = tokens_per_step * ar_s - draft_s - verify_base_s
    if budget <= 0 or rows <= 0:
        return None
    return budget / rows
