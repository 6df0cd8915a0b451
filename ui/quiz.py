"""Learn → Quiz: a checkpoint quiz built from the run on show (dynasd/explorer/lessons/quiz.py), one radio per question;
the `quiz` (build) and `quiz_check` (answers in, marks and score out) API endpoints."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from dynasd.explorer.lessons import quiz
from dynasd.explorer.sessions.session import Session

from .handler import handler
from .views import Views


@dataclass
class QuizViews(Views, named=("radios", "said", "marks", "session_id")):
    """One radio per question (unused ones hidden), what the quiz says, the marks."""

    SAID_IN = "said"
    MARKED = True
    TOAST = False
    radios: tuple = field(default_factory=lambda: tuple(gr.skip() for _ in range(quiz.QUESTIONS)))
    marks: Any = ""

    @classmethod
    def of(cls, session: Session) -> "QuizViews":
        questions = quiz.build_quiz(session.run)
        radios = [gr.Radio(choices=q.choices, value=None, label=f"{i}. {q.text}", visible=True)
                  for i, q in enumerate(questions, start=1)]
        radios += [gr.Radio(visible=False, value=None)] * (quiz.QUESTIONS - len(questions))
        said = (f"{len(questions)} questions about this {session.run.method} run of {len(session.run.steps)} steps: "
                "answer from the figures, then press **Check my answers**.")
        return cls(tuple(radios), said, "", session.id)


@dataclass
class MarksViews(Views, named=("marks", "session_id")):
    """The quiz's marks and score (a failure said in the marks)."""

    SAID_IN = "marks"
    MARKED = True
    TOAST = False


@handler(QuizViews)
def on_build(session):
    """The questions of the run on show, one radio each (unused radios hidden)."""
    return QuizViews.of(session)


@handler(MarksViews)
def on_check(session, *answers):
    marks = quiz.mark(quiz.build_quiz(session.run), [a or None for a in answers])
    return MarksViews(quiz.marked_markdown(marks), session.id)


def quiz_section(session_id) -> None:
    """The Quiz tab's widgets and events, built inside the Learn tab's inner tabs."""
    gr.Markdown("**Checkpoint quiz** on the run on show: every answer is somewhere on this page (each one says "
                "where). Build it again after a new run or a replayed example.", elem_classes="explain")
    build = gr.Button("Build the quiz from the run on show", elem_id="quiz-build")
    said = gr.Markdown("", elem_id="quiz-status", label="quiz status")
    radios = [gr.Radio([], value=None, visible=False, elem_id=f"quiz-q{i}", label=f"question {i}")
              for i in range(1, quiz.QUESTIONS + 1)]
    check = gr.Button("Check my answers", variant="primary", elem_id="quiz-check")
    marks = gr.Markdown("", elem_id="quiz-marks", label="quiz marks")
    build.click(on_build, [session_id], QuizViews(tuple(radios), said, marks, session_id).outputs(), api_name="quiz",
                show_progress="hidden")
    check.click(on_check, [session_id, *radios], MarksViews(marks, session_id).outputs(), api_name="quiz_check",
                show_progress="hidden")
