"""The best static tree for one draft on one device: expected tokens per step from measured acceptance, expected
time per step from the cost model, and a search over every tree shape within a node budget.

Sequoia (Chen et al. 2024) models a draft by its *acceptance vector*: p_r, the chance that a node's r-th candidate
is accepted once the r - 1 before it were rejected (at T = 0: that the r-th most probable draft token is the
target's; when sampling, MCSS's test after r - 1 rejections). Assuming p does not depend on depth, a node with k
candidates passes one of them with probability

    A(k) = 1 - (1 - p_1)(1 - p_2)...(1 - p_k)

and a static tree (k_1, ..., k_D) (this engine's k-config: k_l children for every node of level l - 1) commits

    1 + A(k_1) + A(k_1) A(k_2) + ... + A(k_1)...A(k_D)

tokens per step on average (its accepted levels and the target's own token). Its step costs D draft forwards and
one verify over 1 + nodes rows (dynasd/explorer/costs/cost.py), so its expected speed-up over ar is known before it is
run. Sequoia searches arbitrary trees by dynamic programming; the engine's static trees are k-configs, so the
search here is over every k-config within the budget, exhaustively (a few thousand shapes for 64 nodes), which is
exact for the family the engine runs.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..options import Shape
from ..trace import PROPOSED_ORIGINS, StepTrace
from ..tree import TreeShape
from .step_cost import StepCosts, expected_speedup

MAX_BRANCH = 8  # candidates per node the search tries (and the measuring tree's widest level)
MIN_TESTS = 20  # a rank tested fewer times says too little: the vector ends before it


def rank_counts(steps: list[StepTrace]) -> tuple[list[int], list[int]]:
    """(tested, accepted) per sibling rank r = 1, 2, ...: a candidate's rank is its place among its siblings in
    drawing order, and it is tested only after every earlier sibling was rejected, so accepted / tested is p_r."""
    tested: list[int] = []
    accepted: list[int] = []
    for step in steps:
        rank_of: dict[int, int] = {}
        seen: dict[int, int] = {}
        for i, node in enumerate(step.nodes):
            if node.origin in PROPOSED_ORIGINS:
                seen[node.parent] = seen.get(node.parent, 0) + 1
                rank_of[i] = seen[node.parent]
        for i in step.tested:
            if i not in rank_of:
                continue
            r = rank_of[i]
            while len(tested) < r:
                tested.append(0)
                accepted.append(0)
            tested[r - 1] += 1
            accepted[r - 1] += step.nodes[i].status in ("accepted", "unchosen")
    return tested, accepted


def acceptance_vector(steps: list[StepTrace], min_tests: int = MIN_TESTS) -> list[float]:
    """p_r for the ranks the steps tested at least `min_tests` times, from rank 1 on (the search gives a rank
    past the vector nothing: three lucky tests of a fourth sibling must not make four siblings look best)."""
    tested, accepted = rank_counts(steps)
    vector = []
    for t, a in zip(tested, accepted):
        if t < min_tests:
            break
        vector.append(a / t)
    return vector


def passes_one(p: list[float], k: int) -> float:
    """A(k): the chance one of a node's k candidates is accepted (ranks beyond the measured ones add nothing)."""
    missed = 1.0
    for p_r in p[:k]:
        missed *= 1.0 - p_r
    return 1.0 - missed


def expected_tokens(branching: tuple[int, ...], p: list[float]) -> float:
    """Tokens a step of this static tree commits on average: 1 + sum over levels of the chance to pass them all."""
    total, reach = 1.0, 1.0
    for k in branching:
        reach *= passes_one(p, k)
        total += reach
    return total


def shapes_within(budget: int, max_depth: int, max_branch: int = MAX_BRANCH):
    """Every k-config of at most `max_depth` levels, `max_branch` children a node and `budget` nodes."""
    def grow(prefix: tuple[int, ...], nodes: int, width: int):
        if prefix:
            yield prefix
        if len(prefix) == max_depth:
            return
        for k in range(1, max_branch + 1):
            level = width * k
            if nodes + level > budget:
                break
            yield from grow(prefix + (k,), nodes + level, level)

    yield from grow((), 0, 1)


@dataclass(frozen=True)
class Candidate:
    """One tree shape and what the model expects of it."""

    branching: tuple[int, ...]
    nodes: int
    tokens_per_step: float
    step_s: float
    speedup: float

    @property
    def text(self) -> str:
        return Shape.text(self.branching)


def evaluate(branching: tuple[int, ...], p: list[float], costs: StepCosts, overhead_per_node_s: float = 0.0
             ) -> Candidate:
    """The expected tokens per step, step time and speed-up over ar of one shape: its draft forwards (each over the
    rows of the level it reads, costs.tree_draft_s), one verify over 1 + nodes rows, and the step's work outside
    the forwards, `overhead_per_node_s` (measured on a run: its walk, commit and record over its nodes) a node."""
    shape = TreeShape(branching)
    nodes = shape.num_nodes
    tokens = expected_tokens(branching, p)
    level_sizes = [len(shape.nodes_at(level)) for level in range(1, shape.depth + 1)]
    step_s = costs.tree_draft_s(level_sizes) + costs.verify_s(nodes + 1) + overhead_per_node_s * nodes
    return Candidate(branching, nodes, tokens, step_s, expected_speedup(tokens, step_s, costs.ar_s))


def best_by_budget(p: list[float], costs: StepCosts, budget: int, max_depth: int,
                   overhead_per_node_s: float = 0.0) -> list[Candidate]:
    """For every budget b = 1..budget, the shape of at most b nodes with the highest expected speed-up."""
    if not p:
        raise ValueError("no acceptance measured: the steps tested no draft candidate")
    by_nodes: dict[int, Candidate] = {}
    for branching in shapes_within(budget, max_depth, min(MAX_BRANCH, max(len(p), 1))):
        candidate = evaluate(branching, p, costs, overhead_per_node_s)
        best = by_nodes.get(candidate.nodes)
        if best is None or candidate.speedup > best.speedup:
            by_nodes[candidate.nodes] = candidate
    best_so_far: Candidate | None = None
    sweep = []
    for b in range(1, budget + 1):
        here = by_nodes.get(b)
        if here is not None and (best_so_far is None or here.speedup > best_so_far.speedup):
            best_so_far = here
        if best_so_far is not None:
            sweep.append(best_so_far)
    return sweep
