"""The Play views of a step whose verdicts wait for the learner's guess (predict, then reveal): the step's tree
with every candidate still untested, its verify mask with no accepted row, and everything else as it stood after
the step before (the text, the decisions, the timeline), so that nothing on the page gives the answer away."""
from __future__ import annotations

import plotly.graph_objects as go

from dynasd.explorer.lessons.predict import run_upto
from dynasd.trace import RunTrace, StepTrace

from .decisions import stop_figure
from .mask import mask_figure, max_mask_rows
from .text import text_spans
from .timeline import timeline_figure
from .tree import root_token, tree_figure


def hidden_step_views(run: RunTrace, index: int, untested: StepTrace, before: tuple | None,
                      question: str) -> tuple[list, dict, str, str]:
    """(text spans, figures, summary, story) of step `index` with its verdicts hidden: `untested` is the step
    before its tests (dynasd/explorer/lessons/phases.py before_the_tests). `before`: the views of step index - 1
    (ui/views.py step_views), None for the first step; its summary is shown, while the text and the timeline are
    drawn from the run as it stood before this step (a run's timeline draws every step it holds, and the text
    would mark the step before as "this step")."""
    step = run.steps[index]
    root = root_token(run, index)
    tree = tree_figure(untested, root, lossy=not run.lossless)
    tree.update_layout(title=dict(text=f"Step {index} · before the verify: predict first"))
    mask = mask_figure(untested, max_mask_rows(run, step.max_nodes), root_label=root)
    so_far = run_upto(run, index)
    summary = before[2] if before is not None else ""
    empty: go.Figure | None = None
    shown = dict(tree=tree, mask=mask, pq=empty, stop=stop_figure(step),
                 timeline=timeline_figure(so_far, index - 1) if index else None)
    return text_spans(so_far, index), shown, summary, question
