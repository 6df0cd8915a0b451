"""Why speculative sampling is exact, in two pictures of one step.

residual_figure: at the rejection that ended the walk, the target's p, the draft's q and the residual
norm(max(p - q, 0)) the correction token was drawn from. The accepted mass min(p, q) plus the residual mass
max(p - q, 0) add up to p, so a committed token follows the target whatever the draft proposed.

acceptance_figure: every tested candidate's acceptance probability min(1, p′/q′) next to the uniform draw u it got;
it was accepted iff u < min(1, p′/q′) (sampling.ACCEPT_RULE, the test mcss_walk runs).
"""
from __future__ import annotations

import plotly.graph_objects as go

from dynasd.sampling import ACCEPT_RULE, REJECT_RULE, passes
from dynasd.trace import StepTrace
from dynasd.trace_semantics import GREEDY

from .style import STATUS_COLORS, TOP_LEGEND, Figure, base_layout, fmt, show_token

P_COLOR = "#4a78c2"
Q_COLOR = "#999999"
RESIDUAL_COLOR = STATUS_COLORS["correction"]


def _message(title: str, text: str, height: int = 300) -> go.Figure:
    layout = base_layout(title, height=height)
    layout.update(xaxis=dict(visible=False), yaxis=dict(visible=False),
                  annotations=[dict(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                                    font=dict(size=13))])
    return Figure(layout=layout)


def residual_explanation(step: StepTrace, greedy: bool) -> str:
    """One paragraph: what the residual picture shows for this step, or why there is none."""
    if greedy:
        return (f"**Temperature 0 (greedy).** {GREEDY.statement} There is no residual: nothing is random, and the "
                "text is exactly what the target alone would write.")
    residual = step.residual
    if residual is None:
        if step.committed_origins and step.committed_origins[-1] == "bonus":
            return ("**No rejection ended this step**: every level was accepted down to a leaf, so the last token is "
                    "a *bonus* drawn from the target's own p below it. The residual appears on steps that end "
                    "with a *correction*.")
        return "**No residual this step** (no candidate was rejected where the step ended)."
    at = "the root" if residual.context == -1 else f"node {residual.context}"
    token = show_token(step.committed_tokens[-1], 16) if step.committed_tokens else "?"
    more = (f" After {residual.rejections} rejections the residual is taken again for each one (and q loses the "
            "rejected token), so what is left is the mass no candidate could claim." if residual.rejections > 1
            else "")
    return (f"**At {at} the walk rejected its candidate(s)**, so the step ends with a token drawn from the "
            f"residual norm(max(p − q, 0)) (orange), not from p. The correction was **{token}**. Where q ≥ p the "
            "draft already proposes the token at least as often as the target wants it, so the residual gives it "
            "nothing; where p > q the draft under-proposes it, and the residual makes up exactly the missing "
            f"mass. Accepted mass min(p, q) + rejected mass × residual = p: the output is exactly the target's.{more}")


def residual_figure(step: StepTrace, greedy: bool) -> go.Figure:
    """Grouped bars over the recorded top tokens: p, q and the normalised residual, the correction outlined."""
    title = f"Step {step.index}: the residual at the rejection"
    if greedy:
        return _message(title, "temperature 0: where no candidate is the target's argmax, its argmax is committed; "
                               "no residual")
    residual = step.residual
    if residual is None:
        return _message(title, "no rejection ended this step (it ends with a bonus from p): no residual")
    labels = [f"{show_token(t, 8)}" for t in residual.tokens]
    # Same-looking tokens (e.g. two byte pieces) stay apart: Plotly merges equal category labels.
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            labels[i] = f"{label}·{seen[label]}"
    correction = step.committed[-1] if step.committed else None
    widths = [3 if t == correction else 0 for t in residual.token_ids]
    hover = [f"<b>{show_token(t, 24)}</b> (id {i})<br>p {fmt(p)} · q {fmt(q)}<br>max(p−q,0) {fmt(max(p - q, 0))}"
             f"<br>residual {fmt(r)}" for t, i, p, q, r in zip(residual.tokens, residual.token_ids, residual.p,
                                                                residual.q, residual.residual)]
    traces = [
        go.Bar(x=labels, y=residual.p, name="p: target", marker=dict(color=P_COLOR), hovertext=hover,
               hoverinfo="text"),
        go.Bar(x=labels, y=residual.q, name="q: draft (first candidate's)", marker=dict(color=Q_COLOR),
               hovertext=hover, hoverinfo="text"),
        go.Bar(x=labels, y=residual.residual, name="residual norm(max(p−q,0)): the correction is drawn here",
               marker=dict(color=RESIDUAL_COLOR, line=dict(color="#000", width=widths)), hovertext=hover,
               hoverinfo="text"),
    ]
    annotations = []
    if correction in residual.token_ids:
        i = residual.token_ids.index(correction)
        annotations.append(dict(x=labels[i], y=max(residual.p[i], residual.q[i], residual.residual[i]),
                                text="★ sampled correction", showarrow=True, arrowhead=2, ax=48, ay=-14,
                                xanchor="left",
                                font=dict(color=RESIDUAL_COLOR, size=12)))
    layout = base_layout(title, height=360)
    top = max(residual.p + residual.q + residual.residual + [0.05])
    layout.update(barmode="group", bargap=0.2, legend=TOP_LEGEND, annotations=annotations,
                  margin=dict(l=10, r=10, b=10, t=110),
                  xaxis=dict(tickangle=-45, automargin=True, title="the largest tokens of p, q and the residual"),
                  yaxis=dict(title="probability", range=[0, top * 1.2], gridcolor="#eee",
                             automargin=True))
    return Figure(data=traces, layout=layout)


