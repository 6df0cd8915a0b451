"""Where would it pay? A run's acceptance carried to other targets and to a GPU, from measured costs.

A speculative step costs its draft forwards and one verify forward over its rows; ar costs one target forward per
token. So whether a tree pays is decided by two numbers: what a draft forward costs as a share of a target forward
(the draft share), and the acceptance a chain of the tree's depth needs to break even at that step cost. Both are
computed here for one run's step shape (its verify rows, draft forwards and depth) and its acceptance by position,
on:
  (a) this device, with its measured costs (cost.py: the kept calibration, the draft's forwards timed beside the
      target's; the run's own draft forwards where the draft was not measured);
  (b) this device with targets of larger real shapes (targets.py: measured here once, in the same arithmetic as the
      embedded target; a 7B model from a few real-shaped layers, scaled), the same draft;
  (c) a GPU: scripts/gpu_check.sh's measurements where its results file is present (gpu_check_file), else a model
      labelled as one (GPU_MODEL below: a forward reads every weight once, so its rows are free up to where the
      arithmetic catches up with the reads, and the draft share is the ratio of the parameters).
The acceptance is assumed to be this run's everywhere (the same draft proposing to a target that agrees as often),
and the view says so. Every sentence the page says about GPUs or bigger models is derived from this view
(`tree_verdict`), so none can contradict it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from ...acceptance import acceptance_of
from ...loading.embedded import cache_dir
from ...options import draft_that_runs
from ...speed.step_cost import break_even_acceptance, fit_line
from ...trace import RunTrace, StepTrace
from ...tree import TreeShape
from ..costs.cost import (
    MeasuredCosts,
    RunShape,
    calibrated_costs,
    costs_file,
    draft_forward_s,
    read_kept_costs,
    run_shape,
    warm_steps,
)
from ..costs.measuring import Measuring, measure_all
from ..costs.targets import (
    BIGGER_TARGETS,
    EMBEDDED_SHAPE,
    TargetShape,
    draft_shape_of,
    target_costs_file,
)
from .speed import ComparedSpeedup


@dataclass(frozen=True)
class GpuModel:
    """A GPU as a model, not a measurement: a forward costs max(weight bytes / bandwidth, rows x 2 x parameters /
    arithmetic rate), weights in bfloat16. Numbers: NVIDIA's H100 SXM datasheet (3.35 TB/s of HBM3, 989 TFLOPS of
    dense bfloat16)."""

    name: str = "H100 SXM, modelled"
    bandwidth: float = 3.35e12      # bytes / s
    flops: float = 989e12           # bfloat16 dense
    bytes_per_weight: int = 2       # bfloat16

    def forward_s(self, parameters: int, rows: int) -> float:
        return max(parameters * self.bytes_per_weight / self.bandwidth, 2 * parameters * rows / self.flops)

    @property
    def free_rows(self) -> int:
        """The row count up to which a forward costs what one row does (reading the weights dominates)."""
        return int(self.flops * self.bytes_per_weight / (2 * self.bandwidth))

    def said(self) -> str:
        return (f"modelled, not measured: {self.name}, a forward reads every weight once in bfloat16 at "
                f"{self.bandwidth / 1e12:.2f} TB/s, so rows are free up to ~{self.free_rows} (where "
                f"{self.flops / 1e12:.0f} TFLOPS of arithmetic catch up); the draft's share is its parameters' "
                "share. Kernel launches are left out: run eagerly, a small model's forward costs about its "
                "layer count in launches, whatever its size")


GPU_MODEL = GpuModel()
GPU_CHECK_TARGET, GPU_CHECK_DRAFT_GAMMA = "SmolLM2-1.7B", 6  # scripts/gpu_check.py's target and its sd chain


def gpu_check_file() -> Path:
    """Where a results file of scripts/gpu_check.sh is read from: copied into the cache folder as
    gpu-check/results.jsonl (the script writes it to the results folder it is given)."""
    return cache_dir() / "gpu-check" / "results.jsonl"


@dataclass(frozen=True)
class GpuCheck:
    """What scripts/gpu_check.sh measured on a CUDA machine: the target's forward by rows and one draft forward."""

    target_s: dict[int, float]
    draft_s: float
    device: str


