"""The run so far: tokens per step by origin, tokens against target forwards, the headline numbers, and the
side-by-side comparison of methods."""
from __future__ import annotations

import plotly.graph_objects as go

from dynasd.trace import TOKEN_ORIGINS, RunTrace

from .style import ORIGIN_NAMES, ORIGIN_STRONG, STATUS_COLORS, base_layout


def off_target_roots(run: RunTrace, upto: int | None = None) -> tuple[int, int]:
    """(steps that committed a target root other than the target's most likely one, steps with target roots).

    This is where target-initialized trees lose fidelity: picking the longest-accepted chain can commit the
    target's 2nd..w-th choice. At temperature 0 every such step makes the text differ from the target's own."""
    off = total = 0
    for step in run.steps[: None if upto is None else upto + 1]:
        roots = [i for i, n in enumerate(step.nodes) if n.origin == "target_root"]
        if not roots or not step.accepted_path:
            continue
        total += 1
        chosen = step.accepted_path[0]
        if step.nodes[chosen].p < max(step.nodes[i].p for i in roots):
            off += 1
    return off, total


def summary_numbers(run: RunTrace, upto: int | None = None) -> dict:
    """run.summary() restricted to the first `upto + 1` steps (the scrubber can look back)."""
    if upto is None or upto >= len(run.steps) - 1:
        return run.summary()
    view = RunTrace(**{**run.__dict__, "steps": run.steps[: upto + 1]})
    view.new_token_ids = [t for s in view.steps for t in s.committed]
    view.seconds = sum(s.draft_seconds + s.verify_seconds + s.accept_seconds for s in view.steps)
    return view.summary()


def summary_markdown(run: RunTrace, upto: int | None = None) -> str:
    s = summary_numbers(run, upto)
    shown = len(run.steps) if upto is None else min(upto + 1, len(run.steps))
    acceptance = "–" if run.method == "ar" else f"{s['acceptance_rate']:.0%}"  # AR drafts nothing
    lines = [
        f"**{run.method}** on *{run.pair}* · draft: {run.draft_label}",
        "",
        "| steps | new tokens | target forwards | tokens / target forward | acceptance rate | tokens / s |",
        "|---|---|---|---|---|---|",
        f"| {shown} | {s['new_tokens']} | {s['target_forwards']} | {s['tokens_per_target_forward']:.2f} | "
        f"{acceptance} | {s['tokens_per_s']:.1f} |",
    ]
    if not run.lossless:
        off, total = off_target_roots(run, upto)
        lines += ["", f"**LOSSY method.** In {off} of {total} steps the committed chain started from a target "
                  "root that was *not* the target's most likely token, so the output can differ from what the "
                  "target alone would write (compare it with `ar` in the Compare tab)."]
    if run.finished:
        lines += ["", f"Run finished ({'end of sequence' if run.finished == 'eos' else 'max new tokens reached'})."]
    return "\n".join(lines)


def _two_panels(left_title: str, right_title: str, split: float = 0.56) -> dict:
    """Layout of two side-by-side panels (x/y left, x2/y2 right); cheaper to build than make_subplots."""
    gap = 0.08
    title = dict(xref="paper", yref="paper", y=1.0, yanchor="bottom", showarrow=False, font=dict(size=13))
    return dict(
        xaxis=dict(domain=[0, split - gap / 2], anchor="y", automargin=True),
        yaxis=dict(anchor="x", automargin=True, gridcolor="#eee"),
        xaxis2=dict(domain=[split + gap / 2, 1], anchor="y2", automargin=True),
        yaxis2=dict(anchor="x2", automargin=True, gridcolor="#eee"),
        annotations=[dict(title, text=left_title, x=(split - gap / 2) / 2, xanchor="center"),
                     dict(title, text=right_title, x=(1 + split + gap / 2) / 2, xanchor="center")],
    )


