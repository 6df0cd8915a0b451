"""Why the step went the way it did: per node, the target's probability p against the draft's q (a sampled
acceptance test compares them; at temperature 0 only the target's top token passes, whatever p and q: each bar's
hover gives the test the node met), and per draft level, the early-stop score against the threshold (why drafting
stopped)."""
from __future__ import annotations

import plotly.graph_objects as go

from dynasd.origins import BY_NAME
from dynasd.trace import StepTrace
from dynasd.trace_semantics import drawn_status

from .labels import label_width, strided
from .style import (
    LEGEND_ROOM,
    STATUS_COLORS,
    STATUS_GLYPHS,
    STATUS_PATTERNS,
    STATUS_SHORT,
    TOP_LEGEND,
    Figure,
    base_layout,
    fmt,
    show_token,
)
from .tree import verdict_lines

# Each tick label costs the page ~0.7 ms per redraw (viz/labels.py): token labels for a small tree, node ids (as
# in the mask's rows and the hover) at a stride for a large one.
TOKEN_LABELS_UP_TO_NODES = 16
MAX_ID_TICKS = 12


def pq_figure(step: StepTrace) -> go.Figure:
    """Grouped bars: p (target) and q (draft) of every candidate, in tree order, coloured by status."""
    n = len(step.nodes)
    xs = list(range(n))
    labels = [f"{i}·{show_token(node.token, 6)}" for i, node in enumerate(step.nodes)]
    shown = [drawn_status(step, i) for i in range(n)]  # the tree's statuses: an untested sibling is "not tested"
    hover = []
    for i, node in enumerate(step.nodes):
        ratio = "–" if not node.q else f"{node.p / node.q:.3f}"
        hover.append("<br>".join([f"<b>node {i}</b> {show_token(node.token, 24)} · level {node.level}",
                                  f"p {fmt(node.p)} · q {fmt(node.q)} · p/q {ratio}", *verdict_lines(node),
                                  STATUS_SHORT[shown[i]]]))
    # the status also as a glyph over each bar (where they fit: the page measures each bar's text on a redraw)
    # and a fill pattern: never by colour alone
    glyphs = [STATUS_GLYPHS[status] for status in shown] if n <= TOKEN_LABELS_UP_TO_NODES else None
    traces = [go.Bar(x=xs, y=[node.p for node in step.nodes], name="p: target probability",
                     marker=dict(color=[STATUS_COLORS[status] for status in shown],
                                 line=dict(color="#333", width=0.5),
                                 pattern=dict(shape=[STATUS_PATTERNS[status] for status in shown],
                                              fgcolor="#222", size=6, solidity=0.3)),
                     text=glyphs,
                     textposition="outside", cliponaxis=False, textfont=dict(size=11), hovertext=hover,
                     hoverinfo="text"),
              go.Bar(x=xs, y=[node.q if node.q is not None else 0.0 for node in step.nodes],
                     name="q: draft probability", hoverinfo="skip",  # the p bar's hover has q too
                     marker=dict(color="rgba(0,0,0,0)", line=dict(color="#444", width=1.2)))]
    # level boundaries (shapes and annotations built as lists: one layout update instead of one per line)
    shapes = [dict(type="line", x0=i - 0.5, x1=i - 0.5, y0=0, y1=1, yref="paper",
                   line=dict(color="#999", width=1, dash="dot"))
              for i in range(1, n) if step.nodes[i].level != step.nodes[i - 1].level]
    annotations = []
    for level in sorted({node.level for node in step.nodes}):
        first = next(i for i, node in enumerate(step.nodes) if node.level == level)
        annotations.append(dict(x=first - 0.4, y=0.99, yref="paper", xanchor="left", yanchor="top",
                                # "L2" where a level's bars are too narrow for "level 2" (they ran into each other)
                                text=f"level {level}" if n <= TOKEN_LABELS_UP_TO_NODES else f"L{level}",
                                showarrow=False, font=dict(size=11, color="#666")))
    if not n:
        annotations.append(dict(text="no candidates this step (autoregressive decoding)", showarrow=False,
                                x=0.5, y=0.5, xref="paper", yref="paper"))
    if n <= TOKEN_LABELS_UP_TO_NODES:
        tickvals, ticktext, angle = xs, labels, -60
    else:
        tickvals = strided(n, MAX_ID_TICKS)
        ticktext, angle = [str(i) for i in tickvals], 0
    # fixed margins (automargin draws the figure twice): slanted labels need their height times sin 60°
    label_px = label_width(ticktext, 12) * 0.87 if angle else 16
    layout = base_layout(f"Step {step.index}: p vs q per candidate<br>p filled (status colour), q outlined",
                         height=340 + LEGEND_ROOM)
    layout.update(shapes=shapes, annotations=annotations, barmode="group", bargap=0.25,
                  legend=TOP_LEGEND, margin=dict(l=56, r=10, b=int(label_px + 58), t=100),
                  xaxis=dict(tickmode="array", tickvals=tickvals, ticktext=ticktext, tickangle=angle,
                             range=[-0.6, max(n, 1) - 0.4],
                             title=dict(text="" if angle else "candidate node id", font=dict(size=11), standoff=4)),
                  yaxis=dict(title="probability", range=[0, 1.05], gridcolor="#eee"))
    return Figure(data=traces, layout=layout)


