"""The best static tree for each node budget, from one run's own acceptance and this device's costs: what
Learn → Cost model's second chart draws.

Why here: the sweep is a search (dynasd/speed/tree_search.py) over the run's acceptance vector, and a chart module
must only draw; the page asks for the sweep, then hands it to viz.cost.budget_figure.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...options import tree_of_run
from ...speed.step_cost import StepCosts
from ...speed.tree_search import Candidate, acceptance_vector, best_by_budget, evaluate
from ...trace import RunTrace
from .cost import run_shape, warm_steps

BUDGET_NODES = 64  # the node budgets the best-tree view sweeps
BUDGET_MIN_TESTS = 5  # one run is short: a rank counts from 5 tests (`dynasd best-tree` asks for 20 over a set)


@dataclass
class BestTrees:
    """`p`: the run's acceptance by sibling rank (empty: no rank was tested BUDGET_MIN_TESTS times, and there is
    no sweep); `sweep[n - 1]`: the best tree of at most n nodes; `own`: the run's own static tree evaluated the
    same way (None for other methods); `own_expected`: the run's own expected speed-up (speed.RunSpeed.expected),
    which the chart gives the run's tree, so that one method and settings have one expected figure on the page (the
    sweep models trees from the acceptance by rank, which prices the run's own tree a little differently);
    `scale` (at most 1, speed.RunSpeed.scale): every expectation is cut by it where Compare's measurement here fell
    short of the model."""

    p: list[float]
    sweep: list[Candidate] = field(default_factory=list)
    own: Candidate | None = None
    scale: float = 1.0
    own_expected: float | None = None

    @property
    def best(self) -> Candidate:
        return max(self.sweep, key=lambda c: c.speedup)


def best_trees(run: RunTrace, costs: StepCosts, scale: float = 1.0, own_expected: float | None = None) -> BestTrees:
    """The sweep of budgets 1..BUDGET_NODES for this run on these costs, with the run's own tree when it is a
    static draft tree (sd, mcsd)."""
    p = acceptance_vector(warm_steps(run), min_tests=BUDGET_MIN_TESTS)
    if not p:
        return BestTrees(p=[], scale=scale, own_expected=own_expected)
    overhead = run_shape(run).overhead_per_node_s
    tree = tree_of_run(run.method, run.config) if run.method in ("sd", "mcsd") else None
    own = evaluate(tree.branching, p, costs, overhead) if tree is not None else None
    return BestTrees(p=p, sweep=best_by_budget(p, costs, BUDGET_NODES, 8, overhead), own=own, scale=scale,
                     own_expected=own_expected)
