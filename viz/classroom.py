"""A class's answers as the lecturer's screen shows them: the answers to the round on show as bars (the right one
marked only once revealed, so the bars never give it away), and the class's summary as a table."""
from __future__ import annotations

from collections import Counter

import plotly.graph_objects as go

from dynasd.explorer.sessions.classroom import Question, RoundSummary

from .style import STATUS_COLORS, STATUS_GLYPHS, Figure, base_layout

ANSWER_BAR = "#4a5a70"             # every bar before the reveal (white count inside it: 7:1)
WRONG_BAR = STATUS_COLORS["not_reached"]  # after the reveal: light grey, the count in dark ink
RIGHT_BAR = STATUS_COLORS["accepted"]     # dark green, and the ✓ in its label: apart in greyscale too


def answers_figure(question: Question | None, tally: Counter, revealed: bool, learners: int) -> go.Figure:
    """Bars of how many chose each answer (the answers given; after the reveal the right one too, marked ✓)."""
    if question is None:
        figure = Figure(layout=base_layout("Answers: waiting for the lecturer's first step", 180))
        figure.update_layout(xaxis=dict(visible=False), yaxis=dict(visible=False))
        return figure
    shown = [(label, value) for label, value in question.choices
             if tally.get(value) or (revealed and value == question.answer)]
    right = [revealed and value == question.answer for _, value in shown]
    counts = [tally.get(value, 0) for _, value in shown]
    labels = [f"{STATUS_GLYPHS['accepted']} {label}" if ok else label for (label, _), ok in zip(shown, right)]
    answered = sum(tally.values())
    verdict = f": the right answer is {question.label(question.answer)}" if revealed else " (the right one stays " \
              "hidden until the reveal)"
    figure = Figure(go.Bar(
        x=counts, y=labels, orientation="h", text=[str(c) for c in counts], textposition="inside",
        insidetextanchor="start", textfont=dict(size=16, color=["white" if ok or not revealed else "#111"
                                                                for ok in right]),
        marker=dict(color=[RIGHT_BAR if ok else WRONG_BAR if revealed else ANSWER_BAR for ok in right],
                    line=dict(color="#111", width=1)),
        hovertemplate="%{y}: %{x}<extra></extra>"))
    layout = base_layout(f"{answered} of {learners} answered{verdict}", 110 + 36 * max(1, len(shown)))
    layout["margin"] = dict(l=200, r=20, t=70, b=40)
    layout["font"]["size"] = 14
    figure.update_layout(**layout, bargap=0.25,
                         xaxis=dict(title="learners", rangemode="tozero", dtick=max(1, max(counts, default=1) // 5)),
                         yaxis=dict(type="category", autorange="reversed"))
    return figure


def summary_markdown(rows: list[RoundSummary], learners: int) -> str:
    """The class's summary: per step revealed, the share right and the wrong answer given most often (a list, not a
    table: it reads on a phone's width too)."""
    if not rows:
        return "**Class summary:** no step was revealed."
    lines = [f"**Class summary** ({learners} learner(s)):", ""]
    for row in rows:
        share = f"{row.right} of {row.answered} right ({100 * row.share_right:.0f}%)" if row.answered else \
            "no answers"
        wrong = f"{row.common_wrong} ({row.common_wrong_count})" if row.common_wrong else "none"
        lines.append(f"- **Step {row.index}** ({row.question}): right answer **{row.right_answer}**; {share}; most "
                     f"common wrong answer: {wrong}.")
    return "\n".join(lines)
