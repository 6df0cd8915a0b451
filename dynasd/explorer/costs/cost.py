"""What a step costs on this device: the verify calibration, the draft's forwards timed beside it, kept once per
device and pair, and the speed-up the step-cost formulas (dynasd/speed/step_cost.py) give from them.

On a GPU t_verify(rows) stays close to t_ar for dozens of rows (the weights are read once either way), so wide
trees pay. On a CPU every verify row costs real arithmetic, t_verify grows with the tree, and a wide tree can be
slower than ar even when it commits more tokens per step. `time_rounds` is the one function here that runs a model
(measuring.py takes a pair's measurement in parts behind the end of a run's text, `calibration_context`, and keeps
it by `settle`'s rule). A device's measured costs
are kept in the cache folder, once per device and pair, with when and how they were measured: the explorer's cost
view reads them by default, since a model fitted to a run's own few verify sizes can be far off (one ar step read
as 638 ms where it took 93).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ...cache import CachedModel
from ...device_info import device_key
from ...loading.embedded import cache_dir
from ...options import draft_that_ran
from ...origins import DRAFT
from ...speed.step_cost import (
    StepCosts,
    break_even_acceptance,
    break_even_row_cost,
    expected_speedup,
    fit_line,
    kept_forward_s,
    nearest_forward_s,
)
from ...trace import RunTrace, StepTrace


@dataclass(frozen=True)
class RunShape:
    """What a run's own steps say: their average tokens, verify rows, draft forwards and measured times."""

    steps: int
    tokens_per_step: float
    rows: float
    draft_forwards: float
    acceptance: float
    depth: int
    draft_per_forward_s: float | None
    verify_rows: list[int]
    verify_seconds: list[float]
    tokens_per_s: float
    overhead_s: float                   # per step, outside the forwards: the walk, the commit, the trace
    draft_rows: float | None = None     # rows a draft forward reads on average: the parents of the drafted nodes
    draft_kind: str = "tokens"          # whose forwards: the token draft's, or "features" (the feature draft's)
    nodes: float = 0.0                  # candidate nodes a step verified, on average

    @property
    def overhead_per_node_s(self) -> float:
        """The step's work outside the forwards per candidate node: what a tree of another size is charged (the
        walk tests, and the record holds, node by node)."""
        return self.overhead_s / self.nodes if self.nodes > 0 else 0.0


def warm_steps(run: RunTrace) -> list[StepTrace]:
    """The steps a run's averages read: the first is left out when there are others (it pays warm-up)."""
    return run.steps[1:] if len(run.steps) > 1 else run.steps


def run_shape(run: RunTrace) -> RunShape:
    """The averages of a run's warm steps, with the kind of draft whose forwards they are (draft_forward_s reads a
    measured line only for the draft it was measured for)."""
    shape = steps_shape(warm_steps(run), run.summary()["acceptance_rate"])
    return replace(shape, draft_kind=draft_that_ran(run.method, run.config, run.draft_label))


def steps_shape(steps: list[StepTrace], acceptance: float) -> RunShape:
    """The averages of some steps (one run's, or several runs' together: `dynasd best-tree`)."""
    if not steps:
        raise ValueError("the run has no steps yet")
    n = len(steps)
    draft_forwards = sum(s.draft_forwards for s in steps)
    draft_seconds = sum(s.draft_seconds for s in steps)
    rows = [s.root_rows + len(s.nodes) for s in steps]
    seconds = sum(s.seconds for s in steps)
    draft_rows = sum(len({node.parent for node in s.nodes if node.origin == DRAFT.name}) for s in steps)
    return RunShape(
        steps=n, tokens_per_step=sum(len(s.committed) for s in steps) / n, rows=sum(rows) / n,
        draft_forwards=draft_forwards / n, acceptance=acceptance,
        depth=max((s.live_depth for s in steps), default=0),
        draft_per_forward_s=draft_seconds / draft_forwards if draft_forwards else None,
        draft_rows=draft_rows / draft_forwards if draft_forwards and draft_rows else None,
        verify_rows=rows, verify_seconds=[s.verify_seconds for s in steps],
        tokens_per_s=sum(len(s.committed) for s in steps) / seconds if seconds > 0 else 0.0,
        overhead_s=sum(s.accept_seconds for s in steps) / n, nodes=sum(len(s.nodes) for s in steps) / n)


