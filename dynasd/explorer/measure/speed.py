"""A run's speed figures, in one place. Every view that speaks of speed (the start line, Summary, Learn → Cost
model, Rows and batches, Where would it pay?, the Recipe menu) reads them from here, and each figure is one of
three kinds, named as such wherever it shows:

- **measured**: Compare's ratio against ar for the run's method, settings and prompt on this machine
  (measured_here.py keeps it; compare.py pairs the method's chunks with ar's in the same rounds), with its range,
  when and under what load (`ComparedSpeedup`). It is the only speed figure called measured;
- **expected**: the cost model's, from this device's measured forward costs and the run's own tokens and rows per
  step (`RunSpeed.expected`); Rows and batches and Where would it pay? carry the same step cost further, so each
  of them equals this one for this run on this device;
- **this run as it happened**: the run's own tokens / s (`AsItHappened`), its steps timed as they ran, in the
  page's Step and Run, between and during its redraws. Nothing is compared with it.

Why: a page that computed speed in several places showed five absolute tokens / s for one run and called three
different speed-ups measured (its own steps against a calibrated ar step, the cost model's, Compare's). Absolute
tokens / s move 15% between two quiet runs and 3x while the page draws on the same cores; a ratio against ar timed
side by side does not. So ratios lead, tokens / s follow, and where the model and the measurement differ beyond the
measurement's range, `RunSpeed.why_they_differ` says why in one sentence, with the step times that explain it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...device_info import machine_line, shown_device
from ...speed.step_cost import StepCosts, chain_tokens_per_step, expected_speedup
from ...trace import RunTrace
from ..costs.cost import MeasuredCosts, RunShape, cost_numbers, costs_from, draft_forward_s, run_shape
from .measured_here import KeptCompare, compare_for

CURVE_POINTS = 41  # acceptance 0, 0.025, ..., 1 on the cost model's chart


@dataclass(frozen=True)
class ComparedSpeedup:
    """Compare's measurement of one method against ar on this machine, with the run's settings and prompt: its
    chunks paired with ar's in the same rounds (compare.py: paired_ratio)."""

    ratio: float
    low: float
    high: float
    pairs: int
    measured_at: str
    load: str                 # "load 1.2 on 2 threads"
    busy: str = ""            # "measured on a busy machine: ..." when it was
    tokens_per_s: float = 0.0
    ar_tokens_per_s: float = 0.0

    @classmethod
    def of(cls, kept: KeptCompare, method: str) -> "ComparedSpeedup | None":
        row, ar = kept.row(method), kept.row("ar")
        if row is None or row.ratio is None or row.ratio_low is None or row.ratio_high is None:
            return None
        return cls(row.ratio, row.ratio_low, row.ratio_high, row.pairs, kept.measured_at, kept.load, kept.busy,
                   row.tokens_per_s, ar.tokens_per_s if ar else 0.0)

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def short(self) -> str:
        """"0.13× ar (0.12–0.14), measured by Compare"."""
        return f"{self.ratio:.2f}× ar ({self.low:.2f}–{self.high:.2f}), measured by Compare"

    def said(self) -> str:
        """The ratio with its range, when and the load: how every view quotes it."""
        return (f"**{self.ratio:.2f}× ar, measured by Compare** ({self.low:.2f}–{self.high:.2f} over {self.pairs} "
                f"paired rounds with ar; {self.measured_at} UTC, {self.load}"
                + (f"; {self.busy}" if self.busy else "") + ")")


@dataclass(frozen=True)
class AsItHappened:
    """A run's own tokens / s over its steps on show: its steps' own time (draft, verify, accept; never the
    prefill), taken as the page asked for them."""

    tokens_per_s: float
    tokens: int
    steps: int
    seconds: float

    def said(self) -> str:
        return (f"{self.tokens_per_s:.1f} tokens/s, this run as it happened ({self.tokens} tokens in "
                f"{self.steps} steps, timed while this page drew each step on the same cores: not a comparison)")


def as_it_happened(run: RunTrace, upto: int | None = None) -> AsItHappened:
    """The run's own rate over its first `upto + 1` steps (all of them when None): Summary's and the cost view's."""
    steps = run.steps if upto is None else run.steps[: upto + 1]
    tokens = sum(len(s.committed) for s in steps)
    seconds = sum(s.seconds for s in steps)
    return AsItHappened(tokens / seconds if seconds > 0 else 0.0, tokens, len(steps), seconds)


def compared_here(run: RunTrace, controls: dict, pair_key: str) -> ComparedSpeedup | None:
    """What Compare measured on this machine for the run's method with these control values on the run's
    prompt, or None (ar itself has no speed-up to quote)."""
    if run.method == "ar":
        return None
    kept = compare_for(machine_line(), pair_key, run.method, controls, run.prompt)
    return ComparedSpeedup.of(kept, run.method) if kept is not None else None