def read_gpu_check(path: Path) -> GpuCheck | None:
    """A gpu_check results.jsonl: the verify cost by rows (bfloat16) and the draft's time per forward (the sd
    chain's draft time over its GAMMA forwards); None when absent or unreadable."""
    try:
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        target = {int(r["rows"]): float(r["ms"]) / 1000 for r in records
                  if str(r.get("part", "")).startswith("verify cost") and "rows" in r}
        sd = next(r for r in records if r.get("method") == f"sd:gamma={GPU_CHECK_DRAFT_GAMMA}" and "draft_ms" in r)
        device = next((str(r.get("device") or r.get("gpu") or "") for r in records if r.get("part") == "env"), "")
        if not target or 1 not in target:
            return None
        return GpuCheck(target, float(sd["draft_ms"]) / 1000 / GPU_CHECK_DRAFT_GAMMA, device or "a CUDA GPU")
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None


@dataclass(frozen=True)
class StepShape:
    """What a step of one tree costs and commits, independent of where it runs."""

    rows: int                    # verify rows: the tree's nodes and the root
    draft_forwards: int
    depth: int
    tokens_per_step: float | None  # a run's own; None for a tree not yet run (then no speed-up is expected)
    per_position: tuple[float, ...] = ()


MEASURED_COSTS = "measured costs"  # a row whose forwards were measured; its speed-up is still expected, not measured


@dataclass(frozen=True)
class WhereRow:
    """One target on one device: the step's cost and the two numbers that decide it."""

    target: str
    device: str
    source: str                  # MEASURED_COSTS (", scaled from layers"), "modelled", "measured by gpu_check"
    how: str                     # where the numbers come from, in a few words
    ar_s: float                  # one target forward over one row: an ar step
    draft_s: float               # one draft forward
    step_s: float
    break_even: float | None     # the acceptance per level a chain of the tree's depth needs; None: never pays
    expected: float | None       # the speed-up at the run's tokens per step

    @property
    def draft_share(self) -> float:
        return self.draft_s / self.ar_s

    @property
    def modelled(self) -> bool:
        return self.source == "modelled"


@dataclass(frozen=True)
class WhereItPays:
    """The view: a step shape and its rows, this device's first; `compared`: what Compare measured for the run's
    method, settings and prompt on this machine (None: nothing, or no run yet)."""

    method: str
    step: StepShape
    draft: str
    rows: list[WhereRow]
    notes: list[str]
    compared: ComparedSpeedup | None = None


def forward_at(timings: dict[int, float], rows: int) -> float:
    """A forward over `rows` rows as the cost model reads a calibration (cost.costs_from): the measured one-row
    forward for one row, else the line through every measured row count. One reading everywhere, so that this
    device's row here is the Cost model's expectation for the same run, not a second one."""
    counts = sorted(timings)
    base, per_row = fit_line([float(r) for r in counts], [timings[r] for r in counts])
    if rows == 1:
        return timings.get(1, base + per_row)
    return base + max(per_row, 0.0) * rows


def where_row(target: str, device: str, source: str, how: str, target_s, draft_s: float,
              step: StepShape, ar_s: float | None = None) -> WhereRow:
    """`target_s(rows)`: a forward's seconds over `rows` rows there; `ar_s`: an ar step timed apart (the Cost
    model's, cost.AR_STEP), else `target_s(1)`."""
    ar_s = ar_s or target_s(1)
    step_s = step.draft_forwards * draft_s + target_s(step.rows)
    expected = step.tokens_per_step * ar_s / step_s if step.tokens_per_step is not None else None
    return WhereRow(target, device, source, how, ar_s, draft_s, step_s,
                    break_even_acceptance(step.depth, step_s, ar_s), expected)


