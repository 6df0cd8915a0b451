"""Compare drawn: the table's rows as text and the two-panel bar chart, from a Compare's result
(dynasd/explorer/measure/compare.py: CompareResult, numbers measured in interleaved rounds). Each method's speed
against ar, paired round by round, comes first; its own tokens / s second. Nothing is computed here."""
from __future__ import annotations

import plotly.graph_objects as go

from dynasd.explorer.measure.compare import CompareResult, CompareRow

from .style import STATUS_COLORS, Figure, base_layout
from .timeline import CONDITIONAL, LEVEL_RATE, PER_POSITION, TOKENS_PER_S, _two_panels, rates_text

SPREAD = "tokens / s, 90% range"  # over the method's chunks of steps (the peer: its whole runs)
# ar's tokens / s over the chunks paired with the method's: the ratio is the method's over this, where ar's own row
# (every chunk, of every size and round) can read otherwise
AR_SAME_ROUNDS = "ar in the same rounds (tokens / s)"
AGAINST_AR = "× ar, paired (90% range)"  # its chunks against ar's in the same rounds
BY_CPU = "× ar by CPU time"  # the same ratio from this process's CPU time: a cross-check against other work
PER_TARGET_FORWARD = "tokens / target forward"


def against_ar(row: CompareRow) -> str:
    """The row's ratio against ar as a cell: "0.13× (0.12–0.14)", "1×" for ar, "–" where ar was not run."""
    if row.method == "ar":
        return "1×"
    paired = row.against_ar
    return "–" if paired is None else f"{paired.ratio:.2f}× ({paired.low:.2f}–{paired.high:.2f})"


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
        AGAINST_AR: against_ar(row),
        TOKENS_PER_S: round(row.tokens_per_s, 1),
        AR_SAME_ROUNDS: "–" if row.method == "ar" or row.against_ar is None
        else round(row.against_ar.ar_tokens_per_s, 1),
        SPREAD: f"{row.low:.1f}–{row.high:.1f}" + (f" ({row.parts} runs)" if row.peer else ""),
        BY_CPU: "–" if row.against_ar is None or row.against_ar.by_cpu is None else f"{row.against_ar.by_cpu:.2f}×",
        PER_TARGET_FORWARD: round(row.tokens_per_target_forward, 2),
        LEVEL_RATE: "–" if row.acceptance_rate is None else f"{row.acceptance_rate:.0%}",
        PER_POSITION: rates_text(list(row.per_position)),
        CONDITIONAL: rates_text(list(row.conditional)),
        "target forwards": row.target_forwards,
        "new tokens": row.new_tokens,
        "prefill (ms)": round(row.prefill_s * 1000),
        "timed in": (f"{row.parts} whole runs" if row.peer else f"{row.parts} chunks")
                    + ("" if row.finished else " so far")
                    + (f", {row.against_ar.pairs} paired with ar" if row.against_ar is not None else ""),
    } for row in result.rows]


def compare_figure(result: CompareResult) -> go.Figure:
    """Left: each method's speed against ar, paired round by round, with its range (whiskers; where ar was not run,
    its tokens / s and their range instead); right: tokens per target forward. Hatched orange where the text
    differs from ar (not by colour alone). The title names the load the Compare ran under."""
    rows = result.rows
    names = [_name(r) for r in rows]
    differs = [r.same_text_as_ar is False for r in rows]
    colors = [STATUS_COLORS["correction"] if d else STATUS_COLORS["accepted"] for d in differs]
    hatched = ["x" if d else "" for d in differs]
    paired = result.paired
    if paired:
        spans = [r.ratio_span for r in rows]
        speeds = [r.speed for r in rows]
        # the table's cell, so bar, label, hover and table give one rounding of one ratio, its range a ratio range
        labels = [f"{r.speed:.2f}×" for r in rows]
        hover = [f"{against_ar(r)} ar<br>{r.tokens_per_s:.1f} tokens/s" for r in rows]
        left = "× ar, paired with ar<br>round by round"
    else:
        spans = [(r.low, r.high) for r in rows]
        speeds = [r.tokens_per_s for r in rows]
        labels = [f"{v:.1f}" for v in speeds]
        hover = [f"{r.tokens_per_s:.1f} tokens/s ({r.low:.1f}–{r.high:.1f})" for r in rows]
        left = "tokens / s, decoding<br>(this machine)"
    spread = dict(type="data", symmetric=False, color="#555", thickness=1, width=3,
                  array=[round(max(high - v, 0.0), 3) for v, (_, high) in zip(speeds, spans)],
                  arrayminus=[round(max(v - low, 0.0), 3) for v, (low, _) in zip(speeds, spans)])
    forward = [round(r.tokens_per_target_forward, 2) for r in rows]
    traces = [go.Bar(x=names, y=values, showlegend=False,
                     marker=dict(color=colors, pattern=dict(shape=hatched, fgcolor="#222", solidity=0.3)),
                     error_y=spread if xa == "x" else None, text=text, textposition="outside", cliponaxis=False,
                     customdata=hover, hovertemplate="%{x}: %{text}<br>%{customdata}<extra></extra>", xaxis=xa,
                     yaxis=ya)
              for values, text, xa, ya in ((speeds, labels, "x", "y"),
                                           (forward, [f"{v}" for v in forward], "x2", "y2"))]
    busy = result.busy
    # the status above says it in full; a phone's title line holds ~45 characters
    load = (f"<b>{busy.replace('measured on a busy machine: ', 'busy: ')}</b>" if busy
            else "load unknown" if result.load_average is None
            else f"load {result.load_average:.1f} at most, on {result.threads} threads")
    title = (f"Same prompt, {len(rows)} methods in {result.rounds} interleaved rounds<br>{load}<br>"
             "whiskers: 90% range" + (" over paired rounds" if paired else " over chunks")
             + "<br>hatched: text differs from ar")  # a line of its own: one line ran off a phone's width
    layout = {**base_layout(title, height=400),
              **_two_panels(left, "tokens / target forward<br>(any machine)",
                           0.5)}  # two lines each: one would run into the other panel's title on a phone
    layout["margin"] = dict(l=10, r=10, b=10, t=150)
    tops = {"yaxis": speeds + [high for _, high in spans], "yaxis2": forward}
    for axis, top in tops.items():
        layout[axis]["range"] = [0, 1.2 * max(top + [1e-9])]  # room for the value labels
    if paired:
        layout["shapes"] = [dict(type="line", xref="x domain", x0=0, x1=1, yref="y", y0=1, y1=1,
                                 line=dict(color="#666", dash="dot"))]
    return Figure(data=traces, layout=layout)