def timeline_figure(run: RunTrace, current: int | None = None) -> go.Figure:
    """Left: tokens committed per step, stacked by origin. Right: cumulative tokens against target forwards."""
    steps = list(range(len(run.steps)))
    traces = []
    for origin in TOKEN_ORIGINS:
        counts = [s.committed_origins.count(origin) for s in run.steps]
        if any(counts):
            traces.append(go.Bar(x=steps, y=counts, name=ORIGIN_NAMES[origin],
                                 marker=dict(color=ORIGIN_STRONG[origin])))
    tokens, forwards, total_tokens, total_forwards = [], [], 0, 0
    for s in run.steps:
        total_tokens += len(s.committed)
        total_forwards += s.target_forwards
        tokens.append(total_tokens)
        forwards.append(total_forwards)
    traces += [
        go.Scatter(x=steps, y=tokens, mode="lines+markers", name="tokens committed", xaxis="x2", yaxis="y2",
                   line=dict(color=STATUS_COLORS["accepted"], width=3)),
        go.Scatter(x=steps, y=forwards, mode="lines", name="target forwards used", xaxis="x2", yaxis="y2",
                   line=dict(color="#555", width=2)),
        go.Scatter(x=steps, y=tokens, mode="lines", name="target forwards AR would need", xaxis="x2", yaxis="y2",
                   line=dict(color="#d64541", width=2, dash="dash")),
    ]
    layout = {**base_layout(f"Run: {run.method}, {len(run.steps)} steps", height=330),
              **_two_panels("tokens committed per step", "tokens vs target forwards (cumulative)")}
    layout["xaxis"]["title"] = layout["xaxis2"]["title"] = "step"
    layout["yaxis"]["title"] = "tokens"
    if current is not None and 0 <= current < len(run.steps):
        layout["shapes"] = [dict(type="rect", xref="x", yref="paper", x0=current - 0.5, x1=current + 0.5, y0=0,
                                 y1=1, fillcolor="#ffe066", opacity=0.35, line_width=0, layer="below")]
    layout.update(barmode="stack", margin=dict(l=10, r=10, b=10, t=100))  # legend: plotly's default, at the right
    return go.Figure(data=traces, layout=layout)


def compare_rows(runs: dict[str, RunTrace]) -> list[dict]:
    """One row per method; `same text as ar` compares with the target-alone (AR) output when it was run."""
    reference = runs["ar"].text if "ar" in runs else None
    rows = []
    for method, run in runs.items():
        s = run.summary()
        rows.append({
            "method": method + ("" if run.lossless else " (LOSSY)"),
            "new tokens": s["new_tokens"],
            "target forwards": s["target_forwards"],
            "tokens / target forward": round(s["tokens_per_target_forward"], 2),
            "tokens / s": round(s["tokens_per_s"], 1),
            "acceptance rate": None if method == "ar" else round(s["acceptance_rate"], 2),
            "same text as ar": "n/a" if reference is None else ("yes" if run.text == reference else "NO"),
        })
    return rows


def compare_figure(rows: list[dict]) -> go.Figure:
    names = [r["method"] for r in rows]
    colors = [STATUS_COLORS["accepted"] if r["same text as ar"] in ("yes", "n/a") else STATUS_COLORS["correction"]
              for r in rows]
    traces = [go.Bar(x=names, y=[r[key] for r in rows], marker=dict(color=colors), showlegend=False,
                     text=[f"{r[key]}" for r in rows], textposition="outside", cliponaxis=False, xaxis=xa,
                     yaxis=ya)
              for key, xa, ya in (("tokens / s", "x", "y"), ("tokens / target forward", "x2", "y2"))]
    layout = {**base_layout("Same prompt, four methods (orange bar: text differs from ar)", height=340),
              **_two_panels("tokens / s (this machine)", "tokens / target forward (hardware-independent)", 0.5)}
    layout["margin"] = dict(l=10, r=10, b=10, t=100)
    for axis, key in (("yaxis", "tokens / s"), ("yaxis2", "tokens / target forward")):
        layout[axis]["range"] = [0, 1.2 * max([r[key] for r in rows] + [1e-9])]  # room for the value labels
    return go.Figure(data=traces, layout=layout)
