"""A run's speed figures, in one place: its own step timings, this device's measured costs, and what Compare
measured on this machine. Every view that speaks of speed (Learn → Cost model, Rows and batches, Where would it
pay?, Compare's verdict, the Recipe menu's star) reads them from here.

Why one owner: a page that computes speed in several places shows several speed-ups for one run (0.06x from the
run's wall time against ar's one-row forward, 0.14x from Compare, 0.10x from the cost model) and says nothing of why
they differ. Here a run has exactly one *measured* speed-up against ar (`RunSpeed.measured`: its own steps'
tokens / s against ar's step measured on this device); every other number carries its name ("expected by the cost
model", "measured by Compare on another run of each method") and `why_they_differ` says in one sentence why.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...options import OPTIONS
from ...step_cost import StepCosts, chain_tokens_per_step, expected_speedup
from ...trace import RunTrace
from .cost import MeasuredCosts, RunShape, cost_numbers, costs_from, draft_forward_s, measured_scale, run_shape
from .measured_here import KeptCompare

CURVE_POINTS = 41  # acceptance 0, 0.025, ..., 1 on the cost model's chart


@dataclass(frozen=True)
class ComparedSpeedup:
    """What the last Compare on this machine measured for one method against ar, with the same settings: another
    run of each method, interleaved in chunks of steps (compare.py)."""

    measured_at: str
    method_tokens_per_s: float
    method_range: tuple[float, float]
    ar_tokens_per_s: float
    ar_range: tuple[float, float]
    busy: str = ""            # "measured on a busy machine: ..." when it was

    @property
    def speedup(self) -> float:
        return self.method_tokens_per_s / self.ar_tokens_per_s

    @property
    def within_noise(self) -> bool:
        """The method's range and ar's overlap: that Compare cannot tell them apart."""
        return self.method_range[1] >= self.ar_range[0] and self.ar_range[1] >= self.method_range[0]


@dataclass(frozen=True)
class RunSpeed:
    """Every speed figure of one run on this device, computed once.

    `measured` is the run's one measured speed-up against ar: its warm steps' tokens / s (steps' own time, never
    the prefill) times the seconds of one ar step measured on this device; None when this device's costs could not
    be measured (then nothing here is a measurement against ar) or the run's times were taken on another machine.
    `expected` is the cost model's (draft and verify forwards only). `compared` is Compare's, when one ran here with
    the same settings."""

    method: str
    shape: RunShape
    costs: StepCosts
    costs_said: str                  # when and how this device's costs were measured; "" when modelled
    draft_said: str                  # where a draft forward's seconds come from (cost.draft_forward_s)
    elsewhere: str                   # the machine the run's times were taken on, when not this one
    rows: int
    draft_forwards: int
    step_s: float                    # the model's step: draft forwards + one verify over `rows`
    free_rows_s: float               # the same step with verify rows free (one ar step)
    expected: float
    expected_free_rows: float
    measured: float | None
    measured_step_s: float           # the run's own mean step time (tokens per step / tokens per s)
    break_even_acceptance: float | None
    break_even_row_cost: float | None
    scale: float                     # measured / expected where the measurement fell clearly short, else 1
    compared: ComparedSpeedup | None
    curve_acceptance: tuple[float, ...]
    curve_here: tuple[float, ...]    # expected speed-up of a chain of the run's depth at this step cost
    curve_free_rows: tuple[float, ...]

    @property
    def costs_measured(self) -> bool:
        return bool(self.costs_said)

    @property
    def ar_steps_per_step(self) -> float:
        return self.step_s / self.costs.ar_s

    def why_they_differ(self) -> str:
        """One sentence: the run's measured speed-up, and each other number by its name with why it differs."""
        if self.measured is None:
            why = ("this device's costs could not be measured" if not self.costs_measured
                   else f"this run's times were taken on another machine ({self.elsewhere})")
            return (f"**No measured speed-up for this run** ({why}); the cost model expects **{self.expected:.2f}×**"
                    " from its forwards alone.")
        ms = 1000.0
        bookkeeping = self.shape.overhead_s
        other = max(self.measured_step_s - self.step_s - bookkeeping, 0.0)
        direction = "below" if self.measured < self.expected else "above"
        text = (f"**This run: {self.measured:.2f}× ar, measured** (its own steps against ar's step measured here). "
                f"The cost model's **{self.expected:.2f}× (expected)** counts the draft and verify forwards only, "
                f"{self.step_s * ms:.1f} ms a step, while this run's steps took {self.measured_step_s * ms:.1f} ms: "
                f"{bookkeeping * ms:.1f} ms of walk, commit and record"
                + (f" and {other * ms:.1f} ms more (load, a longer context)" if other * ms >= 0.05 else "")
                + f", hence {direction} it")
        compared = self.compared
        if compared is not None:
            text += (f"; Compare's **{compared.speedup:.2f}× (measured by Compare on another run of each method**, "
                     f"{compared.measured_at} UTC) timed whole runs from the prompt, ar's included, so ar's own "
                     "per-token bookkeeping is in its figure too and the text and the moments of load differ"
                     + (", and its ranges overlap: within its noise" if compared.within_noise else "")
                     + (f"; {compared.busy}" if compared.busy else ""))
        return text + "."


