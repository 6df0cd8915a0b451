"""The empirical losslessness check as a histogram: the target's p over its largest tokens (the rest pooled) and
the observed frequency of each method's first committed token, with each method's chi-square p-value."""
from __future__ import annotations

import plotly.graph_objects as go

from dynasd.explorer.lessons.losslessness import LosslessnessCheck

from .style import STATUS_COLORS, TOP_LEGEND, Figure, base_layout, show_token

METHOD_COLORS = (STATUS_COLORS["accepted"], STATUS_COLORS["correction"], STATUS_COLORS["unchosen"])


def verdict(check: LosslessnessCheck, alpha: float = 1e-3) -> str:
    return "consistent with p" if check.p_value >= alpha else "deviates from p"


def losslessness_markdown(checks: dict[str, LosslessnessCheck], lossless: dict[str, bool]) -> str:
    lines = []
    for method, check in checks.items():
        kind = "lossless" if lossless.get(method, True) else "LOSSY"
        lines.append(f"- **{method}** ({kind}): {check.samples} samples, χ² = {check.statistic:.1f} on {check.dof} "
                     f"degrees of freedom, **p-value {check.p_value:.3g}** ({verdict(check)}); total variation "
                     f"from p {check.total_variation:.3f}.")
    lines.append("A p-value below 0.001 says the counts are very unlikely under the target's p. A lossless method "
                 "falls below it one time in a thousand; a lossy one does as soon as there are enough samples to "
                 "see its skew.")
    return "\n".join(lines)


def losslessness_figure(checks: dict[str, LosslessnessCheck], labels: dict[int, str]) -> go.Figure:
    """Bars per bin: p (outline) and each method's observed frequency. All checks must share their bins."""
    if not checks:
        layout = base_layout("Losslessness check", height=300)
        layout.update(annotations=[dict(text="press Check to sample", showarrow=False, x=0.5, y=0.5,
                                        xref="paper", yref="paper")], xaxis=dict(visible=False),
                      yaxis=dict(visible=False))
        return Figure(layout=layout)
    first = next(iter(checks.values()))
    names = [show_token(labels.get(t, str(t)), 8) if t >= 0 else "(all others)" for t in first.token_ids]
    seen: dict[str, int] = {}
    for i, name in enumerate(names):  # Plotly merges equal category labels
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            names[i] = f"{name}·{seen[name]}"
    traces = [go.Bar(x=names, y=[round(e, 5) for e in first.expected], name="p: the target's own distribution",
                     marker=dict(color="rgba(0,0,0,0)", line=dict(color="#222", width=1.5)))]
    for (method, check), color in zip(checks.items(), METHOD_COLORS):
        traces.append(go.Bar(x=names, y=[round(o / check.samples, 5) for o in check.observed],
                             name=f"{method}: observed (p-value {check.p_value:.3g})", marker=dict(color=color)))
    layout = base_layout(f"First committed token: {first.samples} samples per method against p", height=360)
    layout.update(barmode="group", bargap=0.2, legend=TOP_LEGEND, margin=dict(l=10, r=10, b=10, t=110),
                  xaxis=dict(tickangle=-45, automargin=True),
                  yaxis=dict(title="probability / frequency", gridcolor="#eee", automargin=True))
    return Figure(data=traces, layout=layout)