def acceptance_rows(step: StepTrace) -> list[dict]:
    """Every tested candidate in test order: min(1, p′/q′) from the values the test used, its u and the verdict.

    Only sampled tests carry u; the verdict is recomputed from them (sampling.passes, as mcss_walk tests), so
    a row whose verdict disagreed with the recorded status would show the mismatch instead of hiding it."""
    order = step.tested or [i for i, node in enumerate(step.nodes) if node.u is not None]
    rows = []
    for i in order:
        node = step.nodes[i]
        if node.u is None or node.p_test is None or not node.q_test:
            continue
        rows.append(dict(node=i, token=node.token, level=node.level, p=node.p_test, q=node.q_test, u=node.u,
                         accept_probability=min(1.0, node.p_test / node.q_test),
                         accepted=passes(node.u, node.p_test, node.q_test), status=node.status))
    return rows


def acceptance_figure(step: StepTrace, greedy: bool) -> go.Figure:
    """Per tested candidate: a bar up to min(1, p′/q′) and a diamond at its u; green when u fell under the bar."""
    title = f"Step {step.index}: each test, min(1, p′/q′) (bar) and the uniform draw u (◆)"
    if greedy:
        return _message(title, "temperature 0: a candidate is accepted iff it is the target's argmax; no u is drawn")
    rows = acceptance_rows(step)
    if not rows:
        return _message(title, "no candidate was tested this step")
    labels = [f"{r['node']}·{show_token(r['token'], 6)}" for r in rows]
    colors = [STATUS_COLORS["accepted"] if r["accepted"] else STATUS_COLORS["rejected"] for r in rows]
    hover = [f"<b>node {r['node']}</b> {show_token(r['token'], 20)} · level {r['level']}<br>p′ {fmt(r['p'])} · "
             f"q′ {fmt(r['q'])}<br>min(1, p′/q′) {fmt(r['accept_probability'])} · u {fmt(r['u'])}<br>"
             f"{'accepted: ' + ACCEPT_RULE if r['accepted'] else 'rejected: ' + REJECT_RULE}" for r in rows]
    traces = [
        go.Bar(x=labels, y=[r["accept_probability"] for r in rows], name="min(1, p′/q′): acceptance probability",
               marker=dict(color=colors, opacity=0.45), hovertext=hover, hoverinfo="text"),
        go.Scatter(x=labels, y=[r["u"] for r in rows], mode="markers", name="u: the uniform draw",
                   marker=dict(symbol="diamond", size=12, color=colors, line=dict(color="#000", width=1)),
                   hovertext=hover, hoverinfo="text"),
    ]
    layout = base_layout(title, height=330)
    layout.update(bargap=0.6 if len(rows) < 4 else 0.25, legend=TOP_LEGEND, margin=dict(l=10, r=10, b=10, t=110),
                  xaxis=dict(title="tested candidates, in test order", tickangle=-45, automargin=True),
                  yaxis=dict(range=[0, 1.05], gridcolor="#eee", automargin=True))
    return Figure(data=traces, layout=layout)