def step_of_run(run: RunTrace) -> StepShape:
    shape: RunShape = run_shape(run)
    return StepShape(max(round(shape.rows), 1), round(shape.draft_forwards), shape.depth, shape.tokens_per_step,
                     tuple(acceptance_of(warm_steps(run)).per_position))


def bigger_targets_said(targets: dict[str, MeasuredCosts]) -> str:
    """When the bigger targets' costs were measured, and whether on a busy machine or refused (cost.settle), as one
    more sentence of their note ("" when none is on show)."""
    if not targets:
        return ""
    said = f" Measured at {', '.join(sorted({c.measured_at for c in targets.values()}))} UTC"
    busy = next((c.busy for c in targets.values() if c.busy), "")
    refused = next((c.refused for c in targets.values() if c.refused), "")
    if busy:
        said += f" ({busy}: kept as the one table until a measurement on a quiet machine replaces it)"
    return said + (f"; {refused}" if refused else "") + "."


def where_it_pays(method: str, step: StepShape, draft_per_forward_s: float, device: MeasuredCosts,
                  targets: dict[str, MeasuredCosts], draft_shape: TargetShape | None,
                  gpu_check: GpuCheck | None = None, gpu: GpuModel = GPU_MODEL,
                  embedded: TargetShape = EMBEDDED_SHAPE) -> WhereItPays:
    """The rows for one step shape: (a) this device, (b) the bigger targets measured here, (c) a GPU."""
    drafts = step.draft_forwards > 0
    here = calibrated_costs(device.timings, device.ar_step_s)  # the Cost model's reading of them
    rows = [where_row(f"{embedded.name} (this pair's target)", "this CPU", MEASURED_COSTS,
                      "this device's kept costs, as the Cost model reads them", here.verify_s, draft_per_forward_s,
                      step, ar_s=here.ar_s)]
    for shape in BIGGER_TARGETS:
        costs = targets.get(shape.name)
        if costs is None:
            continue
        rows.append(where_row(shape.name, "this CPU", f"{MEASURED_COSTS}, scaled from layers" if shape.scaled
                              else MEASURED_COSTS, "random weights, the same arithmetic",
                              lambda n, c=costs: forward_at(c.timings, n), draft_per_forward_s, step))
    if gpu_check is not None:
        rows.append(where_row(GPU_CHECK_TARGET, gpu_check.device, "measured by gpu_check",
                              "scripts/gpu_check.sh, random weights, bfloat16",
                              lambda n: forward_at(gpu_check.target_s, n), gpu_check.draft_s if drafts else 0.0, step))
    else:
        draft_params = draft_shape.parameters if drafts and draft_shape is not None else 0
        for shape in (embedded, *BIGGER_TARGETS):
            rows.append(where_row(shape.name, "a GPU", "modelled", gpu.name,
                                  lambda n, s=shape: gpu.forward_s(s.parameters, n),
                                  gpu.forward_s(draft_params, 1) if draft_params else 0.0, step))
    notes = [
        "The acceptance is assumed to be this run's everywhere: the same draft, proposing to a target that agrees "
        "with it as often (a bigger target may agree less).",
        "Bigger targets on this CPU: their configurations (hidden size, layers, heads, KV heads, intermediate size, "
        "vocabulary) with random weights in the embedded target's arithmetic, measured here"
        + (f"; {', '.join(s.name for s in BIGGER_TARGETS if s.scaled)} from forwards of a few real-shaped layers "
           "and the real head, scaled by the layer count (too big to build whole here)"
           if any(s.scaled for s in BIGGER_TARGETS) else "") + "." + bigger_targets_said(targets),
        ("GPU: measured by scripts/gpu_check.sh on " + gpu_check.device + "." if gpu_check is not None
         else "GPU: " + gpu.said() + ". No GPU has been measured (scripts/gpu_check.sh measures one; its results "
         f"file, copied to {gpu_check_file()}, replaces this model)."),
    ]
    if not drafts:
        notes.append(f"{method} runs no draft model: its candidates cost nothing to propose, so the draft share is 0 "
                     "and only the verify rows decide.")
    draft = draft_shape.name if draft_shape is not None and drafts else "none"
    return WhereItPays(method, step, draft, rows, notes)


