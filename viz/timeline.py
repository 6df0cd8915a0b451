"""The run so far: tokens per step by origin, tokens against target forwards and the headline numbers (Compare's
table and chart are viz/compare.py)."""
from __future__ import annotations

import plotly.graph_objects as go

from dynasd.acceptance import Acceptance, acceptance_of
from dynasd.device_info import shown_device
from dynasd.explorer.measure.speed import ComparedSpeedup, as_it_happened
from dynasd.origins import ORIGINS, TARGET_ROOT
from dynasd.trace import TOKEN_ORIGINS, RunTrace

from .style import LEGEND_ROOM, ORIGIN_NAMES, ORIGIN_STRONG, STATUS_COLORS, TOP_LEGEND, Figure, base_layout


def off_target_roots(run: RunTrace, upto: int | None = None) -> tuple[int, int]:
    """(steps that committed a target root other than the target's most likely one, steps with target roots).

    This is where target-initialized trees lose fidelity: picking the longest-accepted chain can commit the
    target's 2nd..w-th choice. At temperature 0 every such step makes the text differ from the target's own."""
    off = total = 0
    for step in run.steps[: None if upto is None else upto + 1]:
        roots = [i for i, n in enumerate(step.nodes) if n.origin == TARGET_ROOT.name]
        if not roots or not step.accepted_path:
            continue
        total += 1
        chosen = step.accepted_path[0]
        if step.nodes[chosen].p < max(step.nodes[i].p for i in roots):
            off += 1
    return off, total


TOKENS_PER_S = "tokens / s (decoding)"
SPEEDUP = "speed-up over ar"
AS_IT_HAPPENED = "tokens / s, as it happened"
LEVEL_RATE = "draft levels accepted"
PER_POSITION = "per-position acceptance (k = 1, 2, …)"
CONDITIONAL = "conditional acceptance (k = 1, 2, …)"


def rates_text(rates: list[float]) -> str:
    """Rates by draft position as one short cell: "0.82 · 0.55 · 0.31"."""
    return " · ".join(f"{r:.2f}" for r in rates) or "–"


def summary_numbers(run: RunTrace, upto: int | None = None) -> dict:
    """run.summary() over the first `upto + 1` steps (the scrubber can look back), with one definition of speed
    for every view: tokens / s counts the steps' own time (draft + verify + accept) and never the prefill, which
    is reported apart (`prefill_seconds`). A run's total time does include the prefill, and with a long prompt
    it dominated: the same method read 2 tokens / s in one view and 20 in another."""
    steps = run.steps if upto is None else run.steps[: upto + 1]
    view = RunTrace(**{**run.__dict__, "steps": steps})
    view.new_token_ids = [t for s in steps for t in s.committed]
    view.seconds = sum(s.seconds for s in steps)
    numbers = view.summary()
    numbers["prefill_seconds"] = max(0.0, run.seconds - sum(s.seconds for s in run.steps))
    return numbers


def summary_markdown(run: RunTrace, upto: int | None = None, compared: ComparedSpeedup | None = None) -> str:
    """The run so far in one table and its notes. Its speed: the speed-up over ar that Compare measured for the
    run's method, settings and prompt (`compared`, dynasd/explorer/measure/speed.py: compared_here; none yet: a
    dash and where to get one) first, then the run's own tokens / s as it happened (speed.as_it_happened)."""
    s = summary_numbers(run, upto)
    happened = as_it_happened(run, upto)
    shown = len(run.steps) if upto is None else min(upto + 1, len(run.steps))
    drafts = run.method != "ar"  # AR drafts nothing: its acceptance columns say so
    steps = shown if shown == len(run.steps) else f"{shown} of {len(run.steps)}"  # as the timeline counts them
    level_rate = f"{s['acceptance_rate']:.0%}" if drafts else "–"
    speedup = ("1× (ar itself)" if run.method == "ar" else compared.short() if compared is not None
               else "– (not measured: Compare)")
    measured = (f"*{SPEEDUP}*: {compared.said()}, on this prompt with these settings." if compared is not None
                else "" if run.method == "ar" else
                f"*{SPEEDUP}*: not measured for this method, prompt and settings yet: the Compare tab measures "
                "every method against ar in the same rounds.")
    lines = [
        f"**{run.method}** on *{run.pair}* · draft: {run.draft_label}",
        *(["", f"*Measured on* {shown_device(run.device)}"] if run.device else []),
        "",
        f"| steps | new tokens | target forwards | tokens / target forward | {LEVEL_RATE} | {SPEEDUP} | "
        f"{AS_IT_HAPPENED} | prefill |",
        "|---|---|---|---|---|---|---|---|",
        f"| {steps} | {s['new_tokens']} | {s['target_forwards']} | {s['tokens_per_target_forward']:.2f} | "
        f"{level_rate} | {speedup} | {happened.tokens_per_s:.1f} | {s['prefill_seconds'] * 1000:.0f} ms |",
        "",
        *([measured, ""] if measured else []),
        f"*{AS_IT_HAPPENED}*: {happened.said()}; the prompt's prefill is the separate *prefill* column.",
        "",
        f"*tokens / target forward* (the mean acceptance length): the target's own token and the candidate tokens "
        f"({', '.join(o.kind for o in ORIGINS if o.tested)}) it kept, per step. *{LEVEL_RATE}*: of the draft levels "
        "a step tried, the share the kept path reached (the papers' acceptance rate); it counts levels, not nodes, so "
        "a 44-node tree with 1 of 4 levels kept reads 25%, not 2%.",
    ]
    acceptance = acceptance_of(run.steps if upto is None else run.steps[: upto + 1])
    if acceptance.drafts:
        lines += ["", f"*per-position acceptance* {rates_text(acceptance.per_position)} (k = 1, 2, …) · "
                  f"*conditional* {rates_text(acceptance.conditional)}: the chart under the timeline draws both, "
                  "its help says how each is counted."]
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
    # AR spends one forward per token, so "forwards AR would need" is the tokens line itself: one trace named
    # for both (two identical lines hid one under the other)
    traces += [
        go.Scatter(x=steps, y=tokens, mode="lines+markers", name="tokens committed<br>= target forwards AR would need",
                   xaxis="x2", yaxis="y2", line=dict(color=STATUS_COLORS["accepted"], width=3)),
        go.Scatter(x=steps, y=forwards, mode="lines", name="target forwards used", xaxis="x2", yaxis="y2",
                   line=dict(color="#555", width=2)),
    ]
    acceptance = acceptance_of(run.steps)
    title = f"Run: {run.method}, {len(run.steps)} steps"
    if acceptance.drafts:  # the number vLLM reports first, in the title: the panels below have no room for it
        title += f"<br>mean acceptance length {summary_numbers(run)['tokens_per_target_forward']:.2f}"
    layout = {**base_layout(title, height=330 + LEGEND_ROOM),
              **_two_panels("tokens per step", "running totals")}  # short: a panel is ~120 px wide on a phone
    layout["xaxis"]["title"] = layout["xaxis2"]["title"] = "step"
    layout["yaxis"]["title"] = "tokens"
    if current is not None and 0 <= current < len(run.steps):
        layout["shapes"] = [dict(type="rect", xref="x", yref="paper", x0=current - 0.5, x1=current + 0.5, y0=0,
                                 y1=1, fillcolor="#ffe066", opacity=0.35, line_width=0, layer="below")]
    layout.update(barmode="stack", legend=TOP_LEGEND, margin=dict(l=10, r=10, b=LEGEND_ROOM, t=100))
    if acceptance.drafts:
        traces += _acceptance_row(acceptance, layout)
    return Figure(data=traces, layout=layout)


