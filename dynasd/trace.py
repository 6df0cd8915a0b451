"""What happened in each step, as plain data: the contract between the engine and everything that shows it.

A saved RunTrace can be replayed in the app with no model loaded. Loading validates everything the figures rely
on, types, sizes and tree structure (traces may come from strangers on a public Space), never unpickles anything,
and only ever says no with a TraceError.
"""
from __future__ import annotations

import functools
import json
import math
import types
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path

from .options import MAX_TREE_NODES
from .origins import ORIGINS

# unchosen: a target root, or a node that passed its test, on a chain that lost the longest-chain selection.
# padding: a candidate that could not be drawn (fewer non-zero draft probabilities than children asked for).
NODE_STATUSES = ("accepted", "rejected", "not_reached", "unchosen", "padding")
# Candidate origins come from the one registry of sources; the target's own tokens are added after the walk.
NODE_ORIGINS = tuple(origin.name for origin in ORIGINS)
PROPOSED_ORIGINS = tuple(origin.name for origin in ORIGINS if origin.tested)  # target roots are its own picks
TARGET_TOKENS = ("bonus", "correction", "target")  # after the walk (bonus, correction) or alone (ar)
TOKEN_ORIGINS = NODE_ORIGINS + TARGET_TOKENS
TRACE_FORMAT = "dynasd-trace/1"
MAX_TRACE_BYTES = 20 * 1024 * 1024
MAX_TRACE_STEPS = 4096         # the app itself never makes more than its max-new-tokens limit
MAX_RESIDUAL_TOKENS = 32       # tokens a step's residual record may list


class TraceError(ValueError):
    """A trace file is malformed; the message says where."""


@dataclass
class NodeTrace:
    token_id: int
    token: str
    parent: int          # -1: the step's root position
    level: int           # 1-based
    origin: str          # one of NODE_ORIGINS: drafted, looked up in the context, recycled, or a target root
    p: float             # target probability of the token at its parent (after temperature/top-k/top-p)
    q: float | None      # draft probability it was drawn with (None for target roots)
    status: str          # one of NODE_STATUSES
    p_test: float | None = None  # values the acceptance test used (residual-adjusted); None if not tested
    q_test: float | None = None
    u: float | None = None       # the uniform draw; None at temperature 0


@dataclass
class LevelScores:
    """Early-stop scores of the tips of one draft level; drafting continued iff any score >= threshold."""

    level: int
    scores: list[float]
    continued: bool


@dataclass
class ResidualTrace:
    """Where the walk's last rejection happened (T > 0): the target's p, the q the first candidate there was drawn
    from, and the residual the correction token was sampled from, over the few tokens that carry the picture (the
    largest of each, and the correction). Enough to draw why speculative sampling is exact without storing whole
    vocabularies; `rejections` says how many candidates the residual has removed (one per rejected sibling)."""

    context: int                          # node after which the correction was sampled (-1 = the root)
    token_ids: list[int]
    tokens: list[str]
    p: list[float]
    q: list[float]
    residual: list[float]
    rejections: int = 1


@dataclass
class LeftOut:
    """A draw a dynamic tree could have made next but its node budget did not reach: one more child of `parent`."""

    parent: int          # -1: the root
    value: float         # the cumulative draft probability it was ranked by
    token_id: int        # the draft's next-ranked token there at T = 0; -1 when sampling (it was never drawn)
    token: str


@dataclass
class TreeGrowth:
    """How a dynamic tree (dynasd/sources/dynamic_tree.py) grew this step: every wave added the `per_wave` most
    valuable next draws anywhere in the tree, a node's value being its cumulative draft probability (the product
    of q along its path). `nodes` are the step's node indices it grew (a tree joined by other sources has more)."""

    budget: int                           # the most nodes it may draw
    per_wave: int
    nodes: list[int]
    values: list[float]                   # per grown node: its cumulative draft probability
    waves: list[int]                      # per grown node: the wave (1, 2, ...) that drew it
    expanded: list[int]                   # nodes the draft read, so their children could be drawn
    left_out: list[LeftOut] = field(default_factory=list)  # the best next draws the budget did not reach


