"""The cost model in one chart: expected speed-up over ar as a function of the acceptance rate, for this step
shape on this device and for the same shape with free verify rows (roughly a GPU), with this run's predicted and
measured speed-ups marked. The break-even line at 1 is where drafting stops paying."""
from __future__ import annotations

import plotly.graph_objects as go

from dynasd.explorer.best_trees import BUDGET_MIN_TESTS, BUDGET_NODES, BestTrees
from dynasd.explorer.cost import (
    RunShape,
    StepCosts,
    chain_tokens_per_step,
    cost_numbers,
    expected_speedup,
    measured_scale,
)

from .style import STATUS_COLORS, TOP_LEGEND, base_layout
from .timeline import rates_text

CURVE_POINTS = 41


def cost_markdown(shape: RunShape, costs: StepCosts, measured: str | None = None, elsewhere: str = "") -> str:
    """The arithmetic behind the chart, with this run's numbers in it. `measured`: when and how this device's
    costs were measured (None: they are modelled from the run's own verify times, and the page says so);
    `elsewhere`: the machine the run's own times were taken on, when it is not this one."""
    n = cost_numbers(shape, costs)
    ms = 1000.0
    source = (f"**Costs {measured}.**" if measured else
              "**Costs modelled from this run's own verify times, not measured on this device** (a line through "
              "the run's few verify sizes; it can be far off).")
    ar_kind = "measured" if measured else "modelled"
    lines = [
        source + (f" This run's own times were taken on another machine ({elsewhere}): its wall time says "
                  "nothing about this one." if elsewhere else ""),
        f"**One ar step** (a one-row target forward) takes **{costs.ar_s * ms:.2f} ms** here ({ar_kind}). This "
        f"run's steps verify **{n['rows']} rows** and run **{n['draft_forwards']} draft forwards** "
        f"({costs.draft_per_forward_s * ms:.2f} ms each, this run's own), so a step costs "
        f"{n['draft_forwards']} × {costs.draft_per_forward_s * ms:.2f} + "
        f"({costs.verify_base_s * ms:.2f} + {n['rows']} × {costs.verify_per_row_s * ms:.3f}) ms = "
        f"**{n['step_s'] * ms:.2f} ms**, i.e. **{n['step_s'] / costs.ar_s:.1f} ar steps**.",
        f"It commits **{shape.tokens_per_step:.2f} tokens per step** (acceptance {shape.acceptance:.2f}), so the "
        f"model expects {shape.tokens_per_step:.2f} / {n['step_s'] / costs.ar_s:.2f} = "
        f"**{n['predicted']:.2f}×**; this run's wall time against the {ar_kind} ar step gives "
        f"**{n['measured']:.2f}×**" + ("" if measured else " (not a measurement: the ar step is modelled)") + ".",
    ]
    if measured and measured_scale(n) < 1.0:
        lines.append(f"**The measurement here contradicts the model**: {n['measured']:.2f}× measured against "
                     f"{n['predicted']:.2f}× expected (the walk, the commit and the page's bookkeeping cost time "
                     "too). Trust the measurement; the best-tree chart below is scaled down by the same ratio.")
    lines.append(f"With free verify rows (verify = one ar step, close to a GPU for small trees) the same steps would "
                 f"give **{n['free_rows']:.2f}×** (a model, not a measurement): the difference is what the "
                 f"{n['rows']} verify rows cost on this device.")
    if n["break_even_acceptance"] is None:
        lines.append(f"**No acceptance rate pays** at depth {shape.depth}: even accepting everything commits "
                     f"{shape.depth + 1} tokens, fewer than the {n['step_s'] / costs.ar_s:.1f} ar steps a step costs. "
                     "A narrower tree (fewer rows) or a cheaper draft would.")
    else:
        lines.append(f"A chain of depth {shape.depth} with this step cost breaks even at acceptance "
                     f"**{n['break_even_acceptance']:.2f}**.")
    if n["break_even_row_cost"] is None:
        lines.append("The draft forwards alone cost more than the tokens they win: fewer levels would pay.")
    else:
        lines.append(f"At these tokens per step it pays while a verify row costs under "
                     f"**{n['break_even_row_cost'] * ms:.3f} ms** (now {costs.verify_per_row_s * ms:.3f} ms).")
    return "\n\n".join(lines)


