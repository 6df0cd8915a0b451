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


def answers_figure(question: Question | None, tally: Counter, revealed: bool, learners: int,
                   second: Counter | None = None) -> go.Figure:
    """Bars of how many chose each answer (the answers given; after the reveal the right one too, marked ✓). With a
    second vote, its bars beside the first's: the first vote hatched and labelled "1st", the second solid and
    labelled "2nd" (apart without colour too)."""
    if question is None:
        figure = Figure(layout=base_layout("Answers: waiting for the lecturer's first step", 180))
        figure.update_layout(xaxis=dict(visible=False), yaxis=dict(visible=False))
        return figure
    second_tally = second or Counter()
    shown = [(label, value) for label, value in question.choices
             if tally.get(value) or second_tally.get(value) or (revealed and value == question.answer)]
    right = [revealed and value == question.answer for _, value in shown]
    labels = [f"{STATUS_GLYPHS['accepted']} {label}" if ok else label for (label, _), ok in zip(shown, right)]
    votes = [("1st vote", tally)] if second is None else [("1st vote", tally), ("2nd vote", second)]
    bars = []
    for name, counts_of in votes:
        counts = [counts_of.get(value, 0) for _, value in shown]
        hatched = second is not None and name == "1st vote"
        bars.append(go.Bar(
            x=counts, y=labels, orientation="h", name=name,
            text=[f"{name[:3]}: {c}" if second is not None else str(c) for c in counts], textposition="inside",
            insidetextanchor="start",
            textfont=dict(size=15, color=["white" if (ok or not revealed) and not hatched else "#111"
                                          for ok in right]),
            marker=dict(color=[(RIGHT_BAR if ok else WRONG_BAR if revealed else ANSWER_BAR) if not hatched
                               else "white" for ok in right],
                        pattern=dict(shape="/" if hatched else "", fgcolor=[RIGHT_BAR if ok else ANSWER_BAR
                                                                             for ok in right], solidity=0.35),
                        line=dict(color="#111", width=1)),
            hovertemplate=f"{name} · %{{y}}: %{{x}}<extra></extra>"))
    answered = sum(tally.values())
    counted = f"{answered} of {learners} answered" + ("" if second is None else
                                                       f", {sum(second.values())} in the second vote")
    verdict = f": the right answer is {question.label(question.answer)}" if revealed else " (the right one stays " \
              "hidden until the reveal)"
    figure = Figure(bars)
    layout = base_layout(f"{counted}{verdict}", 110 + 36 * len(votes) * max(1, len(shown)))
    layout["margin"] = dict(l=200, r=20, t=70, b=40)
    layout["font"]["size"] = 14
    most = max((c for _, counts_of in votes for c in counts_of.values()), default=1)
    figure.update_layout(**layout, bargap=0.25, barmode="group", showlegend=second is not None,
                         xaxis=dict(title="learners", rangemode="tozero", dtick=max(1, most // 5)),
                         yaxis=dict(type="category", autorange="reversed"))
    return figure


def summary_markdown(rows: list[RoundSummary], learners: int) -> str:
    """The class's summary: per step revealed, the share right (on each learner's last answer), the wrong answer
    given most often and, after a second vote, how many moved to the right answer (a list, not a table: it reads
    on a phone's width too)."""
    if not rows:
        return "**Class summary:** no step was revealed."
    lines = [f"**Class summary** ({learners} learner(s)):", ""]
    for row in rows:
        share = f"{row.right} of {row.answered} right ({100 * row.share_right:.0f}%)" if row.answered else \
            "no answers"
        wrong = f"{row.common_wrong} ({row.common_wrong_count})" if row.common_wrong else "none"
        second = "" if row.second_answered is None else (
            f" Second vote: {row.second_answered} answered; right {row.first_right} → {row.right}; "
            f"**{row.moved_to_right} moved to the right answer**, {row.moved_from_right} away from it.")
        lines.append(f"- **Step {row.index}** ({row.question}): right answer **{row.right_answer}**; {share}; most "
                     f"common wrong answer: {wrong}.{second}")
    return "\n".join(lines)