def calibrated_costs(calibration: dict[int, float], ar_step_s: float | None = None) -> StepCosts:
    """The target's side of the step costs from a calibration (rows -> seconds of one target forward): the verify
    line through every measured row count, never below its one-row forward, and the ar step (`ar_step_s` where it
    was timed as ar runs, measure_models' AR_STEP, else that one-row forward); no draft. The one reading of a
    calibration: the Cost model's (costs_from) and Where would it pay?'s row for this device."""
    rows = sorted(calibration)
    base, per_row = fit_line([float(r) for r in rows], [calibration[r] for r in rows])
    return _target_line(base, per_row, calibration.get(1, base + per_row), ar_step_s)


def _target_line(base: float, per_row: float, one_row: float, ar_step_s: float | None) -> StepCosts:
    one_row = max(one_row, 1e-9)
    return StepCosts(ar_s=max(ar_step_s, 1e-9) if ar_step_s else one_row, verify_base_s=base,
                     verify_per_row_s=max(per_row, 0.0), draft_per_forward_s=0.0, verify_floor_s=one_row)


def costs_from(shape: RunShape, calibration: dict[int, float] | None,
               draft_per_forward_s: float | None = None, draft_timings: dict[int, float] | None = None,
               ar_step_s: float | None = None) -> StepCosts:
    """Step costs from a calibration when there is one (calibrated_costs), else from the run's own verify times (the
    line through them; with one row count only, a flat line) and ar = that line at one row. The draft forward:
    `draft_per_forward_s` where it was measured with the calibration (draft_forward_s), else the run's own; and
    with `draft_timings` (rows -> seconds of one draft forward, measured with the calibration) those, read the same
    way, which price trees of other shapes (StepCosts.tree_draft_s)."""
    if calibration:
        target = calibrated_costs(calibration, ar_step_s)
    else:
        base, per_row = fit_line([float(r) for r in shape.verify_rows], shape.verify_seconds)
        target = _target_line(base, per_row, base + per_row, ar_step_s)
    return replace(target, draft_per_forward_s=draft_per_forward_s or shape.draft_per_forward_s or 0.0,
                   draft_timings=tuple(sorted((draft_timings or {}).items())))


def cost_numbers(shape: RunShape, costs: StepCosts) -> dict:
    """Every number the chart and its text show, computed once."""
    rows = max(round(shape.rows), 1)
    draft_forwards = round(shape.draft_forwards)
    step_s = costs.step_s(rows, draft_forwards)
    free_rows_s = costs.draft_per_forward_s * draft_forwards + costs.ar_s
    return dict(
        rows=rows, draft_forwards=draft_forwards, step_s=step_s, free_rows_s=free_rows_s,
        predicted=expected_speedup(shape.tokens_per_step, step_s, costs.ar_s),
        free_rows=expected_speedup(shape.tokens_per_step, free_rows_s, costs.ar_s),
        break_even_acceptance=break_even_acceptance(shape.depth, step_s, costs.ar_s),
        break_even_row_cost=break_even_row_cost(shape.tokens_per_step, rows,
                                                costs.draft_per_forward_s * draft_forwards,
                                                costs.verify_base_s, costs.ar_s))


CALIBRATION_ROWS = (1, 2, 4, 8, 16, 32, 64)
CALIBRATION_CONTEXT = 256  # the run's last tokens the calibration's forwards attend to
# Rounds of a calibration, each timing every row count once in turn: load that comes and goes falls on every row
# count alike instead of on the few measured while it lasted, and the median of 5 outlasts two bad rounds.
CALIBRATION_ROUNDS = 5
# The ar step is timed as ar runs it: a one-row forward after AR_STEP_RUN_IN untimed one-row forwards of the same
# model, enough for its time to settle where ar's own steps run (docs/benchmarks.md, best-tree on the Intel Xeon).
# The sweep's own one-row forward follows the other row counts' widest forwards and reads slower: right for a
# verify, which follows a step's draft forwards, not for ar.
AR_STEP_RUN_IN = 6
AR_STEP = "ar step"  # measure_models' entry for the ar step's timing