@dataclass(frozen=True)
class RunSpeed:
    """Every speed figure of one run on this device, computed once: `compared` (measured, or None), `expected`
    (the cost model's, from this device's measured costs, or modelled from the run's own verify times where they
    could not be measured) and `happened` (the run's own rate)."""

    method: str
    shape: RunShape
    costs: StepCosts
    costs_said: str                  # when and how this device's costs were measured; "" when modelled
    again_said: str                  # why they were measured again, in one line ("" when they were not)
    draft_said: str                  # where a draft forward's seconds come from (cost.draft_forward_s)
    ar_said: str                     # how the ar step was timed
    elsewhere: str                   # the machine the run's times were taken on, when not this one
    rows: int
    draft_forwards: int
    step_s: float                    # the model's step: draft forwards + one verify over `rows`
    free_rows_s: float               # the same step with verify rows free (one ar step)
    expected: float
    expected_free_rows: float
    own_step_s: float                # the run's own mean warm step (tokens per step / tokens per s)
    happened: AsItHappened
    break_even_acceptance: float | None
    break_even_row_cost: float | None
    scale: float                     # Compare's ratio / expected where the model over-promises, else 1
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

    @property
    def agrees(self) -> bool | None:
        """Whether the model's expectation lies within Compare's range (None: nothing measured to agree with)."""
        return None if self.compared is None else self.compared.contains(self.expected)

    def expected_said(self) -> str:
        return f"**{self.expected:.2f}× (expected)**"

    def why_they_differ(self) -> str:
        """Compare's measurement first (or that there is none), then the model's expectation, and where the two
        differ beyond the measurement's range one sentence on why, from the step times that explain it."""
        compared = self.compared
        if compared is None:
            return (f"**Not measured yet**: Compare measures this method against ar on this prompt with these "
                    f"settings (paired round by round); the cost model expects {self.expected_said()} from the "
                    "draft and verify forwards alone.")
        text = f"This run's method: {compared.said()}. The cost model: {self.expected_said()}"
        if compared.contains(self.expected):
            return text + ", within Compare's range."
        ms = 1000.0
        bookkeeping = self.shape.overhead_s
        ar_step = 1.0 / compared.ar_tokens_per_s if compared.ar_tokens_per_s > 0 else 0.0
        direction = "above" if self.expected > compared.high else "below"
        # The step to set beside the model's is Compare's (this run's tokens a step at Compare's tokens / s): this
        # run's own steps were timed as the page asked for them, while it drew (AsItHappened), not a measurement.
        if compared.tokens_per_s > 0:
            measured_step, whose = self.shape.tokens_per_step / compared.tokens_per_s, "Compare's steps of this method"
            beyond = "a verify's own work beyond its forward, a longer context, load"
        else:
            measured_step, whose = self.own_step_s, "this run's steps (timed while the page drew them)"
            beyond = "the page's drawing, a longer context, load"
        other = max(measured_step - self.step_s - bookkeeping, 0.0)
        why = (f", {direction} Compare's range: the model counts a step as its draft and verify forwards, "
               f"{self.step_s * ms:.1f} ms, where {whose} took {measured_step * ms:.1f} ms "
               f"({bookkeeping * ms:.1f} ms of walk, commit and record"
               + (f", {other * ms:.1f} ms more: {beyond}" if other * ms >= 0.05 else "") + ")")
        if ar_step > 0:
            why += (f", and an ar step as one forward, {self.costs.ar_s * ms:.2f} ms, where Compare's ar steps took "
                    f"{ar_step * ms:.2f} ms")
        if self.elsewhere:
            why += f"; this run's times were taken on another machine ({self.elsewhere})"
        return text + why + "."


def run_speed(run: RunTrace, measured: MeasuredCosts | None, compared: ComparedSpeedup | None = None) -> RunSpeed:
    """The run's speed figures on this device's measured costs (`measured`; None: modelled from the run's own
    verify times) and Compare's measurement of its method (`compared`, compared_here)."""
    shape = run_shape(run)
    draft_here = draft_forward_s(measured, shape.draft_rows, shape.draft_kind)
    costs = costs_from(shape, measured.timings if measured else None, draft_here,
                       measured.draft_timings if draft_here else None, measured.ar_step_s if measured else None)
    n = cost_numbers(shape, costs)
    elsewhere = run_elsewhere(run, measured)
    alphas = tuple(i / (CURVE_POINTS - 1) for i in range(CURVE_POINTS))

    def curve(step_s: float) -> tuple[float, ...]:
        return tuple(round(expected_speedup(chain_tokens_per_step(a, shape.depth), step_s, costs.ar_s), 4)
                     for a in alphas)

    # the model over-promises where Compare's whole range lies below it: the best-tree chart is scaled down to it
    over_promises = compared is not None and compared.high < n["predicted"]
    return RunSpeed(
        method=run.method, shape=shape, costs=costs, costs_said=measured.said() if measured else "",
        again_said=measured.again_said() if measured else "",
        draft_said=(f"measured here beside the target, over {shape.draft_rows:.1f} rows" if draft_here
                    else "this run's own"),
        ar_said=("a one-row target forward after one-row ones, as ar runs them" if measured and measured.ar_step_s
                 else "a one-row target forward"),
        elsewhere=elsewhere, rows=n["rows"], draft_forwards=n["draft_forwards"], step_s=n["step_s"],
        free_rows_s=n["free_rows_s"], expected=n["predicted"], expected_free_rows=n["free_rows"],
        own_step_s=shape.tokens_per_step / shape.tokens_per_s if shape.tokens_per_s > 0 else 0.0,
        happened=as_it_happened(run),
        break_even_acceptance=n["break_even_acceptance"], break_even_row_cost=n["break_even_row_cost"],
        scale=compared.ratio / n["predicted"] if over_promises else 1.0, compared=compared,
        curve_acceptance=alphas, curve_here=curve(n["step_s"]), curve_free_rows=curve(n["free_rows_s"]))


def run_elsewhere(run: RunTrace, measured: MeasuredCosts | None) -> str:
    """The machine a run's own times were taken on, when a trace says it was not the one measured here."""
    if measured is None or not run.device or run.device == measured.device:
        return ""
    return shown_device(run.device)


def speed_here(run: RunTrace, measured: MeasuredCosts | None, controls: dict, pair_key: str) -> RunSpeed:
    """`run_speed` with what Compare measured on this machine for the run's method, settings and prompt."""
    return run_speed(run, measured, compared_here(run, controls, pair_key))
