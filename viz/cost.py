"""The cost model in one chart: expected speed-up over ar as a function of the acceptance rate, for this step
shape on this device and for the same shape with free verify rows, with this run's expected speed-up and, where
Compare measured its method with its settings and prompt, that measurement and its range marked. The break-even
line at 1 is where drafting stops paying. Every number is the run's speed figures (dynasd/explorer/measure/speed.py:
RunSpeed), drawn and written as they are given."""
from __future__ import annotations

import plotly.graph_objects as go

from dynasd.explorer.costs.trees_by_budget import BUDGET_MIN_TESTS, BUDGET_NODES, BestTrees
from dynasd.explorer.measure.speed import RunSpeed

from .style import STATUS_COLORS, TOP_LEGEND, Figure, base_layout
from .timeline import rates_text


def cost_markdown(speed: RunSpeed, why_not_measured: str = "") -> str:
    """Compare's measurement of the run's method first (or that there is none), the model's expectation and why the
    two differ (RunSpeed.why_they_differ), the run's own rate as it happened, then the arithmetic behind the chart
    with this run's numbers in it. `why_not_measured`: why this device's costs could not be measured, said first."""
    text = _arithmetic(speed)
    if speed.costs_measured:
        return text
    if len(set(speed.shape.verify_rows)) == 1:
        text = ("**Every step of this run verified the same number of rows**, so its own times cannot tell the cost "
                "of a row from the cost of a forward: the numbers below treat rows as free (ar = one verify).\n\n"
                + text)
    return f"Could not measure this device ({why_not_measured or 'no reason given'}).\n\n" + text


def _arithmetic(speed: RunSpeed) -> str:
    costs, shape = speed.costs, speed.shape
    ms = 1000.0
    source = (f"Forward costs {speed.costs_said}." + (f" {speed.again_said}" if speed.again_said else "")
              if speed.costs_measured else
              "**Forward costs modelled from this run's own verify times, not measured on this device** (a line "
              "through the run's few verify sizes; it can be far off).")
    ar_kind = "the calibration's" if speed.costs_measured else "modelled"
    lines = [
        speed.why_they_differ(),
        f"This run's own rate: {speed.happened.said()}.",
        source + (f" This run's own times were taken on another machine ({speed.elsewhere}): they say nothing "
                  "about this one." if speed.elsewhere else ""),
        f"**One ar step** ({speed.ar_said}) takes **{costs.ar_s * ms:.2f} ms** here ({ar_kind}). This "
        f"run's steps verify **{speed.rows} rows** and run **{speed.draft_forwards} draft forwards** "
        f"({costs.draft_per_forward_s * ms:.2f} ms each, {speed.draft_said}), so the model's step costs "
        f"{speed.draft_forwards} × {costs.draft_per_forward_s * ms:.2f} + "
        f"({costs.verify_base_s * ms:.2f} + {speed.rows} × {costs.verify_per_row_s * ms:.3f}) ms = "
        f"**{speed.step_s * ms:.2f} ms**, i.e. **{speed.ar_steps_per_step:.1f} ar steps**. It commits "
        f"**{shape.tokens_per_step:.2f} tokens per step** (acceptance {shape.acceptance:.2f}), so the model "
        f"expects {shape.tokens_per_step:.2f} / {speed.ar_steps_per_step:.2f} = {speed.expected_said()}.",
    ]
    if speed.scale < 1.0:
        lines.append(f"Compare's range lies below the model's {speed.expected:.2f}× (expected): the best-tree chart "
                     f"below is scaled down by {speed.scale:.2f}, to Compare's measurement.")
    lines.append(f"With free verify rows (verify = one ar step) the same steps would give "
                 f"**{speed.expected_free_rows:.2f}× (expected)**: the difference is what the "
                 f"{speed.rows} verify rows cost on this device. Whether a GPU or a bigger target would pay is "
                 "Learn → Where would it pay?, from measured costs.")
    if speed.break_even_acceptance is None:
        lines.append(f"**No acceptance rate pays** at depth {shape.depth}: even accepting everything commits "
                     f"{shape.depth + 1} tokens, fewer than the {speed.ar_steps_per_step:.1f} ar steps a step "
                     "costs. A narrower tree (fewer rows) or a cheaper draft would.")
    else:
        lines.append(f"A chain of depth {shape.depth} with this step cost breaks even at acceptance "
                     f"**{speed.break_even_acceptance:.2f}**.")
    if speed.break_even_row_cost is None:
        draft_s, won_s = costs.draft_per_forward_s * speed.draft_forwards, shape.tokens_per_step * costs.ar_s
        lines.append("The draft forwards alone cost more than the tokens they win: fewer levels would pay."
                     if draft_s >= won_s else
                     f"The draft forwards ({draft_s * ms:.1f} ms) and the verify forward's cost before any row "
                     f"({costs.verify_base_s * ms:.1f} ms) already cost more than the tokens they win "
                     f"({won_s * ms:.1f} ms of ar): no row cost would pay; fewer levels or a cheaper draft would.")
    else:
        lines.append(f"At these tokens per step it pays while a verify row costs under "
                     f"**{speed.break_even_row_cost * ms:.3f} ms** (now {costs.verify_per_row_s * ms:.3f} ms).")
    return "\n\n".join(lines)