@dataclass(frozen=True)
class Conditions:
    """The machine while a measurement ran, recorded beside it: the 1-minute load average (the larger of before
    and after; None where the system has none), the threads the measurement used, and this process's CPU time
    against the wall time it took."""

    load_average: float | None
    threads: int
    cpu_s: float
    wall_s: float
    on_cpu: bool = True
    others: float | None = None  # cores other processes kept busy on average meanwhile (None: not known here)

    def busy_because(self) -> str:
        """Why the machine was too busy for the measurement to stand for this device, or "" when it was not.

        Other processes that kept cores busy while it ran (read from the kernel's counters over exactly its own
        time: a load that started a second before is caught, where the one-minute load average lags behind);
        more runnable threads than the measurement's own (the load average above its threads); a CPU measurement
        whose process ran less than half of its wall time waited for them. (Its CPU time can exceed the wall time:
        torch's threads add up.)"""
        plural = "s" if self.threads != 1 else ""
        if self.others is not None and self.others > OTHERS_BUSY:
            return (f"measured on a busy machine: other processes kept {self.others:.1f} cores busy meanwhile, "
                    f"beside its {self.threads} thread{plural}")
        if self.load_average is not None and self.load_average > self.threads:
            return f"measured on a busy machine: load {self.load_average:.1f} on {self.threads} thread{plural}"
        if self.on_cpu and self.wall_s > 0 and self.cpu_s < 0.5 * self.wall_s:
            return (f"measured on a busy machine: this process ran {self.cpu_s / self.wall_s:.0%} of the "
                    f"{self.wall_s:.2f} s it took, on {self.threads} thread{plural}")
        return ""

    @staticmethod
    def merged(parts: list[Conditions]) -> Conditions:
        """The conditions of a measurement taken in parts (one model call each): the highest load, the times
        added, the other processes' cores averaged over the wall time (unknown where a part did not know)."""
        wall = sum(p.wall_s for p in parts)
        others = None if any(p.others is None for p in parts) or wall <= 0 else \
            sum(p.others * p.wall_s for p in parts) / wall
        loads = [p.load_average for p in parts if p.load_average is not None]
        return Conditions(max(loads) if loads else None, max(p.threads for p in parts), sum(p.cpu_s for p in parts),
                          wall, all(p.on_cpu for p in parts), others)

    def said(self) -> str:
        load = f"load {self.load_average:.1f}" if self.load_average is not None else "load unknown"
        return (f"{load} on {self.threads} thread{'s' if self.threads != 1 else ''}, process CPU "
                f"{self.cpu_s:.2f} s in {self.wall_s:.2f} s")


# Cores other processes may keep busy during a measurement before it counts as busy: a quiet machine's own daemons
# use a few hundredths of a core; one busy loop beside it, a whole core.
OTHERS_BUSY = 0.25


def cpu_counters() -> tuple[float, float] | None:
    """(seconds every CPU of the machine spent busy, seconds this process spent) so far, from /proc (Linux);
    None elsewhere. Two readings give the cores other processes used in between (others_between)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        busy = sum(int(v) for i, v in enumerate(fields[:8]) if i not in (3, 4))  # all but idle and iowait
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return busy / tick, time.process_time()


def others_between(before, after, wall_s: float) -> float | None:
    """The cores other processes kept busy on average between two cpu_counters readings, `wall_s` apart."""
    if before is None or after is None or wall_s <= 0:
        return None
    return max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / wall_s)


def load_average() -> float | None:
    """The machine's 1-minute load average: runnable (and, on Linux, waiting) threads, averaged."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def calibrate(model: torch.nn.Module, context_ids: list[int], rows: tuple[int, ...] = CALIBRATION_ROWS,
              repeats: int = CALIBRATION_ROUNDS) -> dict[int, float]:
    """Median seconds of one target forward over `rows` new positions behind a cached context, per row count:
    the verify forward's cost as a function of its rows, measured on this device and these kernels."""
    return measure_forwards(model, context_ids, rows, repeats)[0]


def measure_forwards(model: torch.nn.Module, context_ids: list[int], rows: tuple[int, ...] = CALIBRATION_ROWS,
                     rounds: int = CALIBRATION_ROUNDS) -> tuple[dict[int, float], Conditions]:
    """`calibrate`'s timings, taken in `rounds` interleaved rounds (each times every row count once), and the
    conditions they were taken in."""
    timings, conditions = measure_models({"target": model}, context_ids, rows, rounds)
    return timings["target"], conditions


def measure_models(models: dict[str, torch.nn.Module], context_ids: list[int],
                   rows: tuple[int, ...] = CALIBRATION_ROWS, rounds: int = CALIBRATION_ROUNDS,
                   load=None, ar_step_of: str | None = None) -> tuple[dict[str, dict[int, float]], Conditions]:
    """Median seconds of one forward over `rows` new positions behind a cached context, per model and row count,
    taken in `rounds` interleaved rounds (time_rounds), and the conditions they were taken in."""
    runs, conditions = time_rounds(models, context_ids, rows, rounds, load, ar_step_of)
    return medians(runs), conditions


