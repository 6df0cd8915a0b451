"""What a step's trace means beyond its fields: readings that every view of a step shares.

Why here and not in the figures: the tree, the text panel and the step's story each ask the same questions of a
step (which token the target added after the walk, why an untested node was not tested, whether a lossy step left
the target's own choice), and an answer computed in one figure module would be read by the others from there, or
written again. These are pure functions of a StepTrace (no model), so replayed and example traces answer them too.
"""
from __future__ import annotations

from dataclasses import dataclass

from .options import OptionsError, options_of_run
from .origins import TARGET_ROOT
from .sampling import ACCEPT_RULE, REJECT_RULE, SamplingConfig, passes
from .trace import NodeTrace, RunTrace, StepTrace

FINAL_ORIGINS = ("bonus", "correction", "target")  # how the token the target sampled after the walk is committed


def final_token(step: StepTrace) -> tuple[str, str, int] | None:
    """(token, origin, parent node) of the token the target sampled after the walk, if it is on the tree."""
    if step.final_parent is None or not step.committed_origins:
        return None
    origin = step.committed_origins[-1]
    if origin not in FINAL_ORIGINS:
        return None  # cut off by max new tokens or end of sequence
    return step.committed_tokens[-1], origin, step.final_parent


def drawn_status(step: StepTrace, i: int) -> str:
    """The shown status of node i. The trace calls every untested node `not_reached`; a reader is told the two
    reasons apart: below a rejected (or untested) node, or a sibling tested after an accepted one, which the walk
    never needed (`skipped`)."""
    node = step.nodes[i]
    if node.status != "not_reached":
        return node.status
    siblings = (j for j, other in enumerate(step.nodes) if other.parent == node.parent and j != i)
    if any(step.nodes[j].status == "accepted" for j in siblings):
        return "skipped"
    return "not_reached"


def off_target_commit(step: StepTrace) -> tuple[int, int] | None:
    """(committed target root, the target's top root) when a lossy step committed a root the target ranked below
    its top choice, else None: the moment a target-initialized tree departs from the target's own text."""
    roots = [i for i, n in enumerate(step.nodes) if n.origin == TARGET_ROOT.name]
    if not roots or not step.accepted_path or step.nodes[step.accepted_path[0]].origin != TARGET_ROOT.name:
        return None
    chosen = step.accepted_path[0]
    top = max(roots, key=lambda i: step.nodes[i].p)
    return (chosen, top) if step.nodes[chosen].p < step.nodes[top].p else None


# ---------------------------------------------------------------------------------------------------------------
# The acceptance rule a walk applied, one owner: every page text that states a rule reads it here, and
# tests/test_stated_rules.py derives every node's outcome from the same objects and checks it against the decoder.

PASSED = ("accepted", "unchosen")          # a tested node that passed (unchosen: on a chain that lost the selection)
DECIDED = PASSED + ("rejected",)           # the statuses of a node with a verdict


@dataclass(frozen=True)
class AcceptanceRule:
    """One acceptance rule as the page states it and as a test checks it.

    Why an object: the page shows runs of both kinds, and a sentence true of one is false of the other (at
    temperature 0 a candidate with p ≥ q is rejected whenever another token is the target's most likely). Each
    text that states a rule takes its words from here, each with its condition, and the test that derives the
    decoder's decisions reads `passes` beside them, so a text cannot say one rule while the walk applies another.
    """

    greedy: bool
    when: str            # the rule's condition, as a sentence starts: "At temperature 0"
    short: str           # the same in a figure: "T = 0"
    test: str            # when a candidate passes
    says: str            # the rule in full after its condition: what the help texts say
    correction: str      # where a correction token comes from
    bonus: str           # where a bonus token (or ar's) comes from
    correction_p: str    # the name a correction's hover gives the probability it was committed with

    @property
    def statement(self) -> str:
        """The rule with its condition, as one sentence starts."""
        return f"{self.when} {self.says}"

    def passes(self, node: NodeTrace, target_top: int | None = None) -> bool:
        """Whether a tested node passes: at temperature 0 iff its token is `target_top`, the target's most likely
        token after its parent (which a trace does not record: the caller knows it); when sampling iff
        u < min(1, p′/q′) with the values its test recorded (sampling.passes, the test mcss_walk runs)."""
        if self.greedy:
            return node.token_id == target_top
        return node.u is not None and node.q_test is not None and passes(node.u, node.p_test or 0.0, node.q_test)

    def verdict(self, passed: bool) -> str:
        """A tested node's verdict under this rule, in a hover's few words."""
        outcome = "accept" if passed else "reject"
        if self.greedy:
            return f"{self.short}: {'the' if passed else 'not the'} target's top token → {outcome}"
        return f"{ACCEPT_RULE if passed else REJECT_RULE} → {outcome}"


GREEDY = AcceptanceRule(
    greedy=True, when="At temperature 0", short="T = 0",
    test="it is the target's most likely token after its parent",
    says=("a candidate is accepted only when it is the target's most likely token after its parent, whatever "
          "its p and q (no u is drawn). When no candidate under a node is, the walk stops there and the target's "
          "top token is committed instead (a correction; ti-mcsd adds none)."),
    correction="the target's top token", bonus="the target's top token", correction_p="p (target)")

SAMPLING = AcceptanceRule(
    greedy=False, when="At temperature > 0", short="T > 0", test=ACCEPT_RULE,
    says=(f"a candidate is accepted when {ACCEPT_RULE}, u a uniform draw in [0, 1): always when p′ ≥ q′, else "
          "with probability p′/q′. p′ and q′ are p and q for the first candidate tested under a node; after "
          "rejected siblings p′ is the residual norm(max(p′ − q′, 0)), taken once per rejection, and q′ is q "
          "without the siblings drawn before it without replacement, renormalised. When every candidate under a "
          "node is rejected, the correction token is drawn from that residual (ti-mcsd adds none), which keeps "
          "the output distributed exactly as the target's."),
    correction="drawn from the residual", bonus="drawn from the target's p", correction_p="p_residual")

RULES = (GREEDY, SAMPLING)


def rule_for(sampling: SamplingConfig) -> AcceptanceRule:
    """The rule a decoder with these sampling settings applies: greedy comparison exactly when the decoder takes
    greedy_walk (SamplingConfig.greedy), multi-candidate speculative sampling otherwise."""
    return GREEDY if sampling.greedy else SAMPLING


def node_rule(node: NodeTrace) -> AcceptanceRule | None:
    """The rule a node's own test applied, as the trace records it: a sampled test carries its draw u, a greedy
    comparison none; None for a node without a verdict (never tested, a target root, or not tested yet)."""
    if node.status not in DECIDED or node.origin == TARGET_ROOT.name:
        return None
    return SAMPLING if node.u is not None else GREEDY


def step_rule(step: StepTrace) -> AcceptanceRule | None:
    """The rule a step's walk applied, read from its tested nodes; None when none has a verdict (ar, a lookup
    that found nothing, a target-rooted tree with no tested level, a guided phase before its tests)."""
    return next((rule for rule in map(node_rule, step.nodes) if rule is not None), None)


def run_rule(run: RunTrace) -> AcceptanceRule | None:
    """The rule a run's walks applied: from the sampling settings it was made with, or, for a trace whose
    settings cannot be read, from its steps' records (None when no step tested a candidate)."""
    try:
        return rule_for(options_of_run(run.method, run.config).sampling)
    except OptionsError:
        return next((rule for rule in map(step_rule, run.steps) if rule is not None), None)
