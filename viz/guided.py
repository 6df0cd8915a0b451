"""One step replayed phase by phase: each draft level appears (a dynamic tree's: each wave), then the verify mask,
then the walk tests the candidates one at a time, then the commit.

A phase is a view of the recorded step cut at a moment in time: the tree holds only what existed then (later
levels absent, untested nodes grey, no bonus or correction yet), so the same tree figure draws every phase.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import plotly.graph_objects as go

from dynasd.origins import BY_NAME, DRAFT
from dynasd.sampling import passes
from dynasd.trace import StepTrace

from .style import MASK_ACCEPTED, MASK_ATTENDS, MASK_BLOCKED, base_layout, show_token
from .tree import tree_figure


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
    tested = step.tested or [i for i, node in enumerate(step.nodes) if node.status in ("accepted", "rejected")]
    for count, i in enumerate(tested, start=1):
        node = step.nodes[i]
        kept = node.status in ("accepted", "unchosen")
        if node.u is not None and node.q_test:
            below = passes(node.u, node.p_test or 0.0, node.q_test)
            rule = (f"u = {node.u:.3f} {'<' if below else '≥'} min(1, p′/q′) = "
                    f"{min(1.0, (node.p_test or 0.0) / node.q_test):.3f}")
        else:
            rule = "it is the target's argmax" if kept else "it is not the target's argmax"
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
    done = set((step.tested or [])[:phase.tests]) if phase.kind == "test" else set()
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


def guided_figure(step: StepTrace, phase: Phase, root: str | None, lossy: bool = False) -> go.Figure:
    """The tree at a draft, test or commit phase; the verify mask at the mask phase."""
    if phase.kind == "mask":
        return mask_phase_figure(step, root)
    figure = tree_figure(step_at_phase(step, phase), root, lossy=lossy)
    figure.update_layout(title=dict(text=f"Step {step.index} · {phase.title}"))
    return figure


def mask_phase_figure(step: StepTrace, root: str | None) -> go.Figure:
    """The verify mask, compact: one column for the committed text (everyone sees it), then the tree block; rows
    of the accepted path green. Cells carry no hover text, which keeps a 200-node mask to a few kilobytes (the
    Verify mask panel has the detailed view)."""
    path = set(step.accepted_path)
    z = [[1] + [(2 if i in path else 1) if cell == "1" else 0 for cell in row]
         for i, row in enumerate(step.verify_mask)]
    labels = [show_token(root or "root", 8)] + [f"{i}·{show_token(n.token, 6)}" for i, n in enumerate(step.nodes)]
    show = len(labels) <= 48
    figure = go.Figure(go.Heatmap(
        z=z, x=list(range(len(labels))), y=list(range(1, len(labels))), zmin=0, zmax=2, showscale=False,
        colorscale=[[0.0, MASK_BLOCKED], [0.33, MASK_BLOCKED], [0.34, MASK_ATTENDS], [0.66, MASK_ATTENDS],
                    [0.67, MASK_ACCEPTED], [1.0, MASK_ACCEPTED]],
        xgap=1, ygap=1, hoverinfo="skip"))
    layout = base_layout(f"Step {step.index} · Verify: who may see whom (rows score, columns are seen)",
                         height=min(900, 220 + 14 * len(labels)))
    ticks = dict(tickmode="array", tickvals=list(range(len(labels))) if show else None,
                 ticktext=labels if show else None, automargin=True)
    layout.update(xaxis=dict(side="top", tickangle=-60, **ticks),
                  yaxis=dict(autorange="reversed", **{**ticks, "tickvals": list(range(1, len(labels))) if show
                                                      else None, "ticktext": labels[1:] if show else None}),
                  margin=dict(l=10, r=10, b=10, t=130))
    return figure.update_layout(layout)
