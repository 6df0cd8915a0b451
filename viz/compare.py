"""Compare drawn: the table's rows as text and the two-panel bar chart, from a Compare's result
(dynasd/explorer/measure/compare.py: CompareResult, numbers measured in interleaved rounds). Nothing is computed
here."""
from __future__ import annotations

import plotly.graph_objects as go

from dynasd.explorer.measure.compare import CompareResult, CompareRow

from .style import STATUS_COLORS, base_layout
from .timeline import CONDITIONAL, LEVEL_RATE, PER_POSITION, TOKENS_PER_S, _two_panels, rates_text

SPREAD = "tokens / s, 90% range"  # over the method's chunks of steps (the peer: its whole runs)
PER_TARGET_FORWARD = "tokens / target forward"


def _name(row: CompareRow) -> str:
    return row.method + ("" if row.lossless else " (LOSSY)")


def _same(row: CompareRow) -> str:
    return "n/a" if row.same_text_as_ar is None else ("yes" if row.same_text_as_ar else "NO")


def compare_table(result: CompareResult) -> list[dict]:
    """The table's rows, the columns a reader compares first coming first (the text check, the speed, its range),
    so they show without scrolling sideways on a laptop."""
    return [{
        "method": _name(row),
        "same text as ar": _same(row),
        TOKENS_PER_S: round(row.tokens_per_s, 1),
        SPREAD: f"{row.low:.1f}–{row.high:.1f}" + (f" ({row.parts} runs)" if row.peer else ""),
        PER_TARGET_FORWARD: round(row.tokens_per_target_forward, 2),
        LEVEL_RATE: "–" if row.acceptance_rate is None else f"{row.acceptance_rate:.0%}",
        PER_POSITION: rates_text(list(row.per_position)),
        CONDITIONAL: rates_text(list(row.conditional)),
        "target forwards": row.target_forwards,
        "new tokens": row.new_tokens,
        "prefill (ms)": round(row.prefill_s * 1000),
        "timed in": f"{row.parts} whole runs" if row.peer else f"{row.parts} chunks"
                    + ("" if row.finished else " so far"),
    } for row in result.rows]


def compare_figure(result: CompareResult) -> go.Figure:
    """Tokens / s with each method's range (whiskers), and tokens per target forward; hatched orange where the
    text differs from ar (not by colour alone). The title names the load the Compare ran under."""
    rows = result.rows
    names = [_name(r) for r in rows]
    differs = [r.same_text_as_ar is False for r in rows]
    colors = [STATUS_COLORS["correction"] if d else STATUS_COLORS["accepted"] for d in differs]
    hatched = ["x" if d else "" for d in differs]
    spread = dict(type="data", symmetric=False, color="#555", thickness=1, width=3,
                  array=[round(r.high - r.tokens_per_s, 2) for r in rows],
                  arrayminus=[round(r.tokens_per_s - r.low, 2) for r in rows])
    values = {TOKENS_PER_S: [round(r.tokens_per_s, 1) for r in rows],
              PER_TARGET_FORWARD: [round(r.tokens_per_target_forward, 2) for r in rows]}
    traces = [go.Bar(x=names, y=values[key], showlegend=False,
                     marker=dict(color=colors, pattern=dict(shape=hatched, fgcolor="#222", solidity=0.3)),
                     error_y=spread if key == TOKENS_PER_S else None,
                     text=[f"{v}" for v in values[key]], textposition="outside", cliponaxis=False, xaxis=xa,
                     yaxis=ya)
              for key, xa, ya in ((TOKENS_PER_S, "x", "y"), (PER_TARGET_FORWARD, "x2", "y2"))]
    busy = result.busy
    load = (f"<b>{busy}</b>" if busy else "load unknown" if result.load_average is None
            else f"load {result.load_average:.1f} at most, on {result.threads} threads")
    title = (f"Same prompt, {len(rows)} methods in {result.rounds} interleaved rounds<br>{load}<br>"
             "whiskers: 90% range over chunks; hatched: text differs from ar")
    layout = {**base_layout(title, height=380),
              **_two_panels("tokens / s, decoding<br>(this machine)", "tokens / target forward<br>(any machine)",
                           0.5)}  # two lines each: one would run into the other panel's title on a phone
    layout["margin"] = dict(l=10, r=10, b=10, t=130)
    tops = {"yaxis": values[TOKENS_PER_S] + [r.high for r in rows], "yaxis2": values[PER_TARGET_FORWARD]}
    for axis, top in tops.items():
        layout[axis]["range"] = [0, 1.2 * max(top + [1e-9])]  # room for the value labels
    return go.Figure(data=traces, layout=layout)