def stop_figure(step: StepTrace) -> go.Figure:
    """Per draft level: every tip's stop score, the best one, and the threshold it had to reach."""
    traces = []
    for scored in step.stop_scores:
        color = STATUS_COLORS["accepted"] if scored.continued else STATUS_COLORS["rejected"]
        traces.append(go.Scatter(
            x=[scored.level] * len(scored.scores), y=scored.scores, mode="markers", showlegend=False,
            marker=dict(size=8, color=color, opacity=0.55),
            hovertemplate=f"level {scored.level}: tip score %{{y:.3f}}<extra></extra>"))
    if step.stop_scores:
        levels = step.stop_scores
        best = [max(scored.scores, default=0.0) for scored in levels]
        traces.append(go.Scatter(
            x=[scored.level for scored in levels], y=best,
            mode="lines+markers", name="best tip score (decides)", line=dict(color="#333"),
            marker=dict(size=12, symbol="diamond",
                        color=[STATUS_COLORS["accepted"] if scored.continued else STATUS_COLORS["rejected"]
                               for scored in levels]),
            hovertext=[f"level {scored.level}: best {b:.3f} → "
                       f"{'draft another level' if scored.continued else 'stop drafting'}"
                       for scored, b in zip(levels, best)],
            hoverinfo="text"))
    shapes, annotations = [], []
    if step.threshold is not None:
        shapes.append(dict(type="line", xref="paper", x0=0, x1=1, y0=step.threshold, y1=step.threshold,
                           line=dict(color=STATUS_COLORS["rejected"], dash="dash"), name="threshold"))
        annotations.append(dict(xref="paper", x=0, y=step.threshold, xanchor="left", yanchor="bottom",
                                showarrow=False, text=f"threshold {step.threshold:.2f}",
                                font=dict(color=STATUS_COLORS["rejected"])))
    if not step.stop_scores:
        why = no_scores_reason(step)
        annotations.append(dict(text=why, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper"))
    depth = max(step.max_depth, 1)
    # Without scores the figure says only why there are none: no step number, so that steps alike draw the same
    # figure and the explorer need not send it again (dynasd/explorer/shown.py).
    title = "early-stop scores per draft level"
    title = f"Step {step.index}: {title}" if step.stop_scores else title.capitalize()
    layout = base_layout(f"{title}<br>stop policy: {step.stop_policy}", height=300 + LEGEND_ROOM)
    layout.update(shapes=shapes, annotations=annotations, legend=TOP_LEGEND,
                  margin=dict(l=10, r=10, b=LEGEND_ROOM, t=100),
                  xaxis=dict(title="after draft level", tickmode="array", tickvals=list(range(1, depth + 1)),
                             range=[0.5, depth + 0.5], automargin=True),
                  yaxis=dict(title="score", range=[0, 1.05], automargin=True, gridcolor="#eee"))
    return Figure(data=traces, layout=layout)


def no_scores_reason(step: StepTrace) -> str:
    """Why a step has no stop scores, in terms of what the method did: a step with no draft model (ar, or
    candidates from prompt lookup or token recycling only) has nothing to end early."""
    if not step.nodes:
        return "no candidates this step: nothing was drafted, so there is nothing to stop"
    if step.draft_forwards == 0:
        sources = " and ".join(BY_NAME[name].source for name in dict.fromkeys(node.origin for node in step.nodes))
        return f"no draft model this step (the candidates came from {sources}): nothing to stop early"
    if step.stop_policy == "none":
        return "no stop policy: the draft builds the full tree"
    return "no level was scored (the tree has a single level, or its roots come from the target)"
