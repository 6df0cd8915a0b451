"""The guided step's figure: the tree as it stood at a phase, or the verify mask at the Verify phase. What a phase
is and what the step held then are dynasd/explorer/lessons/phases.py's; this module only draws them."""
from __future__ import annotations

import plotly.graph_objects as go

from dynasd.explorer.lessons.phases import Phase
from dynasd.trace import StepTrace

from .style import MASK_ACCEPTED, MASK_ATTENDS, MASK_BLOCKED, Figure, base_layout, show_token
from .tree import tree_figure


def guided_figure(shown: StepTrace, phase: Phase, root: str | None, lossy: bool = False) -> go.Figure:
    """The tree at a draft, test or commit phase, `shown` as the step stood then (phases.step_at_phase); the
    verify mask at the mask phase."""
    if phase.kind == "mask":
        return mask_phase_figure(shown, root)
    figure = tree_figure(shown, root, lossy=lossy)
    figure.update_layout(title=dict(text=f"Step {shown.index} · {phase.title}"))
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
    figure = Figure(go.Heatmap(
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