def cost_figure(shape: RunShape, costs: StepCosts, costs_measured: bool = True) -> go.Figure:
    """Speed-up over ar against acceptance, for a chain of the run's depth at this device's step cost and with
    free verify rows; markers: this run's predicted and measured speed-up at its observed acceptance."""
    n = cost_numbers(shape, costs)
    alphas = [i / (CURVE_POINTS - 1) for i in range(CURVE_POINTS)]
    depth = shape.depth

    def curve(step_s: float) -> list[float]:
        return [round(expected_speedup(chain_tokens_per_step(a, depth), step_s, costs.ar_s), 4) for a in alphas]

    traces = [
        go.Scatter(x=alphas, y=curve(n["step_s"]), mode="lines", name=f"this device ({n['rows']} verify rows)",
                   line=dict(color=STATUS_COLORS["rejected"], width=2),
                   hovertemplate="acceptance %{x:.2f}: %{y:.2f}×<extra></extra>"),
        go.Scatter(x=alphas, y=curve(n["free_rows_s"]), mode="lines", name="free verify rows (GPU-like)",
                   line=dict(color=STATUS_COLORS["bonus"], width=2, dash="dash"),
                   hovertemplate="acceptance %{x:.2f}: %{y:.2f}×<extra></extra>"),
        go.Scatter(x=[shape.acceptance], y=[round(n["predicted"], 4)], mode="markers", name="this run: expected",
                   marker=dict(size=13, symbol="diamond", color=STATUS_COLORS["correction"],
                               line=dict(color="#000", width=1)),
                   hovertemplate="expected %{y:.2f}× at acceptance %{x:.2f}<extra></extra>"),
        go.Scatter(x=[shape.acceptance], y=[round(n["measured"], 4)], mode="markers",
                   name="this run: measured" if costs_measured else "this run: wall time / modelled ar step",
                   marker=dict(size=12, symbol="x", color="#222"),
                   hovertemplate="measured %{y:.2f}×<extra></extra>"),
    ]
    top = max(max(curve(n["free_rows_s"])), n["measured"], n["predicted"], 1.2) * 1.1
    layout = base_layout(f"Expected speed-up over ar, depth {depth}: {n['step_s'] / costs.ar_s:.1f} ar steps per "
                         "step here", height=360)
    layout.update(legend=TOP_LEGEND, margin=dict(l=10, r=10, b=10, t=110),
                  shapes=[dict(type="line", xref="paper", x0=0, x1=1, y0=1, y1=1,
                               line=dict(color="#666", dash="dot"))],
                  annotations=[dict(xref="paper", x=0.0, y=1, yanchor="bottom", xanchor="left", showarrow=False,
                                    text="break-even: as fast as ar", font=dict(size=11, color="#666"))],
                  xaxis=dict(title=dict(text="acceptance rate (per draft level)", standoff=6), range=[0, 1],
                             gridcolor="#eee", automargin=True),
                  yaxis=dict(title="speed-up over ar (×)", range=[0, top], gridcolor="#eee", automargin=True))
    return go.Figure(data=traces, layout=layout)


def budget_figure(best: BestTrees) -> go.Figure:
    """Expected speed-up of the best static tree for each node budget (dynasd/explorer/best_trees.py: from the
    run's own acceptance by sibling rank and this device's costs), with the run's own tree marked when it is a
    static one: how far today's shape is from the best this draft allows here. Every expectation is drawn cut by
    `best.scale`."""
    if not best.p:
        figure = go.Figure(layout=base_layout("Best static tree by node budget", height=200))
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
        traces.append(go.Scatter(
            x=[own.nodes], y=[round(own.speedup * scale, 4)], mode="markers", name=f"this run's tree k={own.text}",
            marker=dict(size=13, symbol="diamond", color=STATUS_COLORS["correction"], line=dict(color="#000", width=1)),
            hovertemplate=f"k={own.text}: {own.nodes} nodes, expected %{{y:.2f}}×<extra></extra>"))
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
    return go.Figure(data=traces, layout=layout)

