"""A measurement of this device's costs in parts, as data: each calibration round one part, then each bigger target
(Learn → Where would it pay?) one part; `calibrate_context` and `where_costs` run every part at once.

Why parts: the page says up front how long a measurement will take (from the last one here), then how far it has
got, and Stop ends it between two parts with nothing kept. A quiet measurement of the embedded pair takes a second
or two; with the bigger targets, or on a busy machine, it took 22-112 s. Each part is one model call from a
`Measuring` to the next (state is data: a part may run in another process, as on ZeroGPU), and only a table's last
part keeps it, by cost.settle's rule (a busy measurement never replaces quiet kept costs).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from ...device_info import device_line, emulated
from ..inputs import Settings
from ..pairs import PairCache
from .cost import (
    AR_STEP,
    CALIBRATION_CONTEXT,
    CALIBRATION_ROUNDS,
    CALIBRATION_ROWS,
    Conditions,
    MeasuredCosts,
    costs_file,
    medians,
    read_kept_costs,
    settle,
    time_rounds,
)
from .targets import BIGGER_TARGETS, TargetShape, draft_shape_of, measure_targets, target_costs_file


@dataclass
class Measuring:
    """This device's costs for one pair, being measured: what is settled so far and what is left to measure."""

    context_ids: list[int]
    device: MeasuredCosts | None = None       # settled (kept, or measured and kept): the pair's own costs
    kept: MeasuredCosts | None = None         # what was kept before this measurement (None: nothing)
    rounds_left: int = 0                      # calibration rounds still to take
    runs: dict[str, dict[int, list[float]]] = field(default_factory=dict)  # the rounds' seconds so far
    conditions: list[Conditions] = field(default_factory=list)
    seconds: float = 0.0                      # the calibration's parts so far, from call to return
    emulated: bool = False                    # a GPU emulated on this CPU: measured, never kept
    targets: dict[str, MeasuredCosts] = field(default_factory=dict)  # the bigger targets settled so far
    kept_targets: dict[str, MeasuredCosts | None] = field(default_factory=dict)
    targets_asked: tuple[str, ...] = ()       # bigger targets this measurement takes, by name
    targets_left: tuple[str, ...] = ()        # those still to measure
    targets_missing: str = ""                 # why no bigger target is measured here
    draft_shape: TargetShape | None = None    # the pair's draft (Where would it pay?'s modelled draft share)

    @property
    def complete(self) -> bool:
        return self.rounds_left == 0 and not self.targets_left

    def how_long(self) -> str:
        """Said before the first part: what will be measured and how long it took here the last time, or that
        nothing earlier times it ("" when nothing is left to measure)."""
        what, earlier = [], []
        if self.rounds_left:
            what.append(f"this pair's costs ({self.rounds_left} rounds)")
            earlier.append(_seconds_of(self.kept))
        if self.targets_left:
            what.append(f"{len(self.targets_left)} bigger target{'s' * (len(self.targets_left) > 1)} "
                        f"({', '.join(self.targets_left)})")
            earlier += [_seconds_of(self.kept_targets.get(name)) for name in self.targets_left]
        if not what:
            return ""
        if any(seconds is None for seconds in earlier):
            return f"Measuring {' and '.join(what)}: the first measurement here, so no earlier one to time it by."
        return (f"Measuring {' and '.join(what)}: about {max(1, round(sum(earlier)))} s (as long as the last "
                "measurement here took).")

    def progress(self) -> str:
        """How far it has got, in one line."""
        if self.rounds_left:
            done = CALIBRATION_ROUNDS - self.rounds_left
            return f"Measuring this pair's costs: round {done} of {CALIBRATION_ROUNDS} done."
        done = len(self.targets_asked) - len(self.targets_left)
        return (f"Measuring the bigger targets: {done} of {len(self.targets_asked)} done, next "
                f"{self.targets_left[0]}." if self.targets_left else "Measured.")


def _seconds_of(costs: MeasuredCosts | None) -> float | None:
    """How long a kept measurement took: its own record, else its rounds' wall time (kept before it was recorded)."""
    if costs is None:
        return None
    if costs.seconds > 0:
        return costs.seconds
    return costs.conditions.wall_s if costs.conditions is not None and costs.conditions.wall_s > 0 else None