COMPARED = "Compare: measured against ar"


def cost_figure(speed: RunSpeed) -> go.Figure:
    """Speed-up over ar against acceptance, for a chain of the run's depth at this device's step cost and with
    free verify rows (both expected); markers: this run's expected speed-up at its acceptance and, where Compare
    measured the run's method with its settings and prompt, that measurement with its range."""
    alphas, acceptance = list(speed.curve_acceptance), speed.shape.acceptance
    traces = [
        go.Scatter(x=alphas, y=list(speed.curve_here), mode="lines",
                   name=f"this device, {speed.rows} verify rows (expected)",
                   line=dict(color=STATUS_COLORS["rejected"], width=2),
                   hovertemplate="acceptance %{x:.2f}: %{y:.2f}× (expected)<extra></extra>"),
        go.Scatter(x=alphas, y=list(speed.curve_free_rows), mode="lines", name="verify rows free (expected)",
                   line=dict(color=STATUS_COLORS["bonus"], width=2, dash="dash"),
                   hovertemplate="acceptance %{x:.2f}: %{y:.2f}× (expected)<extra></extra>"),
        go.Scatter(x=[acceptance], y=[round(speed.expected, 4)], mode="markers", name="this run: expected",
                   marker=dict(size=13, symbol="diamond", color=STATUS_COLORS["correction"],
                               line=dict(color="#000", width=1)),
                   hovertemplate="expected %{y:.2f}× at acceptance %{x:.2f}<extra></extra>"),
    ]
    compared = speed.compared
    if compared is not None:
        traces.append(go.Scatter(
            x=[acceptance], y=[round(compared.ratio, 4)], mode="markers", name=COMPARED,
            marker=dict(size=11, symbol="square-open", color="#222", line=dict(width=2)),
            error_y=dict(type="data", symmetric=False, color="#222", thickness=1.5, width=6,
                         array=[round(compared.high - compared.ratio, 4)],
                         arrayminus=[round(compared.ratio - compared.low, 4)]),
            hovertemplate=f"measured by Compare: %{{y:.2f}}× ar ({compared.low:.2f}–{compared.high:.2f}), "
                          f"{compared.measured_at} UTC<extra></extra>"))
    marks = [speed.expected, compared.high if compared else 0.0]
    top = max(max(speed.curve_free_rows), *marks, 1.2) * 1.1
    layout = base_layout(f"Expected speed-up over ar, depth {speed.shape.depth}: {speed.ar_steps_per_step:.1f} ar "
                         "steps per step here", height=360)
    layout.update(legend=TOP_LEGEND, margin=dict(l=10, r=10, b=10, t=110),
                  shapes=[dict(type="line", xref="paper", x0=0, x1=1, y0=1, y1=1,
                               line=dict(color="#666", dash="dot"))],
                  annotations=[dict(xref="paper", x=0.0, y=1, yanchor="bottom", xanchor="left", showarrow=False,
                                    text="break-even: as fast as ar", font=dict(size=11, color="#555"))],
                  xaxis=dict(title=dict(text="acceptance rate (per draft level)", standoff=6), range=[0, 1],
                             gridcolor="#eee", automargin=True),
                  yaxis=dict(title="speed-up over ar (×)", range=[0, top], gridcolor="#eee", automargin=True))
    return Figure(data=traces, layout=layout)


