"""Where would it pay? drawn: one bar per target and device with the expected speed-up over ar, and the two numbers
that decide it written on each (the draft's share of a target forward, the acceptance needed to break even), from
dynasd/explorer/measure/where.py's view. Every bar is an expectation (its text says so); rows whose forwards were
measured are solid, modelled ones hatched and named so (meaning never by colour alone); what Compare measured for the
run's method is quoted in the words, never drawn as a bar of the model. Every label is dark text on white. Nothing
is computed here."""
from __future__ import annotations

import plotly.graph_objects as go

from dynasd.explorer.measure.where import WhereItPays, WhereRow

from .style import STATUS_COLORS, Figure, base_layout
from .timeline import rates_text

PAYS, LOSES = STATUS_COLORS["accepted"], STATUS_COLORS["rejected"]


def _break_even(row: WhereRow, depth: int) -> str:
    return f"never at depth {depth}" if row.break_even is None else f"{row.break_even:.2f}"


def share(value: float) -> str:
    """A draft share as a percentage, with a decimal below 10% (a 7B target's 0.4% is not 0%)."""
    return f"{value:.1%}" if value < 0.1 else f"{value:.0%}"


def _verdict(value: float) -> str:
    return "pays" if value >= 1.005 else "loses" if value < 0.995 else "even"


def _label(row: WhereRow) -> str:
    return f"{row.target} · {row.device}" + (" (modelled)" if row.modelled else "")


def _value(row: WhereRow) -> float:
    """The bar's length: the expected speed-up, or for a tree not yet run the speed-up at its break-even (1)."""
    return row.expected if row.expected is not None else (1.0 if row.break_even is not None else 0.0)


def where_figure(view: WhereItPays) -> go.Figure:
    rows, depth = view.rows, view.step.depth
    labels = [_label(r) for r in rows][::-1]  # the first row on top
    shown = rows[::-1]
    values = [round(_value(r), 3) for r in shown]
    verdicts = [_verdict(v) for v in values]
    text = [f"{v:.2f}× expected ({word}) · draft {share(r.draft_share)} · break-even {_break_even(r, depth)}"
            for v, word, r in zip(values, verdicts, shown)]
    bars = go.Bar(
        x=values, y=labels, orientation="h", showlegend=False,
        marker=dict(color=[PAYS if v >= 1 else LOSES for v in values], line=dict(color="#222", width=1),
                    pattern=dict(shape=["/" if r.modelled else "" for r in shown], fgcolor="#222", solidity=0.25)),
        text=text, textposition="outside", cliponaxis=False, textfont=dict(color="#222", size=12),
        customdata=[[r.source, r.how, r.ar_s * 1000, r.step_s * 1000] for r in shown],
        hovertemplate="%{y}: %{x:.2f}× ar (expected)<br>%{customdata[0]}: %{customdata[1]}<br>ar step "
                      "%{customdata[2]:.2f} ms, a step of this tree %{customdata[3]:.2f} ms<extra></extra>")
    top = max(values + [1.0])
    expected = view.step.tokens_per_step is not None
    title = (f"Where would this {view.method} step pay? {view.step.rows} verify rows, {view.step.draft_forwards} "
             f"draft forwards" + (f", {view.step.tokens_per_step:.2f} tokens a step (this run's acceptance)"
                                  if expected else ", break-even only (no run yet)")
             + "<br>draft: one draft forward's share of a target forward · break-even: the acceptance needed"
             + "<br>solid: measured costs · hatched: modelled · the dotted line: as fast as ar")
    layout = base_layout(title, height=160 + 46 * len(rows))
    layout.update(
        margin=dict(l=10, r=10, t=110, b=10),
        xaxis=dict(title="expected speed-up over ar (×)", range=[0, top * 2.6], gridcolor="#eee", automargin=True),
        yaxis=dict(automargin=True, tickfont=dict(size=12, color="#222")),
        shapes=[dict(type="line", x0=1, x1=1, yref="paper", y0=0, y1=1, layer="below",
                     line=dict(color="#444", dash="dot"))])
    return Figure(data=[bars], layout=layout)


def where_markdown(view: WhereItPays, verdict: str) -> str:
    """The table (one line per target and device, the deciding numbers as columns), the verdict sentence and the
    notes that say where each number comes from."""
    depth = view.step.depth
    position = (f"This run's acceptance by position (k = 1, 2, …): {rates_text(list(view.step.per_position))}; "
                f"{view.step.tokens_per_step:.2f} tokens a step." if view.step.tokens_per_step is not None
                else "No run yet: only the break-even acceptance is shown.")
    compared = view.compared
    measured = (f"Measured: {compared.said()}, on this prompt with these settings; every speed-up below is "
                "expected, from costs." if compared is not None else
                "Nothing measured for this method, prompt and settings yet (the Compare tab measures it against ar): "
                "every speed-up below is expected, from costs.")
    lines = [f"**{verdict}**", "", measured, "", position, "",
             "| target | where | source | ar step (ms) | step (ms) | draft share | break-even acceptance | "
             "expected speed-up |", "|---|---|---|---|---|---|---|---|"]
    for r in view.rows:
        expected = f"**{r.expected:.2f}× (expected)**" if r.expected is not None else "–"
        lines.append(f"| {r.target} | {r.device} | {r.source} | {r.ar_s * 1000:.2f} | {r.step_s * 1000:.2f} | "
                     f"{share(r.draft_share)} | {_break_even(r, depth)} | {expected} |")
    lines += ["", f"*draft share*: one draft forward ({view.draft}; one level of the tree as this run drafted it) as a "
              "share of one target forward over one row; *break-even "
              f"acceptance*: the acceptance per level a chain of depth {depth} needs for this step cost to match ar.",
              ""] + [f"- {note}" for note in view.notes]
    return "\n".join(lines)