def _acceptance_row(acceptance: Acceptance, layout: dict) -> list[go.Bar]:
    """A second row under the timeline: acceptance by draft position (vLLM's per-position rate and the
    conditional one) and the histogram of accepted lengths, over the run so far."""
    top, bottom = [0.62, 1.0], [0.0, 0.36]
    layout["yaxis"]["domain"] = layout["yaxis2"]["domain"] = top
    for shape in layout.get("shapes", []):  # the step on show is marked in the top row only
        shape["y0"] = top[0]
    for annotation in layout["annotations"]:
        annotation["y"] = top[1]
    split, gap = 0.56, 0.08
    layout.update(
        xaxis3=dict(domain=[0, split - gap / 2], anchor="y3", automargin=True, title="position k", dtick=1),
        yaxis3=dict(domain=bottom, anchor="x3", automargin=True, gridcolor="#eee", range=[0, 1.05],
                    tickformat=".0%"),
        xaxis4=dict(domain=[split + gap / 2, 1], anchor="y4", automargin=True, dtick=1,
                    title="accepted"),
        # no y title: between the panels it would lie over the left one's bars at phone width; the panel's title
        # says what is counted
        yaxis4=dict(domain=bottom, anchor="x4", automargin=True, gridcolor="#eee"),
        height=layout["height"] + 260)
    title = dict(xref="paper", yref="paper", y=bottom[1] + 0.03, yanchor="bottom", showarrow=False,
                 font=dict(size=13))
    layout["annotations"] = list(layout["annotations"]) + [
        dict(title, text="acceptance at k", x=(split - gap / 2) / 2, xanchor="center"),
        dict(title, text="steps by length", x=(1 + split + gap / 2) / 2, xanchor="center")]
    positions = list(range(1, len(acceptance.reached) + 1))
    return [
        # side by side at k - 0.2 and k + 0.2: the timeline's bars above are stacked, and barmode is one per figure
        go.Bar(x=[k - 0.2 for k in positions[:len(acceptance.per_position)]], y=acceptance.per_position, width=0.38,
               xaxis="x3", yaxis="y3", name="per-position acceptance:<br>steps that reached k",
               marker=dict(color="#3a9e8f"), customdata=positions,
               hovertemplate="position %{customdata}: %{y:.0%} of drafting steps accepted a candidate "
                             "here<extra></extra>"),
        go.Bar(x=[k + 0.2 for k in positions], y=acceptance.conditional, width=0.38, xaxis="x3", yaxis="y3",
               name="conditional: accepted at k<br>once the walk got to k", marker=dict(color="#4a78c2"),
               customdata=list(zip(positions, acceptance.passed, acceptance.reached)),
               hovertemplate="position %{customdata[0]}: %{customdata[1]} of %{customdata[2]} steps that got here "
                             "accepted (%{y:.0%})<extra></extra>"),
        go.Bar(x=list(range(len(acceptance.histogram))), y=acceptance.histogram, xaxis="x4", yaxis="y4",
               name="steps by candidates accepted", showlegend=False, marker=dict(color="#777777"),
               hovertemplate="%{y} steps accepted %{x} candidates<extra></extra>"),
    ]