def start_measuring(pairs: PairCache, settings: Settings, context_ids: list[int], again: bool = False,
                    bigger_targets: bool = False) -> Measuring:
    """What this device's costs for the settings' pair need: nothing where kept costs stand (kept once per device
    and pair, no step has contradicted them since, not `again`), else CALIBRATION_ROUNDS rounds behind
    `context_ids` (calibration_context); with `bigger_targets`, likewise each bigger target's (on a CPU)."""
    pair = pairs.get(settings)
    under_emulation = emulated(pair.device)  # its times are this CPU's under a GPU's name: never kept, never read
    kept = None if under_emulation else read_kept_costs(costs_file(pair))
    stands = kept is not None and not kept.contradicted and not again
    measuring = Measuring(list(context_ids)[-CALIBRATION_CONTEXT:], device=kept if stands else None, kept=kept,
                          rounds_left=0 if stands else CALIBRATION_ROUNDS, emulated=under_emulation)
    if not bigger_targets:
        return measuring
    measuring.draft_shape = draft_shape_of(pair)
    if pair.device.type != "cpu":
        measuring.targets_missing = f"the models run on {pair.device.type}, and the block kernels are a CPU's"
        return measuring
    measuring.kept_targets = {s.name: read_kept_costs(target_costs_file(s)) for s in BIGGER_TARGETS}
    measuring.targets = {name: c for name, c in measuring.kept_targets.items()
                         if c is not None and not c.contradicted and not again}
    measuring.targets_asked = measuring.targets_left = tuple(s.name for s in BIGGER_TARGETS
                                                             if s.name not in measuring.targets)
    return measuring


def measure_part(pairs: PairCache, settings: Settings, measuring: Measuring) -> Measuring:
    """The next part: one calibration round (the last settles the pair's costs), else the next bigger target."""
    started = time.perf_counter()
    pair = pairs.get(settings)
    if measuring.rounds_left:
        draft = pair.default_draft()  # what the default draft kind runs: the draft the Cost model prices
        models = {"target": pair.target, **({"draft": draft} if draft is not None else {})}
        with pairs.lock_for(pair):  # while no other session uses the pair
            runs, conditions = time_rounds(models, measuring.context_ids, rounds=1, ar_step_of="target")
        merged = {name: {n: measuring.runs.get(name, {}).get(n, []) + times for n, times in per_rows.items()}
                  for name, per_rows in runs.items()}
        measuring = replace(measuring, runs=merged, conditions=[*measuring.conditions, conditions],
                            rounds_left=measuring.rounds_left - 1,
                            seconds=measuring.seconds + time.perf_counter() - started)
        return measuring if measuring.rounds_left else replace(measuring, device=_settled_device(pair, measuring))
    if measuring.targets_left:
        name, *left = measuring.targets_left
        shape = next(s for s in BIGGER_TARGETS if s.name == name)
        targets = dict(measuring.targets)
        try:
            with pairs.lock_for(pair):
                measured = measure_targets((shape,))[name]
        except RuntimeError as exc:  # no block kernel here: no bigger target either
            return replace(measuring, targets_left=(), targets_missing=str(exc))
        measured = replace(measured, seconds=time.perf_counter() - started)
        targets[name] = settle(target_costs_file(shape), measuring.kept_targets.get(name), measured)
        return replace(measuring, targets=targets, targets_left=tuple(left))
    return measuring


def _settled_device(pair, measuring: Measuring) -> MeasuredCosts:
    """The pair's costs from the rounds taken, kept by settle's rule (an emulated GPU's never)."""
    timings, kept = medians(measuring.runs), measuring.kept
    models = " and ".join(name for name in measuring.runs if name != AR_STEP)
    measured = MeasuredCosts(
        timings["target"], time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        f"the median of {CALIBRATION_ROUNDS} interleaved rounds of {models} forwards over "
        f"{', '.join(map(str, CALIBRATION_ROWS))} rows behind {len(measuring.context_ids)} tokens of context",
        device_line(pair), conditions=Conditions.merged(measuring.conditions),
        again_because=(f"the costs kept from {kept.measured_at} UTC disagreed with this device's own steps: "
                       f"{kept.contradicted}") if kept is not None and kept.contradicted else "",
        draft_timings=timings.get("draft", {}), ar_step_s=timings[AR_STEP][1], seconds=measuring.seconds,
        draft_kind=pair.default_draft_kind)
    if measuring.emulated:
        return replace(measured, not_kept="the GPU was emulated on this CPU")
    return settle(costs_file(pair), kept, measured)


def measure_all(pairs: PairCache, settings: Settings, context_ids: list[int], again: bool = False,
                bigger_targets: bool = False) -> Measuring:
    """Every part at once (for callers that show no progress)."""
    measuring = start_measuring(pairs, settings, context_ids, again, bigger_targets)
    while not measuring.complete:
        measuring = measure_part(pairs, settings, measuring)
    return measuring


def calibrate_context(pairs: PairCache, settings: Settings, context_ids: list[int],
                      again: bool = False) -> MeasuredCosts:
    """This device's costs for the settings' pair: the kept measurement (once per device and pair), or, when there
    is none, a step has contradicted it since, or `again`, measured now behind `context_ids` and kept by
    cost.settle's rule (a busy measurement never replaces quiet costs; with none, it is kept marked busy, so that
    every view reads this one table; an emulated device's never)."""
    return measure_all(pairs, settings, context_ids, again).device