def compared_speedup(kept: KeptCompare | None, method: str, controls: dict) -> ComparedSpeedup | None:
    """The kept Compare's speed-up of `method` over ar, when that Compare ran `method` with these control values
    (every option the method reads, and the temperature); None otherwise."""
    if kept is None or method == "ar":
        return None
    rows = {row.method: row for row in kept.rows}
    if method not in rows or "ar" not in rows or rows["ar"].tokens_per_s <= 0:
        return None
    if any(str(kept.controls.get(name)) != str(controls.get(name)) for name, option in OPTIONS.items()
           if option.read_by(method) or name == "temperature"):
        return None
    own, ar = rows[method], rows["ar"]
    return ComparedSpeedup(kept.measured_at, own.tokens_per_s, (own.low, own.high), ar.tokens_per_s,
                           (ar.low, ar.high), busy=kept.busy)


def run_elsewhere(run: RunTrace, measured: MeasuredCosts | None) -> str:
    """The machine a run's own times were taken on, when a trace says it was not the one measured here."""
    if measured is None or not run.device or run.device == measured.device:
        return ""
    return run.device[:160]


def run_speed(run: RunTrace, measured: MeasuredCosts | None, compared: ComparedSpeedup | None = None) -> RunSpeed:
    """The run's speed figures on this device's measured costs (`measured`; None: modelled from the run's own
    verify times, and then nothing is called measured)."""
    shape = run_shape(run)
    draft_here = draft_forward_s(measured, shape.draft_rows)
    costs = costs_from(shape, measured.timings if measured else None, draft_here)
    n = cost_numbers(shape, costs)
    elsewhere = run_elsewhere(run, measured)
    can_measure = measured is not None and not elsewhere
    measured_speedup = n["measured"] if can_measure else None
    alphas = tuple(i / (CURVE_POINTS - 1) for i in range(CURVE_POINTS))

    def curve(step_s: float) -> tuple[float, ...]:
        return tuple(round(expected_speedup(chain_tokens_per_step(a, shape.depth), step_s, costs.ar_s), 4)
                     for a in alphas)

    return RunSpeed(
        method=run.method, shape=shape, costs=costs, costs_said=measured.said() if measured else "",
        draft_said=(f"measured here beside the target, over {shape.draft_rows:.1f} rows" if draft_here
                    else "this run's own"),
        elsewhere=elsewhere, rows=n["rows"], draft_forwards=n["draft_forwards"], step_s=n["step_s"],
        free_rows_s=n["free_rows_s"], expected=n["predicted"], expected_free_rows=n["free_rows"],
        measured=measured_speedup,
        measured_step_s=shape.tokens_per_step / shape.tokens_per_s if shape.tokens_per_s > 0 else 0.0,
        break_even_acceptance=n["break_even_acceptance"], break_even_row_cost=n["break_even_row_cost"],
        scale=measured_scale(n) if can_measure else 1.0, compared=compared, curve_acceptance=alphas,
        curve_here=curve(n["step_s"]), curve_free_rows=curve(n["free_rows_s"]))


def speed_here(run: RunTrace, measured: MeasuredCosts | None, controls: dict, pair_key: str) -> RunSpeed:
    """`run_speed` with what the last Compare of this pair on this machine measured for the run's method (when it
    ran it with these control values)."""
    from ...device_info import machine_line
    from .measured_here import read_compare

    return run_speed(run, measured, compared_speedup(read_compare(machine_line(), pair_key), run.method, controls))
