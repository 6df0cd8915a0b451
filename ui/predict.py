"""Predict, then reveal, on the page: Play's 'Let me predict first' (the step's verdicts wait for a guess of how
many tokens it commits) and the guided step's 'will this node pass?' buttons; one API endpoint, `predict`
(step, node, guess in; the step's views, the reveal and the score out). The questions and scoring are
dynasd/explorer/predict.py, the hidden views viz/predict.py."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from dynasd.explorer import predict
from dynasd.explorer.inputs import UserError
from viz.guided import step_phases

from . import state
from .status import status_line
from .views import failed, render, step_on_show, unexpected


@dataclass
class PlayPredict:
    """Play's widgets: the guess and its button, the reveal and the score (the toggle is with the settings)."""

    panel: gr.Column
    guess: gr.Number
    reveal_btn: gr.Button
    reveal: gr.Markdown
    score: gr.Markdown


def play_toggle() -> gr.Checkbox:
    """Built with the settings ('Learning modes'): off by default."""
    return gr.Checkbox(False, label="Let me predict first", elem_id="predict-first",
                       info="each Step waits for your guess of how many tokens it commits before its verdicts show")


def play_controls() -> PlayPredict:
    """The guess, Reveal and the score, under the step slider; hidden (taking no room) until predictions are on."""
    with gr.Column(visible=False, elem_id="predict-panel") as panel:
        with gr.Row():
            guess = gr.Number(None, precision=0, label="Tokens this step commits", elem_id="predict-guess",
                              scale=1, min_width=120)
            reveal_btn = gr.Button("Reveal", variant="primary", elem_id="predict-reveal", scale=0, min_width=90)
        reveal = gr.Markdown("", elem_id="predict-reveal-text", label="reveal")
        score = gr.Markdown("", elem_id="predict-score", label="score")
    return PlayPredict(panel, guess, reveal_btn, reveal, score)


def on_toggle(session_id, on, index):
    """The toggle turned on or off: the step on show is drawn again, hidden or revealed."""
    session = state.SESSIONS.get(session_id)
    session.predict_first = bool(on)
    views = render(session, index if session.run is not None and session.run.steps else None,
                   status=status_line("Predict first: Step, guess, Reveal." if on else "Predictions off.", "ok"))
    return views + (gr.Column(visible=bool(on)), predict.score_markdown(session.run))


def on_predict(session_id, step, node, guess):
    """The API's and Play's reveal: score `guess` about step `step` (node -1: how many tokens it commits; a
    node: whether it passes, 1 or 0), then show the step. Returns the views, the reveal and the score."""
    session = state.SESSIONS.get(session_id)
    try:
        if guess is None or guess == "":
            raise UserError("type your guess first")
        with session.lock:
            reveal = predict.predict(session.run, int(step or 0), int(node if node is not None else -1), int(guess))
        return (render(session, int(step or 0), status=status_line(f"Step {int(step or 0)} revealed.", "ok"))
                + (reveal.markdown(), predict.score_markdown(session.run)))
    except Exception as exc:
        return failed(session, exc) + (f"⚠ {exc}" if isinstance(exc, UserError) else "", gr.skip())


def wire_play(toggle: gr.Checkbox, play: PlayPredict, session_id, scrubber, views: list) -> None:
    """Play's events; the reveal is the `predict` API endpoint."""
    toggle.input(on_toggle, [session_id, toggle, scrubber], views + [play.panel, play.score],
                      api_visibility="private", show_progress="hidden")
    commit = gr.Number(predict.COMMIT, visible=False)
    play.reveal_btn.click(on_predict, [session_id, scrubber, commit, play.guess], views + [play.reveal, play.score],
                          api_name="predict", show_progress="hidden")


def guided_controls() -> tuple[gr.Button, gr.Button, gr.Markdown]:
    """The guided step's answer buttons and the reveal line, under the phase's text."""
    with gr.Row(elem_id="guided-predict"):
        passes = gr.Button("It passes", size="sm", elem_id="guess-pass", min_width=100)
        fails = gr.Button("It fails", size="sm", elem_id="guess-fail", min_width=100)
    reveal = gr.Markdown("", elem_id="guided-reveal", label="reveal")
    return passes, fails, reveal


def wire_guided(buttons: tuple, session_id, scrubber, phase, phase_views: list, guided_views) -> None:
    """A guess about the test on show in the guided step; `guided_views(run, index, phase)` draws the phase."""
    passes, fails, reveal = buttons

    def on_guess(session_id, index, at, guess):
        session = state.SESSIONS.get(session_id)
        try:
            run, index, _ = step_on_show(session, index, "nothing to predict yet")
            node = guided_test_node(run, index, int(at or 0))
            if node is None:
                raise UserError("this phase is not a test: go to a Test phase (next phase →) to predict it")
            with session.lock:
                said = predict.predict(run, index, node, guess)
            return (*guided_views(run, index, at), session.id,
                    said.markdown() + " " + predict.score_markdown(run))
        except UserError as exc:
            return (gr.skip(), gr.skip(), gr.skip(), session.id, f"⚠ {exc}")
        except Exception as exc:
            return (gr.skip(), gr.skip(), gr.skip(), session.id, f"⚠ {unexpected(exc)}")

    for button, guess in ((passes, 1), (fails, 0)):
        button.click(lambda sid, i, at, g=guess: on_guess(sid, i, at, g), [session_id, scrubber, phase],
                     phase_views + [reveal], api_visibility="private", show_progress="hidden")


def guided_test_node(run, index: int, at: int) -> int | None:
    """The node tested at guided phase `at` of step `index`, or None when that phase is not a test."""
    phases = step_phases(run.steps[index])
    if not 0 <= at < len(phases) or phases[at].kind != "test":
        return None
    return predict.tested_nodes(run.steps[index])[phases[at].tests - 1]
