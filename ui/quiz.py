"""Learn → Quiz: a checkpoint quiz built from the run on show (dynasd/explorer/quiz.py), one radio per question;
the `quiz` (build) and `quiz_check` (answers in, marks and score out) API endpoints."""
from __future__ import annotations

import gradio as gr

from dynasd.explorer import quiz
from dynasd.explorer.inputs import UserError

from . import state
from .views import unexpected


def on_build(session_id):
    """The questions of the run on show, one radio each (unused radios hidden)."""
    session = state.SESSIONS.get(session_id)
    try:
        questions = quiz.build_quiz(session.run)
        radios = [gr.Radio(choices=q.choices, value=None, label=f"{i}. {q.text}", visible=True)
                  for i, q in enumerate(questions, start=1)]
        radios += [gr.Radio(visible=False, value=None)] * (quiz.QUESTIONS - len(questions))
        said = (f"{len(questions)} questions about this {session.run.method} run of {len(session.run.steps)} steps: "
                "answer from the figures, then press **Check my answers**.")
        return (*radios, said, "", session.id)
    except UserError as exc:
        return (*[gr.skip()] * quiz.QUESTIONS, f"⚠ {exc}", "", session.id)
    except Exception as exc:
        return (*[gr.skip()] * quiz.QUESTIONS, f"✗ {unexpected(exc)}", "", session.id)


def on_check(session_id, *answers):
    session = state.SESSIONS.get(session_id)
    try:
        questions = quiz.build_quiz(session.run)
        return quiz.marked_markdown(quiz.mark(questions, [a or None for a in answers])), session.id
    except UserError as exc:
        return f"⚠ {exc}", session.id
    except Exception as exc:
        return f"✗ {unexpected(exc)}", session.id


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
    build.click(on_build, [session_id], [*radios, said, marks, session_id], api_name="quiz", show_progress="hidden")
    check.click(on_check, [session_id, *radios], [marks, session_id], api_name="quiz_check", show_progress="hidden")
