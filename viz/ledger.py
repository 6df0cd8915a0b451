"""The KV-cache ledger of one step as a figure: each model's cache as a row of cells (one per position), during
the step (what its forwards wrote: committed rows, then tree rows) and after the commit (the accepted path kept,
the rest cropped, the committed token still pending), with a line where the next step's forward starts. The rows
come from dynasd/explorer/lessons/ledger.py. Before the step's verdict is revealed (predict, then reveal) only what
its forwards wrote is drawn: its tree rows in one colour, and no cache after the commit."""
from __future__ import annotations

import plotly.graph_objects as go

from dynasd.explorer.lessons.ledger import CacheRows, StepLedger, draft_fed_nodes
from dynasd.trace import RunTrace

from .style import STATUS_COLORS, TOP_LEGEND, Figure, base_layout, show_token

WRITTEN = "tree rows (kept or cropped: shown with the reveal)"
SEGMENTS = {  # name -> colour: one legend entry each
    "cached before": "#c9c9c9",
    "read this step (committed)": "#4a78c2",
    "kept (accepted path)": STATUS_COLORS["accepted"],
    "cropped": STATUS_COLORS["rejected"],
    "pending (committed, not cached)": STATUS_COLORS["correction"],
    WRITTEN: STATUS_COLORS["pending"],
}
CONTEXT_SHOWN = 6  # rows cached before the step that are drawn (the rest lie to the left, off the axis)


LABELLED_NODES = 16  # trees up to this size carry each node's label in its cell (larger ones: in the hover)


def _cells(rows: CacheRows, tree_nodes: list[int], path: set[int] | None, tokens: list[str]) -> tuple[list, list]:
    """The cells of one cache during and after the step: (start, length, segment, label) each; `path` None: the
    verdict not shown, every tree row one segment."""
    during = [(0, rows.before, "cached before", ""),
              (rows.before, rows.chain, "read this step (committed)", "")]
    first_tree = rows.before + rows.chain
    for offset, node in enumerate(tree_nodes):
        segment = WRITTEN if path is None else "kept (accepted path)" if node in path else "cropped"
        during.append((first_tree + offset, 1, segment,
                       f"{node}·{show_token(tokens[node], 5)}" if len(tree_nodes) <= LABELLED_NODES else ""))
    after = [(0, rows.after - rows.kept, "cached before", ""),
             (rows.after - rows.kept, rows.kept, "kept (accepted path)", ""),
             (rows.after, rows.pending, "pending (committed, not cached)", "")]
    return during, after


def ledger_figure(run: RunTrace, ledger: list[StepLedger], index: int, verdict: bool = True) -> go.Figure:
    """Both caches of step `index`: what the step wrote, what stayed, where the next step starts (without its
    `verdict`: what it wrote only)."""
    entry, step = ledger[index], run.steps[index]
    tokens = [node.token for node in step.nodes]
    path = set(step.accepted_path) if verdict else None
    lanes: list[tuple[str, list]] = []
    models = [("target", entry.target, list(range(len(step.nodes))))]
    if entry.draft is not None:
        models.append(("draft", entry.draft, draft_fed_nodes(step) if entry.draft_ran else []))
    for model, rows, nodes in models:
        during, after = _cells(rows, nodes, path, tokens)
        lanes += [(f"{model} · this step", during)] + ([(f"{model} · after", after)] if verdict else [])
    lanes.reverse()  # the target on top
    traces, shown_in_legend = [], set()
    for segment, color in SEGMENTS.items():
        xs, ys, bases, texts = [], [], [], []
        for lane, cells in lanes:
            for start, length, name, label in cells:
                if name == segment and length > 0:
                    xs.append(length)
                    ys.append(lane)
                    bases.append(start - 0.5)
                    texts.append(label)
        if xs:
            traces.append(go.Bar(x=xs, y=ys, base=bases, orientation="h", name=segment, marker_color=color,
                                 marker_line=dict(color="white", width=1), text=texts, textposition="inside",
                                 insidetextanchor="middle", textangle=-90, showlegend=segment not in shown_in_legend,
                                 hovertemplate=f"{segment}: rows %{{base:.0f}} + %{{x}}<extra></extra>"))
            shown_in_legend.add(segment)
    figure = Figure(traces)
    left = max(0, min(entry.target.before, entry.draft.before if entry.draft else entry.target.before)
               - CONTEXT_SHOWN)
    # without the verdict the axis ends at the rows written: the committed tokens' end would tell their count
    right = max(entry.target.before + entry.target.chain + entry.target.tree,
                entry.target.committed if verdict else 0,
                (entry.draft.before + entry.draft.chain + entry.draft.tree) if entry.draft else 0) + 1
    annotations, shapes = [], []
    for lane_model, rows in (("target", entry.target), ("draft", entry.draft)) if verdict else ():
        if rows is None:
            continue
        lane = [name for name, _ in lanes].index(f"{lane_model} · after")
        shapes.append(dict(type="line", x0=rows.after - 0.5, x1=rows.after - 0.5, yref="y", y0=lane - 0.45,
                           y1=lane + 0.45, line=dict(color="#222", width=3)))
        annotations.append(dict(x=rows.after - 0.5, y=f"{lane_model} · after", yshift=18, showarrow=False,
                                text=f"next step starts (row {rows.after})", font=dict(size=11), xanchor="left"))
    title = "written, kept, cropped" if verdict else "written (what stays shows with the reveal)"
    layout = base_layout(f"Step {index} · KV cache: {title}", height=230 + 52 * len(lanes))
    layout.update(barmode="overlay", bargap=0.35, legend=TOP_LEGEND, annotations=annotations, shapes=shapes,
                  xaxis=dict(range=[left - 0.5, right + 2], title="cache row (position)", dtick=4, zeroline=False),
                  yaxis=dict(automargin=True), margin=dict(l=10, r=10, t=60, b=150))
    return figure.update_layout(layout)
