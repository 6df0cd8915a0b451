"""One step replayed phase by phase: each draft level appears (a dynamic tree's: each wave), then the verify mask,
then the walk tests the candidates one at a time, then the commit. viz/guided.py draws what this module says.

A phase is a view of the recorded step cut at a moment in time: the tree holds only what existed then (later
levels absent, untested nodes pending, no bonus or correction yet), so the same tree figure draws every phase.
Which nodes were tested, and in what order, is predict.tested_nodes: the phases and the guesses agree on it.

With a guess pending (predict, then reveal), a test phase asks its question before it shows the answer: the node
is drawn untested, and at temperature 0, where the target's p of the node and its siblings is the answer (the
target's most likely token passes), p is left out of the untested nodes until the learner has answered.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ...origins import BY_NAME, DRAFT
from ...sampling import passes
from ...trace import RunTrace, StepTrace
from ...trace_semantics import GREEDY, step_rule
from ..labels import show_token
from .predict import node_question, pending_test, tested_nodes


@dataclass(frozen=True)
class Phase:
    kind: str          # "draft", "mask", "test" or "commit"
    title: str
    text: str
    level: int = 0     # draft: the levels drafted so far
    tests: int = 0     # test: how many tests have happened, this one included


def draft_stages(step: StepTrace) -> list[int]:
    """The draft phase at which each node appears: its level, or for a dynamic tree its wave. Nodes are numbered
    in that order (level-major, or wave by wave), so a phase shows a prefix of them and parents stay valid; a tree
    whose order does not allow that (a dynamic tree joined by another source's nodes) appears in one phase."""
    waves = dict(zip(step.growth.nodes, step.growth.waves)) if step.growth else {}
    stages = [waves.get(i, node.level) for i, node in enumerate(step.nodes)]
    return stages if stages == sorted(stages) else [1] * len(stages)


def _draft_phase(step: StepTrace, stages: list[int], stage: int) -> Phase:
    members = [i for i, s in enumerate(stages) if s == stage]
    sources = [BY_NAME[name] for name in dict.fromkeys(step.nodes[i].origin for i in members)]
    proposed_by = " and ".join(source.proposed_by for source in sources)
    if step.growth is not None and set(members) <= set(step.growth.nodes):
        read = " after one forward over the last wave's nodes" if stage > 1 else ""
        return Phase("draft", f"Draft wave {stage}", f"{len(members)} candidate(s) in wave {stage}, from "
                     f"{proposed_by}{read}: the most valuable next draws anywhere in the tree (cumulative q: the "
                     "product of q along a node's path), each decided before it was drawn.", level=stage)
    drafted = stage > 1 and DRAFT in sources  # the draft reads a whole level in one forward
    return Phase("draft", f"Draft level {stage}", f"{len(members)} candidate(s) at level {stage}, from "
                 f"{proposed_by}" + (" in one forward over the level above" if drafted else "") + ".", level=stage)


def step_phases(step: StepTrace) -> list[Phase]:
    """The phases of a step in the order they happen."""
    stages = draft_stages(step)
    depth = max(stages, default=0)
    phases = [_draft_phase(step, stages, stage) for stage in sorted(set(stages))]
    rows = len(step.nodes) + step.root_rows
    phases.append(Phase("mask", "Verify", f"One target forward over {rows} rows scores every candidate at once; "
                        "the mask lets each see only itself and its ancestors.", level=depth))
    tested = tested_nodes(step)
    for count, i in enumerate(tested, start=1):
        node = step.nodes[i]
        kept = node.status in ("accepted", "unchosen")
        if node.u is not None and node.q_test:
            below = passes(node.u, node.p_test or 0.0, node.q_test)
            rule = (f"u = {node.u:.3f} {'<' if below else '≥'} min(1, p′/q′) = "
                    f"{min(1.0, (node.p_test or 0.0) / node.q_test):.3f}")
        else:  # T = 0: greedy comparison
            rule = (f"{GREEDY.when.lower()} a candidate passes only when {GREEDY.test}, whatever its p and q, "
                    f"and this one {'is' if kept else 'is not'}")
        phases.append(Phase("test", f"Test {count} of {len(tested)}: node {i}",
                            f"Node {i} (‘{show_token(node.token, 16)}’, level {node.level}) is "
                            f"{'accepted' if kept else 'rejected'}: {rule}.", level=depth, tests=count))
    # one quoted piece per token: joined, "␣in" + "␣two" read as one word
    tokens = " · ".join(f"‘{show_token(token, 16)}’" for token in step.committed_tokens[:12])
    phases.append(Phase("commit", "Commit", f"{len(step.committed)} token(s) committed: "
                        f"{tokens}. The accepted path stays in the cache; the rest is dropped.",
                        level=depth, tests=len(tested)))
    return phases


def step_at_phase(step: StepTrace, phase: Phase) -> StepTrace:
    """The step as it stood at `phase`: nodes up to the drafted level, statuses only for tests already made.

    Before the walk has reached a node it is `pending` (drafted, not tested yet), not `not_reached`, which would
    say the walk has stopped above it; from the commit phase on the step's own statuses show."""
    if phase.kind == "commit":
        return step
    # The nodes drafted so far are a prefix (draft_stages) and their parents stay valid.
    shown = next((i for i, stage in enumerate(draft_stages(step)) if stage > phase.level), len(step.nodes))
    done = set(tested_nodes(step)[:phase.tests]) if phase.kind == "test" else set()
    nodes = [replace(node, status=node.status if i in done else "pending", u=node.u if i in done else None)
             for i, node in enumerate(step.nodes[:shown])]
    path = [i for i in step.accepted_path if i in done]
    growth = step.growth
    if growth is not None:  # what had grown by then; the draws left out are known once the last wave is drawn
        kept = [k for k, i in enumerate(growth.nodes) if i < shown]
        read = phase.level if phase.kind == "draft" else max(growth.waves, default=0)
        growth = replace(growth, nodes=[growth.nodes[k] for k in kept], values=[growth.values[k] for k in kept],
                         waves=[growth.waves[k] for k in kept], left_out=[],
                         expanded=[i for i in growth.expanded if i < shown
                                   and growth.waves[growth.nodes.index(i)] < read])
    return replace(step, nodes=nodes, accepted_path=path, final_parent=None, growth=growth,
                   verify_mask=[row[:len(nodes)] for row in step.verify_mask[:len(nodes)]])


BEFORE_THE_TESTS = Phase("test", "before the verify", "", level=10**6, tests=0)  # every node drafted, none tested


def before_the_tests(step: StepTrace) -> StepTrace:
    """The step with every candidate drafted and none tested yet: what Play shows while a guess is pending (at
    temperature 0 without the target's p, which tells which candidates pass)."""
    return _before_the_answer(step, step_at_phase(step, BEFORE_THE_TESTS))


@dataclass(frozen=True)
class GuidedView:
    """What the guided step shows at one phase: the step as it stood then, the phase (its text the question when
    a guess is pending), the phase's number and how many there are."""

    step: StepTrace
    phase: Phase
    at: int
    count: int
    asks: bool = False  # the phase is a question waiting for the learner's guess


SEALED_NOTE = (" The tests and the commit wait for your guess: make it in Play (Let me predict first), then walk "
               "them here.")


def sealed_phases(step: StepTrace) -> list[Phase]:
    """The phases a step shows while Play waits for the learner's guess of its commit: the drafting and the Verify,
    nothing decided yet. Their number depends on the tree only, never on the outcome (the test phases, as many as
    the walk made, would tell how far it got)."""
    phases = [phase for phase in step_phases(step) if phase.kind in ("draft", "mask")]
    verify = phases[-1]
    return phases[:-1] + [replace(verify, text=verify.text + SEALED_NOTE)]


def guided_view(run: RunTrace, index: int, at, sealed: bool = False) -> GuidedView:
    """Phase `at` (kept within the step's phases) of step `index` of `run`, as the guided step shows it. `sealed`
    (Play waits for the guess of this step's commit): the sealed phases only, the Verify drawn before the tests."""
    step = run.steps[index]
    phases = sealed_phases(step) if sealed else step_phases(step)
    at = max(0, min(int(at or 0), len(phases) - 1))
    phase = phases[at]
    if sealed:
        shown = before_the_tests(step) if phase.kind == "mask" else _before_the_answer(step, step_at_phase(step, phase))
        return GuidedView(shown, phase, at, len(phases))
    pending = pending_test(run, index, phase.tests) if phase.kind == "test" else None
    if pending is None:
        return GuidedView(shown_at(step, phase), phase, at, len(phases))
    asked = replace(phase, tests=phase.tests - 1, text=node_question(step, pending))
    return GuidedView(_before_the_answer(step, step_at_phase(step, asked)), asked, at, len(phases), asks=True)


def shown_at(step: StepTrace, phase: Phase) -> StepTrace:
    """The step the guided figure draws at `phase`: as it stood then, but at the Verify phase the whole step (its
    mask, the accepted path marked)."""
    return step if phase.kind == "mask" else step_at_phase(step, phase)


def _before_the_answer(step: StepTrace, shown: StepTrace) -> StepTrace:
    """`shown` with the target's p of its untested nodes left out where p answers the question: where the recorded
    `step` was walked greedily (temperature 0), the target's most likely token passes."""
    if step_rule(step) is not GREEDY:
        return shown
    return replace(shown, nodes=[replace(node, p=None) if node.status == "pending" else node
                                 for node in shown.nodes])


def test_node(run: RunTrace, index: int, at: int) -> int | None:
    """The node tested at guided phase `at` of step `index`, or None when that phase is not a test."""
    phases = step_phases(run.steps[index])
    if not 0 <= at < len(phases) or phases[at].kind != "test":
        return None
    return tested_nodes(run.steps[index])[phases[at].tests - 1]