def _share(value: float) -> str:
    return f"{value:.1%}" if value < 0.1 else f"{value:.0%}"


def _pays(row: WhereRow, depth: int) -> str:
    """Where a row pays, said from its break-even acceptance: 'pays above acceptance 0.59 per level'."""
    if row.break_even is None:
        return f"never pays at depth {depth}"
    if row.break_even <= 0.0:
        return "pays at any acceptance"
    return f"pays above acceptance {row.break_even:.2f} per level"


def _outcome(row: WhereRow, depth: int) -> str:
    """What the model expects of a row: its speed-up, or for a tree not yet run where it would pay."""
    if row.expected is not None:
        return f"is expected at {row.expected:.2f}× ar"
    if row.break_even is None:
        return f"is expected never to pay at depth {depth}"
    if row.break_even <= 0.0:
        return "is expected to pay at any acceptance"
    return f"is expected to pay above acceptance {row.break_even:.2f} per level"


def tree_verdict(view: WhereItPays) -> str:
    """One sentence on this tree on this device, with what would change it, every number from the view's rows."""
    here, depth = view.rows[0], view.step.depth
    bigger = [r for r in view.rows[1:] if r.device == here.device]
    gpus = [r for r in view.rows if r.device != here.device]
    text = (f"On this CPU this tree ({view.step.rows} verify rows, {view.step.draft_forwards} draft forwards) "
            f"{_outcome(here, depth)}: a step costs {here.step_s / here.ar_s:.1f} ar steps and a draft forward "
            f"{_share(here.draft_share)} of a target forward")
    if here.expected is not None:
        text += f" (it {_pays(here, depth)})"
    if bigger:
        big = bigger[-1]
        text += (f"; with a {big.target}-shaped target it {_outcome(big, depth)} here ({_share(big.draft_share)} "
                 "draft share, from measured costs)")
    if gpus:
        gpu = max(gpus, key=lambda r: r.expected if r.expected is not None else -(r.break_even or 2.0))
        label = "modelled" if gpu.modelled else "from measured costs"
        text += f"; on {gpu.device} with {gpu.target} it {_outcome(gpu, depth)} ({label})"
    if view.compared is not None:
        text += f"; {view.compared.short()} on this prompt"
    return text + " (Learn → Where would it pay?)."


# -- what the view needs measured, and the view of a run ---------------------------------------------------------

@dataclass(frozen=True)
class WhereCosts:
    """What one model call measures (or reads kept) for the view: this device's costs for the pair, the bigger
    targets' costs on this device, and the draft's shape (for a GPU's modelled draft share)."""

    device: MeasuredCosts
    targets: dict[str, MeasuredCosts]
    draft_shape: TargetShape | None
    targets_missing: str = ""    # why the bigger targets were not measured here


def where_costs(pairs, settings, context_ids: list[int], again: bool = False) -> WhereCosts:
    """This device's kept costs (measured first where there are none), the bigger targets' (likewise, on a CPU
    with the block kernels only: elsewhere the embedded target's arithmetic does not run) and the draft's shape."""
    return where_costs_of(measure_all(pairs, settings, context_ids, again, bigger_targets=True))


def where_costs_of(measuring: Measuring) -> WhereCosts:
    """The view's costs from a complete measurement (measuring.py), taken at once or part by part."""
    return WhereCosts(measuring.device, measuring.targets, measuring.draft_shape, measuring.targets_missing)


