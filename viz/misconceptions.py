"""The misconception lab as small multiples: for each acceptance rule (the correct one first), the frequency of
each outcome over many samples against the target's p (outlined), with its total variation and verdict."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dynasd.explorer.lessons.misconceptions import SHORT_NAMES, Position, RuleResult, sampling_noise, visible

from .style import STATUS_COLORS, TOP_LEGEND, base_layout, show_token

PANEL_HEIGHT = 150


def _names(tokens: list[str]) -> list[str]:
    names, seen = [], {}
    for token in tokens:
        name = token if token == "(all others)" else show_token(token, 8)
        seen[name] = seen.get(name, 0) + 1
        names.append(name if seen[name] == 1 else f"{name}·{seen[name]}")  # Plotly merges equal labels
    return names


def lab_figure(position: Position, results: list[RuleResult], samples: int) -> go.Figure:
    names = _names(position.tokens)
    titles = [f"{'✓' if r.correct else '✗'} {short}: TV {r.sampled_tv:.3f} (exact {r.exact_tv:.3f})"
              for r, short in zip(results, SHORT_NAMES)]
    figure = make_subplots(rows=len(results), cols=1, shared_xaxes=True, subplot_titles=titles,
                           vertical_spacing=0.28 / len(results))
    for row, result in enumerate(results, start=1):
        color = STATUS_COLORS["accepted"] if result.correct else STATUS_COLORS["rejected"]
        figure.add_trace(go.Bar(x=names, y=[round(c / samples, 5) for c in result.counts], marker_color=color,
                                name="correct rule: sampled" if result.correct else "wrong rule: sampled",
                                showlegend=row <= 2, legendgroup="correct" if result.correct else "wrong",
                                hovertemplate="%{x}: %{y:.3f}<extra>" + result.name[:40] + "</extra>"), row, 1)
        figure.add_trace(go.Bar(x=names, y=[round(v, 5) for v in position.p], name="p: the target's own",
                                marker=dict(color="rgba(0,0,0,0)", line=dict(color="#222", width=1.5)),
                                showlegend=row == 1, legendgroup="p", hoverinfo="skip"), row, 1)
    layout = base_layout(f"Step {position.step} · each rule against p", height=140 + PANEL_HEIGHT * len(results))
    layout.update(barmode="overlay", bargap=0.25, legend=TOP_LEGEND, margin=dict(l=10, r=10, t=80, b=70))
    figure.update_layout(layout)
    figure.update_annotations(font=dict(size=12), xanchor="left", x=0)
    figure.update_xaxes(tickangle=-45, automargin=True)
    figure.update_yaxes(gridcolor="#eee", automargin=True, rangemode="tozero")
    return figure


def lab_markdown(position: Position, results: list[RuleResult], samples: int, clearest: int | None) -> str:
    lines = [f"p and q at the rejection recorded in **step {position.step}** ({len(position.tokens) - 1} largest "
             f"tokens and the rest pooled), {samples} decisions per rule, two candidates drawn from q each time. "
             f"Sampling noise alone gives a total variation (TV) of about {sampling_noise(position, samples):.3f}."]
    for result in results:
        mark = "✓" if result.correct else "✗"
        lines.append(f"- {mark} **{result.name}**: {result.verdict}.")
    hidden = [r.name for r in results if not r.correct and not visible(r, position, samples)]
    if hidden:
        tip = f" Step {clearest} shows them best." if clearest is not None and clearest != position.step else ""
        lines.append(f"At this position the bias of {len(hidden)} wrong rule(s) is too small to see: p is nearly "
                     f"certain here or q close to it.{tip}")
    return "\n".join(lines)
