"""Why verifying many tokens costs about one step, and where that stops: the measured forward time against its
rows on this device (the cost model's calibration, cost.py) read as memory-bound or compute-bound in one sentence,
and a MODEL of the speed-up against a server's batch size.

Why: a forward reads every weight once whatever its rows; while reading dominates (memory-bound), extra rows are
nearly free and a tree is verified for about the price of one token. Once the rows' arithmetic dominates
(compute-bound: a CPU early, a GPU only at hundreds of rows), every row costs. A server that batches B sequences
is already at B rows per ar step, so speculation's extra rows (B x R) push it into the compute-bound regime: the
speed-up shrinks with B and ends below 1.

The batch model is arithmetic on the cost model's step costs (speed.py: the calibrated line t(n) = a + b n over
n rows in one forward, and the measured one-row forward t_ar), not a measurement:
  speed-up(B) = tokens_per_step x (t_ar + b (B - 1)) / (draft_s + t(B x rows))
with the run's own tokens per step and verify rows, and its draft time taken as independent of B (a small draft
is memory-bound). ar's batch of B rows is anchored at the measured one-row forward, so that for one sequence the
model is exactly the cost model's expected speed-up (one run, one expectation); past the calibrated rows it
extrapolates the line.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...speed.step_cost import StepCosts, fit_line
from ..costs.cost import RunShape
from .speed import ComparedSpeedup, run_speed

MEMORY_BOUND_RATIO = 1.5  # rows up to the last count whose forward took under 1.5x one row's: "memory-bound"
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class RowCost:
    """The calibrated line t(n) = base_s + per_row_s * n and the measurements it came from."""

    calibration: dict[int, float]
    base_s: float
    per_row_s: float

    def forward_s(self, rows: float) -> float:
        return self.base_s + self.per_row_s * rows


def row_cost(calibration: dict[int, float]) -> RowCost:
    if not calibration or 1 not in calibration:
        raise ValueError("the calibration must include one row")
    rows = sorted(calibration)
    base, per_row = fit_line([float(r) for r in rows], [calibration[r] for r in rows])
    return RowCost(dict(calibration), max(base, 0.0), max(per_row, 0.0))


def memory_bound_rows(calibration: dict[int, float]) -> int:
    """The largest row count up to which every forward took less than MEMORY_BOUND_RATIO times one row's."""
    one, bound = calibration[1], 1
    for rows in sorted(calibration):
        if calibration[rows] >= MEMORY_BOUND_RATIO * one:
            break
        bound = rows
    return bound


def rows_sentence(calibration: dict[int, float]) -> str:
    """One sentence: what the measurements say about this device."""
    one, rows = calibration[1], sorted(calibration)
    largest = rows[-1]
    middle = max((r for r in rows if r <= 8), default=rows[0])
    bound = memory_bound_rows(calibration)
    ratio = calibration[largest] / one
    if bound >= largest:
        reading = (f"memory-bound over the whole range: reading the weights dominates, so verifying {largest} "
                   "tokens costs about one step")
    elif bound <= 2:
        reading = ("compute-bound almost at once: each row adds its own arithmetic, so every verified token costs "
                   "real time and only a narrow tree pays")
    else:
        reading = (f"memory-bound up to about {bound} rows (reading the weights dominates: rows are nearly free), "
                   "compute-bound beyond (each row adds its own arithmetic)")
    return (f"On this device one target forward over {middle} rows took {calibration[middle] / one:.1f}x the time "
            f"of one row and over {largest} rows {ratio:.1f}x: it is {reading}.")


def batch_speedups(costs: StepCosts, shape: RunShape, batches: tuple[int, ...] = BATCHES) -> list[tuple[int, float]]:
    """The MODEL's speed-up over ar for each batch size (see the module's docstring) on the cost model's step
    costs, whose draft forward is the one measured beside the target where it was (cost.draft_forward_s)."""
    draft_s = costs.draft_per_forward_s * round(shape.draft_forwards)
    rows = max(round(shape.rows), 1)
    return [(b, shape.tokens_per_step * (costs.ar_s + costs.verify_per_row_s * (b - 1))
             / (draft_s + costs.verify_s(b * rows))) for b in batches]


def break_even_batch(points: list[tuple[int, float]]) -> int | None:
    """The smallest batch size at which the modelled speed-up is below 1 (None: it stays above in the range)."""
    return next((b for b, s in points if s < 1.0), None)


def batch_sentence(points: list[tuple[int, float]], shape: RunShape) -> str:
    first, last = points[0], points[-1]
    stop = break_even_batch(points)
    where = ("it is below 1 (slower than ar) already for one sequence" if stop == 1 else
             f"it falls below 1 (slower than ar) from a batch of {stop} sequences" if stop is not None else
             f"it stays above 1 up to a batch of {last[0]}")
    limit = shape.tokens_per_step / max(shape.rows, 1e-9)
    return (f"**Model, not a measurement:** with this run's {shape.tokens_per_step:.2f} tokens and {shape.rows:.1f} "
            f"verify rows per step, the model expects **{first[1]:.2f}× (expected)** for one sequence (the Cost "
            f"model's figure) and **{last[1]:.2f}× (expected)** at a batch of {last[0]}; {where}. At large batches "
            f"every row costs, and it tends to tokens per step / rows = {limit:.2f}.")


def measured_sentence(compared: ComparedSpeedup | None, expected: float) -> str:
    """What Compare measured for one sequence beside the model's figure, or that nothing was measured."""
    if compared is None:
        return ("For one sequence nothing was measured for this method, prompt and settings yet: the Compare tab "
                "measures it against ar.")
    agree = ("within its range" if compared.contains(expected) else
             "outside its range (Learn → Cost model says why)")
    return f"For one sequence: {compared.said()}; the model's {expected:.2f}× (expected) is {agree}."


@dataclass(frozen=True)
class RowsAndBatches:
    """Learn → Rows and batches of one run: the row cost measured on this device, the modelled speed-up at each
    batch size, and the sentences that say both (with when and how the forwards were timed)."""

    cost: RowCost
    points: list[tuple[int, float]]
    text: str


def rows_and_batches(run, measured, compared: ComparedSpeedup | None = None) -> RowsAndBatches:
    """`run`'s tree shape carried to batch sizes at the row cost `measured` here (cost.MeasuredCosts), beside what
    Compare measured for one sequence (`compared`, speed.compared_here). The shape and the step costs come from
    the run's speed figures (speed.py), their one owner."""
    speed = run_speed(run, measured, compared)
    cost = row_cost(measured.timings)
    points = batch_speedups(speed.costs, speed.shape)
    return RowsAndBatches(cost, points, rows_sentence(measured.timings) + f" (Forward times {speed.costs_said}.)\n\n"
                          + batch_sentence(points, speed.shape) + "\n\n" + measured_sentence(compared, speed.expected))