def medians(runs: dict[str, dict[int, list[float]]]) -> dict[str, dict[int, float]]:
    """The median of each model's and row count's rounds: load that comes and goes moves a few rounds, not it."""
    return {name: {n: sorted(times)[len(times) // 2] for n, times in per_rows.items()}
            for name, per_rows in runs.items()}


def time_rounds(models: dict[str, torch.nn.Module], context_ids: list[int],
                rows: tuple[int, ...] = CALIBRATION_ROWS, rounds: int = CALIBRATION_ROUNDS,
                load=None, ar_step_of: str | None = None) -> tuple[dict[str, dict[int, list[float]]], Conditions]:
    """The seconds of one forward over `rows` new positions behind a cached context, per model and row count, in
    each of `rounds` interleaved rounds: each round times every model at every row count once, so load that comes
    and goes falls on all of them alike; and the conditions they were taken in (`load`: the load average's
    source, load_average by default). With `ar_step_of` (a model's name) each round also times that model's ar
    step (AR_STEP_RUN_IN), given as the entry AR_STEP: {1: [seconds, ...]}."""
    if not context_ids:
        raise ValueError("calibration needs a context of at least one token")
    load = load or load_average
    cached = {name: CachedModel(model) for name, model in models.items()}
    devices = {c.device.type for c in cached.values()}
    on_cuda = "cuda" in devices
    with torch.inference_mode():
        bases = {}
        for name, model in cached.items():
            model.forward(list(context_ids), [], None, [], keep_logits=1, features=_features(model, len(context_ids)))
            bases[name] = model.cached_len
        token = context_ids[-1]
        masks = {n: torch.tril(torch.ones(n, n, dtype=torch.bool)) for n in {*rows, 1}}

        def forward_s(model: CachedModel, base: int, n: int) -> float:
            """One forward over n new rows behind the cached context, timed, its rows dropped again."""
            if on_cuda:
                torch.cuda.synchronize()
            started = time.perf_counter()
            model.forward([], [token] * n, masks[n], list(range(base, base + n)), keep_logits=n,
                          features=_features(model, n))
            if on_cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - started
            model.keep_path([], base)
            return seconds

        runs: dict[str, dict[int, list[float]]] = {name: {n: [] for n in rows} for name in cached}
        if ar_step_of is not None:
            runs[AR_STEP] = {1: []}
        load_before, cpu_started, wall_started = load(), time.process_time(), time.perf_counter()
        counters_before = cpu_counters()
        for _ in range(rounds):
            for name, model in cached.items():
                for n in rows:
                    runs[name][n].append(forward_s(model, bases[name], n))
                if name == ar_step_of:
                    for _ in range(AR_STEP_RUN_IN):
                        forward_s(model, bases[name], 1)
                    runs[AR_STEP][1].append(forward_s(model, bases[name], 1))
        cpu_s, wall_s = time.process_time() - cpu_started, time.perf_counter() - wall_started
        others = others_between(counters_before, cpu_counters(), wall_s)
    loads = [x for x in (load_before, load()) if x is not None]
    conditions = Conditions(max(loads) if loads else None, torch.get_num_threads(), cpu_s, wall_s,
                            on_cpu=devices == {"cpu"}, others=others)
    return runs, conditions


def _features(model: CachedModel, rows: int) -> torch.Tensor | None:
    """What a feature draft reads beside its tokens (zeros: its cost does not depend on the values); None for
    any other model."""
    if not model.reads_features:
        return None
    return torch.zeros(rows, model.model.config.hidden_size, dtype=model.dtype, device=model.device)


def calibration_context(run: RunTrace) -> list[int]:
    """The token ids a calibration reads behind: the end of the run's own text, at most CALIBRATION_CONTEXT."""
    return (list(run.prompt_ids) + list(run.new_token_ids))[-CALIBRATION_CONTEXT:]


@dataclass(frozen=True)
class MeasuredCosts:
    """A calibration kept for one device and pair: the seconds of one target forward per row count, when and how
    they were measured, on which machine (dynasd/device_info.py) and in what conditions."""

    timings: dict[int, float]
    measured_at: str            # UTC, "2026-12-05 03:10"
    how: str
    device: str
    kept: bool = False          # read back from the cache instead of measured by this call
    not_kept: str = ""          # why a measurement made now was not kept for the next time
    conditions: Conditions | None = None
    contradicted: str = ""      # kept costs a step of this device has since shown wrong (check_kept_costs)
    again_because: str = ""     # why this measurement replaced kept costs
    draft_timings: dict[int, float] = field(default_factory=dict)  # the pair's draft, in the same rounds
    ar_step_s: float | None = None  # the target's ar step, timed as ar runs (AR_STEP_RUN_IN); None: kept before it
    refused: str = ""           # a measurement made now on a busy machine, refused: these kept costs stay
    busy: str = ""              # kept though measured on a busy machine (no quiet costs to keep instead): every view
                                # reads this one table until a quiet measurement replaces it
    draft_kind: str = "tokens"  # whose draft_timings: the pair's default draft's kind when measured
    seconds: float = 0.0        # how long the whole measurement took, models built and contexts read included (0:
                                # not recorded), what the page says the next one will take

    def said(self) -> str:
        """When, how and where, in one sentence for the page; a measurement that replaced kept costs says why in
        one more line (`again_said`)."""
        conditions = f" ({self.conditions.said()})" if self.conditions else ""
        busy = (f" (**{self.busy}**: every view reads this one table until a measurement on a quiet machine "
                "replaces it; tick *measure again* when the machine is quiet)") if self.busy else ""
        return (f"measured on this device{' (kept from earlier)' if self.kept else ''} at {self.measured_at} "
                f"UTC: {self.how}{conditions}; {self.device}" + (f" (not kept: {self.not_kept})"
                                                                  if self.not_kept else "") + busy)

    def again_said(self) -> str:
        """Why these costs replaced the kept ones, or why a new measurement did not, in one line ("" when neither)."""
        if self.refused:
            return f"Kept costs of {self.measured_at} UTC used: {self.refused}."
        return f"Measured again: {self.again_because}." if self.again_because else ""


def costs_file(pair) -> Path:
    """Where one device's and pair's measured costs are kept: the cache folder ($DYNASD_CACHE), under costs/."""
    return cache_dir() / "costs" / f"{device_key(pair)}.json"


def read_kept_costs(path: Path) -> MeasuredCosts | None:
    """A kept measurement, or None when there is none or it cannot be read, or it does not say the conditions it
    was measured in or its ar step (kept before they were recorded: it is then measured again)."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
        timings = {int(rows): float(seconds) for rows, seconds in obj["timings"].items()}
        if not timings or any(not 0 < s < 3600 for s in timings.values()):
            return None
        seen = obj["conditions"]
        conditions = Conditions(None if seen["load_average"] is None else float(seen["load_average"]),
                                int(seen["threads"]), float(seen["cpu_s"]), float(seen["wall_s"]),
                                bool(seen.get("on_cpu", True)),
                                None if seen.get("others") is None else float(seen["others"]))
        draft = {int(rows): float(seconds) for rows, seconds in obj.get("draft_timings", {}).items()}
        if any(not 0 < s < 3600 for s in draft.values()):
            return None
        ar_step = obj["ar_step_s"]  # absent: kept before the ar step was timed apart, so measured again
        # timed after another run-in: measured again as ar runs now
        if ar_step is not None and (not 0 < float(ar_step) < 3600 or obj.get("ar_step_run_in") != AR_STEP_RUN_IN):
            return None
        return MeasuredCosts(timings, str(obj["measured_at"]), str(obj["how"]), str(obj["device"]), kept=True,
                             conditions=conditions, contradicted=str(obj.get("contradicted", "")),
                             draft_timings=draft, ar_step_s=None if ar_step is None else float(ar_step),
                             busy=str(obj.get("busy", "")), seconds=float(obj.get("seconds", 0.0)),
                             draft_kind=str(obj.get("draft_kind", "tokens")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def keep_costs(path: Path, costs: MeasuredCosts) -> None:
    """Write atomically (a rename), so that two processes measuring at once never leave half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.part")
    conditions = costs.conditions.__dict__ if costs.conditions else None
    partial.write_text(json.dumps({"timings": {str(r): s for r, s in costs.timings.items()},
                                   "measured_at": costs.measured_at, "how": costs.how, "device": costs.device,
                                   "conditions": conditions, "contradicted": costs.contradicted,
                                   "draft_timings": {str(r): s for r, s in costs.draft_timings.items()},
                                   "ar_step_s": costs.ar_step_s, "ar_step_run_in": AR_STEP_RUN_IN,
                                   "busy": costs.busy, "seconds": costs.seconds, "draft_kind": costs.draft_kind}))
    partial.replace(path)


# A kept forward time this many times a step's own verify is wrong (check_kept_costs says why only this direction).
# Beyond the spread of honest costs: on a quiet machine (embedded pair, AMD EPYC AVX2, 2 cores, 2026-12-06) a kept
# forward read 0.43-1.46x the verify of each of 208 steps of ar, sd, mcsd and pld under one calibration and
# 0.43-1.31x under a second, and the two calibrations differed by up to 1.28x; at 1.5 honest costs were measured
# again (a step's verify varies with its context and the cache's rows, which the calibration reads behind a fixed one).
DISAGREEMENT = 2.0


def draft_forward_s(measured: MeasuredCosts | None, rows: float | None, kind: str = "tokens") -> float | None:
    """One draft forward over `rows` rows (a tree level's parents), read on the draft's line measured with the
    target's calibration, in the same interleaved rounds: the draft's share of a target forward then compares two
    forwards timed in the same conditions, not a run's own draft (timed while the page drew, or the machine was
    busy) against a quiet calibration. None where this `kind` of draft was not measured."""
    if measured is None or not measured.draft_timings or not rows or measured.draft_kind != kind:
        return None
    return nearest_forward_s(measured.draft_timings, rows)


def disagreement(timings: dict[int, float], steps: list[StepTrace]) -> str:
    """The first of `steps` whose own verify forward ran more than DISAGREEMENT times faster than the kept
    timings say a forward over its rows takes, as a sentence; "" when none did.

    Why only faster: a step's verify pays all that the calibration's bare forward pays and more (its tree mask, a
    longer context, reading the logits, the warm-up of a run's first step, load that comes and goes), so a step
    slower than the kept line says nothing against it; but no step can run a forward twice as fast as this
    device does, so one that did shows the kept figure was measured slower than the device runs (under load, on
    other kernels)."""
    for step in steps:
        rows = step.root_rows + len(step.nodes)
        kept = kept_forward_s(timings, rows)
        if kept is None or step.verify_seconds <= 0 or kept <= DISAGREEMENT * step.verify_seconds:
            continue
        over = f"{rows} row{'s' * (rows != 1)}"
        return (f"step {step.index}'s own verify over {over} took {step.verify_seconds * 1e3:.2f} ms where "
                f"they say one forward over {over} takes {kept * 1e3:.2f} ms ({kept / step.verify_seconds:.1f}x)")
    return ""


def check_kept_costs(pair, steps: list[StepTrace]) -> str:
    """Check this device's kept costs for `pair` against steps it has just taken (at every Step: engine.py), and
    mark them contradicted when a step disagrees, so that the next view of them measures again and says why
    instead of showing them. Returns the disagreement ("" when there was none to find)."""
    if not steps:
        return ""
    path = costs_file(pair)
    kept = read_kept_costs(path)
    if kept is None or kept.contradicted:
        return ""
    found = disagreement(kept.timings, steps)
    if found:
        try:
            keep_costs(path, replace(kept, contradicted=found))
        except OSError:  # a read-only cache: nothing kept can be corrected, nor shown as kept
            pass
    return found


def settle(path: Path, kept: MeasuredCosts | None, measured: MeasuredCosts) -> MeasuredCosts:
    """The one rule for a measurement made now against the costs kept at `path` (the device's, or a bigger
    target's): one taken on a busy machine never replaces quiet kept costs that no step contradicted (those are
    returned, the new one refused and said); with none to keep instead it is kept, marked busy, so that every view
    reads this one table rather than each its own measurement, until a quiet one replaces it."""
    busy = measured.conditions.busy_because() if measured.conditions is not None else ""
    if busy and kept is not None and not kept.contradicted and not kept.busy:  # never replaces quiet costs
        return replace(kept, refused=f"a new measurement at {measured.measured_at} UTC was refused: {busy}")
    if busy:  # no costs to keep instead: kept, said busy, so that every view reads this one table, not its own
        measured = replace(measured, busy=busy)
    try:
        keep_costs(path, measured)
    except OSError:  # a read-only cache: measured, not kept
        pass
    return measured