@dataclass
class StepTrace:
    index: int
    context_len: int                      # committed tokens (prompt included) before this step
    nodes: list[NodeTrace]
    max_nodes: int                        # size of the largest tree (the mask that is sliced)
    max_depth: int
    live_depth: int
    root_rows: int                        # verify rows before the tree: committed tokens fed with it (0 or 1)
    verify_mask: list[str]                # tree block of the verify mask, rows of '0'/'1', live slice only
    position_ids: list[int]               # of the verify forward (root rows, then tree nodes)
    accepted_path: list[int]              # node indices
    committed: list[int]
    committed_tokens: list[str]
    committed_origins: list[str]          # one of TOKEN_ORIGINS per committed token
    final_parent: int | None = None       # node after which the bonus/correction token was sampled (-1 = root)
    final_p: float | None = None          # its probability under the distribution it was sampled from
    root_token: str = ""                  # the last committed token before the step: the tree's root
    stop_policy: str = "none"
    threshold: float | None = None
    stop_scores: list[LevelScores] = field(default_factory=list)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    accept_seconds: float = 0.0
    draft_forwards: int = 0
    target_forwards: int = 0
    tested: list[int] = field(default_factory=list)  # node indices in the order the walk tested them
    residual: ResidualTrace | None = None  # at a correction when sampling; None at T = 0 or after a bonus
    growth: TreeGrowth | None = None      # a dynamic tree's growth; None for static trees

    @property
    def seconds(self) -> float:
        """The method's own time for the step: draft, verify and accept (the walk and the commit); never the prefill
        nor this record's values for the views (p of every node, token strings), read after the step's clock."""
        return self.draft_seconds + self.verify_seconds + self.accept_seconds


@dataclass
class Prediction:
    """A learner's guess about a step, made before its verdict was shown (dynasd/explorer/lessons/predict.py), kept with
    the run so that a saved trace brings its guesses and score back. `node` -1: how many tokens the step commits;
    a node index: whether that tested node passes (guess and answer 1 or 0)."""

    step: int
    node: int
    guess: int
    answer: int


@dataclass
class RunTrace:
    method: str
    config: dict
    pair: str
    draft_label: str
    lossless: bool
    prompt: str
    prompt_ids: list[int]
    steps: list[StepTrace] = field(default_factory=list)
    new_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    seconds: float = 0.0
    finished: str = ""                    # "eos", "length" or "" while running
    predictions: list[Prediction] = field(default_factory=list)  # the learner's guesses, in the order made
    device: str = ""                      # the machine, weights and kernels it ran on (dynasd/device_info.py)

    @property
    def target_forwards(self) -> int:
        return sum(s.target_forwards for s in self.steps)

    @property
    def draft_forwards(self) -> int:
        return sum(s.draft_forwards for s in self.steps)

    def summary(self) -> dict:
        steps = len(self.steps)
        new = len(self.new_token_ids)
        # Draft levels only: a target-initialized tree's first level holds the target's own tokens.
        attempted = sum(s.live_depth - (s.nodes[0].origin == "target_root") for s in self.steps if s.nodes)
        accepted_levels = sum(sum(n.origin in PROPOSED_ORIGINS for n in (s.nodes[i] for i in s.accepted_path))
                              for s in self.steps)
        return {
            "new_tokens": new,
            "steps": steps,
            "target_forwards": self.target_forwards,
            "draft_forwards": self.draft_forwards,
            "seconds": self.seconds,
            "tokens_per_s": new / self.seconds if self.seconds > 0 else 0.0,
            "tokens_per_target_forward": new / self.target_forwards if self.target_forwards else 0.0,
            # accepted draft levels / draft levels attempted (the paper's acceptance rate)
            "acceptance_rate": accepted_levels / attempted if attempted else 0.0,
        }


def _node_from(obj: dict) -> NodeTrace:
    return NodeTrace(**_check_fields(NodeTrace, obj))