def budget_figure(best: BestTrees) -> go.Figure:
    """Expected speed-up of the best static tree for each node budget (dynasd/explorer/costs/trees_by_budget.py: from
    the run's own acceptance by sibling rank and this device's costs), with the run's own tree marked when it is a
    static one: how far today's shape is from the best this draft allows here. Every expectation is drawn cut by
    `best.scale`."""
    if not best.p:
        figure = Figure(layout=base_layout("Best static tree by node budget", height=200))
        figure.add_annotation(text=f"This run tested no draft candidate {BUDGET_MIN_TESTS} times at any rank: "
                              "run a drafting method (sd, mcsd, dynamic) for more steps.", showarrow=False,
                              x=0.5, y=0.5, xref="paper", yref="paper")
        return figure
    sweep, scale, p = best.sweep, best.scale, best.p
    traces = [go.Scatter(
        x=list(range(1, len(sweep) + 1)), y=[round(c.speedup * scale, 4) for c in sweep], mode="lines+markers",
        name="best static tree of at most n nodes", line=dict(color=STATUS_COLORS["accepted"], width=2),
        marker=dict(size=4), customdata=[[c.text, c.nodes, round(c.tokens_per_step, 2)] for c in sweep],
        hovertemplate="budget %{x}: k=%{customdata[0]} (%{customdata[1]} nodes, %{customdata[2]} tokens a step), "
                      "%{y:.2f}×<extra></extra>")]
    own = best.own
    if own is not None:
        # the run's own expected figure (the Cost model's), so that this method and settings have one on the page
        expected = best.own_expected if best.own_expected is not None else own.speedup
        drawn = f", drawn at {expected * scale:.2f}× (scaled)" if scale < 1.0 else ""
        traces.append(go.Scatter(
            x=[own.nodes], y=[round(expected * scale, 4)], mode="markers", name=f"this run's tree k={own.text}",
            marker=dict(size=13, symbol="diamond", color=STATUS_COLORS["correction"], line=dict(color="#000", width=1)),
            hovertemplate=f"k={own.text}: {own.nodes} nodes, expected {expected:.2f}× (the Cost model's figure for "
                          f"this run){drawn}<extra></extra>"))
    top = best.best
    expected = top.speedup * scale
    scaled = f" (scaled by {scale:.2f}: measured here / expected)" if scale < 1.0 else ""
    headline = (f"Best static tree here: k={top.text} ({top.nodes} nodes), expected {expected:.2f}×" if expected >= 1
                else f"No static tree is expected to beat ar here (best k={top.text}: {expected:.2f}×)")
    layout = base_layout(f"{headline}{scaled}<br>acceptance by rank p = {rates_text(p)}", height=340)
    layout.update(legend=TOP_LEGEND, margin=dict(l=10, r=10, b=10, t=110),
                  shapes=[dict(type="line", xref="paper", x0=0, x1=1, y0=1, y1=1, line=dict(color="#666", dash="dot"))],
                  xaxis=dict(title=dict(text="node budget (verify rows less the root)", standoff=6),
                             range=[0, BUDGET_NODES + 1], gridcolor="#eee", automargin=True),
                  yaxis=dict(title="expected speed-up over ar (×)", rangemode="tozero", gridcolor="#eee",
                             automargin=True))
    return Figure(data=traces, layout=layout)