def where_of_run(run: RunTrace, costs: WhereCosts, compared: ComparedSpeedup | None = None) -> WhereItPays:
    """The view of a run: its step shape and acceptance, on every target and device with costs, with what Compare
    measured for its method, settings and prompt here (`compared`, speed.compared_here)."""
    shape = run_shape(run)
    measured_draft = draft_forward_s(costs.device, shape.draft_rows, shape.draft_kind)
    view = where_it_pays(run.method, step_of_run(run), measured_draft or shape.draft_per_forward_s or 0.0,
                         costs.device, costs.targets, costs.draft_shape, read_gpu_check(gpu_check_file()))
    if measured_draft:
        view.notes.append(f"A draft forward here: {measured_draft * 1000:.2f} ms over {shape.draft_rows:.1f} rows "
                          "(this run's tree), timed beside the target's forwards in the same rounds; this run's own "
                          f"draft forwards took {(shape.draft_per_forward_s or 0.0) * 1000:.2f} ms each.")
    if costs.targets_missing:
        view.notes.insert(1, f"No bigger target was measured here: {costs.targets_missing}.")
    return replace(view, compared=compared)


def where_of_tree(method: str, branching: tuple[int, ...], draft_per_forward_s: float, costs: WhereCosts,
                  draft_kind: str = "tokens") -> WhereItPays:
    """The view of a tree before any run (no acceptance: no speed-up expected, the break-even only), for the
    sentence said when a run starts (tree_verdict)."""
    tree = TreeShape(tuple(branching))
    step = StepShape(tree.num_nodes + 1, len(branching), len(branching), None)
    parents = (1, *tree.level_sizes[:-1])  # a draft forward reads the level above the one it draws
    draft_per_forward_s = draft_forward_s(costs.device, sum(parents) / len(parents), draft_kind) or draft_per_forward_s
    return where_it_pays(method, step, draft_per_forward_s, costs.device, costs.targets, costs.draft_shape,
                         read_gpu_check(gpu_check_file()))


def kept_where_costs(pair) -> WhereCosts | None:
    """The view's costs as kept in the cache (nothing measured, no model run: for a handler in the serving
    process), or None when this device's costs for `pair` were never kept or a step has since contradicted them."""
    device = read_kept_costs(costs_file(pair))
    if device is None or device.contradicted:
        return None
    targets = {}
    for shape in BIGGER_TARGETS:
        kept = read_kept_costs(target_costs_file(shape))
        if kept is not None:
            targets[shape.name] = kept
    return WhereCosts(device, targets, draft_shape_of(pair))


def tree_sentence(method: str, branching: tuple[int, ...], pair, draft_per_forward_s: float,
                  draft_kind: str = "tokens") -> str:
    """The one sentence said when a run of this tree starts (tree_verdict of where_of_tree on the kept costs), or
    "" when this device's costs were never measured (Learn → Cost model or Where would it pay? measure them)."""
    costs = kept_where_costs(pair)
    if costs is None or not branching:
        return ""
    return tree_verdict(where_of_tree(method, tuple(branching), draft_per_forward_s, costs, draft_kind))


def tree_note(pair, settings, steps: list[StepTrace]) -> str:
    """The sentence said when a run starts about its tree on this device (`settings`: the run's), from the costs
    kept here (a draft forward from the draft's kept line, else the first step's own) by tree_sentence: derived from
    the view Learn → Where would it pay? draws, so the two cannot disagree; "" before a step that ran the draft, or
    where this device's costs were never kept."""
    drafted = [step for step in steps if step.draft_forwards]
    branching = settings.options.for_method().branching()
    if not drafted or not branching:
        return ""
    first = drafted[0]
    kind = draft_that_runs(settings.options.for_method(), pair.default_draft_kind)
    return tree_sentence(settings.method, tuple(branching), pair, first.draft_seconds / first.draft_forwards, kind)