def _check_fields(cls, obj) -> dict:
    if not isinstance(obj, dict):
        raise TraceError(f"{cls.__name__}: expected an object, got {type(obj).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = set(obj) - names
    if unknown:
        raise TraceError(f"{cls.__name__}: unknown fields {sorted(unknown)[:5]}")
    return obj


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise TraceError(message)


def _expect_list(value, item_type, name: str) -> None:
    _expect(isinstance(value, list) and all(isinstance(v, item_type) and not isinstance(v, bool) for v in value),
            f"{name} must be a list of {item_type.__name__}")


def _step_from(obj: dict) -> StepTrace:
    obj = dict(_check_fields(StepTrace, obj))
    _expect(isinstance(obj.get("nodes"), list), "step.nodes must be a list")
    _expect(isinstance(obj.get("stop_scores", []), list), "step.stop_scores must be a list")
    obj["nodes"] = [_node_from(n) for n in obj["nodes"]]
    obj["stop_scores"] = [LevelScores(**_check_fields(LevelScores, s)) for s in obj.get("stop_scores", [])]
    if obj.get("residual") is not None:
        obj["residual"] = ResidualTrace(**_check_fields(ResidualTrace, obj["residual"]))
    if obj.get("growth") is not None:
        growth = dict(_check_fields(TreeGrowth, obj["growth"]))
        _expect(isinstance(growth.get("left_out", []), list), "step.growth.left_out must be a list")
        growth["left_out"] = [LeftOut(**_check_fields(LeftOut, d)) for d in growth.get("left_out", [])]
        obj["growth"] = TreeGrowth(**growth)
    step = StepTrace(**obj)
    n = len(step.nodes)
    where = f"step {step.index}"
    for name, item_type in (("verify_mask", str), ("position_ids", int), ("accepted_path", int),
                            ("committed", int), ("committed_tokens", str), ("committed_origins", str)):
        _expect_list(getattr(step, name), item_type, f"{where}: {name}")
    _expect(len(step.verify_mask) == n and all(len(r) == n and set(r) <= {"0", "1"} for r in step.verify_mask),
            f"{where}: bad verify_mask")
    for i, node in enumerate(step.nodes):
        _expect(node.status in NODE_STATUSES, f"{where}: unknown node status {node.status!r}")
        _expect(isinstance(node.parent, int) and -1 <= node.parent < i, f"{where}: bad parent of node {i}")
        _expect(isinstance(node.token_id, int) and isinstance(node.token, str), f"{where}: bad token of node {i}")
    _expect(all(0 <= i < n for i in step.accepted_path), f"{where}: bad path")
    _expect(len(step.committed) == len(step.committed_tokens) == len(step.committed_origins),
            f"{where}: committed lists differ in length")
    _expect(all(o in TOKEN_ORIGINS for o in step.committed_origins), f"{where}: unknown token origin")
    return step


def run_to_dict(run: RunTrace) -> dict:
    return {"format": TRACE_FORMAT, **asdict(run)}


def run_from_dict(obj: dict) -> RunTrace:
    """A RunTrace from its JSON object, fully checked (check_trace); raises TraceError and nothing else."""
    try:
        run = _run_from_dict(obj)
        check_trace(run)
    except TraceError:
        raise
    except RecursionError as exc:
        raise TraceError("it is nested too deeply") from exc
    except Exception as exc:  # the loader must only ever say no; anything else is reported, not raised
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise TraceError(f"malformed ({type(exc).__name__}{': ' + detail if detail else ''})") from exc
    return run


def _run_from_dict(obj: dict) -> RunTrace:
    _expect(isinstance(obj, dict), "a trace must be a JSON object")
    obj = dict(obj)
    _expect(obj.pop("format", None) == TRACE_FORMAT, f"not a {TRACE_FORMAT} file")
    obj = dict(_check_fields(RunTrace, obj))
    _expect(isinstance(obj.get("steps"), list), "steps must be a list")
    try:
        obj["steps"] = [_step_from(s) for s in obj["steps"]]
        _expect(isinstance(obj.get("predictions", []), list), "predictions must be a list")
        obj["predictions"] = [Prediction(**_check_fields(Prediction, g)) for g in obj.get("predictions", [])]
        run = RunTrace(**obj)
    except (TypeError, AttributeError) as exc:  # missing or mistyped fields
        raise TraceError(f"malformed trace: {exc}") from exc
    _expect(isinstance(run.text, str) and isinstance(run.prompt, str), "prompt and text must be strings")
    _expect(isinstance(run.config, dict), "config must be an object")
    _expect_list(run.new_token_ids, int, "new_token_ids")
    _expect_list(run.prompt_ids, int, "prompt_ids")
    return run


def check_trace(run: RunTrace) -> None:
    """Every field has its declared type and the tree of every step is one the app can draw; raises TraceError."""
    _check_value(run, RunTrace, "trace")
    _expect(len(run.steps) <= MAX_TRACE_STEPS, f"the trace has {len(run.steps)} steps; the limit is {MAX_TRACE_STEPS}")
    _expect(len(run.predictions) <= MAX_TRACE_STEPS * (MAX_TREE_NODES + 1), "too many predictions")
    for guess in run.predictions:
        _expect(0 <= guess.step < len(run.steps) and -1 <= guess.node < len(run.steps[guess.step].nodes),
                f"a prediction names step {guess.step}, node {guess.node}, which the trace does not have")
    for step in run.steps:
        where = f"step {step.index}"
        n = len(step.nodes)
        _expect(n <= MAX_TREE_NODES, f"{where} has {n} nodes; the limit is {MAX_TREE_NODES}")
        _expect(0 <= step.max_nodes <= MAX_TREE_NODES and 0 <= step.live_depth <= step.max_depth <= MAX_TREE_NODES,
                f"{where}: bad tree size")
        levels = [0] * n
        for i, node in enumerate(step.nodes):
            _expect(-1 <= node.parent < i, f"{where}: bad parent of node {i}")
            levels[i] = 1 if node.parent == -1 else levels[node.parent] + 1
            _expect(node.level == levels[i], f"{where}: node {i} is on level {levels[i]}, not {node.level}")
            _expect(node.origin in NODE_ORIGINS, f"{where}: node {i} has a bad origin")
            for name in ("p", "q", "p_test", "q_test", "u"):
                value = getattr(node, name)
                _expect(value is None or (math.isfinite(value) and -1e-6 <= value <= 1.0 + 1e-6),
                        f"{where}: node {i} has {name} outside [0, 1]")
        path = step.accepted_path
        _expect(all(0 <= i < n for i in path), f"{where}: bad path")
        _expect(all(step.nodes[b].parent == a for a, b in zip([-1] + path, path)),
                f"{where}: the accepted path is not a chain from the root")
        _expect(step.final_parent is None or -1 <= step.final_parent < n, f"{where}: bad final_parent")
        _expect(all(0 <= t for t in step.committed), f"{where}: negative token id")
        _expect(all(0 <= i < n for i in step.tested) and len(set(step.tested)) == len(step.tested),
                f"{where}: bad test order")
        if step.residual is not None:
            r = step.residual
            _expect(len(r.token_ids) == len(r.tokens) == len(r.p) == len(r.q) == len(r.residual)
                    <= MAX_RESIDUAL_TOKENS, f"{where}: bad residual lists")
            _expect(-1 <= r.context < n and r.rejections >= 1, f"{where}: bad residual context")
            _expect(all(math.isfinite(v) and -1e-6 <= v <= 1.0 + 1e-6 for v in r.p + r.q + r.residual),
                    f"{where}: residual probabilities outside [0, 1]")
        if step.growth is not None:
            g = step.growth
            _expect(len(g.nodes) == len(g.values) == len(g.waves) <= n and len(g.left_out) <= MAX_TREE_NODES,
                    f"{where}: bad growth lists")
            _expect(all(0 <= i < n for i in g.nodes + g.expanded) and all(w >= 1 for w in g.waves),
                    f"{where}: bad growth nodes")
            _expect(all(-1 <= d.parent < n for d in g.left_out), f"{where}: bad left-out draw")
            _expect(all(-1e-6 <= v <= 1.0 + 1e-6 for v in g.values + [d.value for d in g.left_out]),
                    f"{where}: growth values outside [0, 1]")


@functools.lru_cache(maxsize=None)
def _type_hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _check_value(value, annotation, where: str) -> None:
    """`value` has the type `annotation` (a dataclass, int, float, str, bool, dict, None, list[...], X | None)."""
    if is_dataclass(annotation):
        _expect(isinstance(value, annotation), f"{where}: expected {annotation.__name__}")
        hints = _type_hints(annotation)
        for f in fields(annotation):
            _check_value(getattr(value, f.name), hints[f.name], f"{where}.{f.name}")
        return
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                _check_value(value, option, where)
                return
            except TraceError:
                pass
        raise TraceError(f"{where}: unexpected {type(value).__name__}")
    if origin is list:
        _expect(isinstance(value, list), f"{where}: expected a list")
        for i, item in enumerate(value):
            _check_value(item, args[0], f"{where}[{i}]")
        return
    if annotation is type(None):
        _expect(value is None, f"{where}: expected null")
    elif annotation is float:  # JSON writes 1.0 as 1
        _expect(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
                f"{where}: expected a finite number")
    elif annotation is int:
        _expect(isinstance(value, int) and not isinstance(value, bool), f"{where}: expected an integer")
    elif annotation in (str, bool, dict):
        _expect(isinstance(value, annotation), f"{where}: expected {annotation.__name__}")


def save_run(run: RunTrace, path: str | Path) -> None:
    Path(path).write_text(json.dumps(run_to_dict(run)))


def load_run(path: str | Path, max_bytes: int = MAX_TRACE_BYTES) -> RunTrace:
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise TraceError(f"trace file is {size} bytes; the limit is {max_bytes}")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"not a JSON trace file: {exc}") from exc
    except RecursionError as exc:
        raise TraceError("it is nested too deeply") from exc
    return run_from_dict(obj)
