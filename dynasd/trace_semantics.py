"""What a step's trace means beyond its fields: readings that every view of a step shares.

Why here and not in the figures: the tree, the text panel and the step's story each ask the same questions of a
step (which token the target added after the walk, why an untested node was not tested, whether a lossy step left
the target's own choice), and an answer computed in one figure module would be read by the others from there, or
written again. These are pure functions of a StepTrace (no model), so replayed and example traces answer them too.
"""
from __future__ import annotations

from .origins import TARGET_ROOT
from .trace import StepTrace

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
