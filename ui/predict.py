"""Predict, then reveal, on the page: Play's 'Let me predict first' (the step's verdicts wait for a guess of how
many tokens it commits) and the guided step's 'will this node pass?' buttons; one API endpoint, `predict`
(step, node, guess in; the step's views, the reveal and the score out). The questions and scoring are
dynasd/explorer/lessons/predict.py, the hidden views viz/predict.py."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from dynasd.explorer.inputs import UserError
from dynasd.explorer.lessons import phases, predict
from dynasd.explorer.sessions.session import Session

from .handler import handler
from .ledger import LEDGER_FOLLOWS_JS
from .play import controller
from .views import PhaseViews, PredictViews, StepViews, ToggleViews, step_on_show


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


@handler(ToggleViews)
def on_toggle(session, on, index):
    """The toggle turned on or off: the step on show is drawn again, hidden or revealed."""
    said = "Predict first: Step, guess, Reveal." if on else "Predictions off."
    return ToggleViews.of(session, controller(session).predict_first(on, index, said), panel=gr.Column(
        visible=bool(on)), score=predict.score_markdown(session.run))


@handler(PredictViews)
def on_predict(session, step, node, guess):
    """The API's and Play's reveal: score `guess` about step `step` (node -1: how many tokens it commits; a
    node: whether it passes, 1 or 0), then show the step. Returns the views, the reveal and the score."""
    return PredictViews.of(session, controller(session).predict(step, node, guess))


def wire_play(toggle: gr.Checkbox, play: PlayPredict, session_id, scrubber, views: StepViews) -> None:
    """Play's events; the reveal is the `predict` API endpoint. A reveal and the toggle redraw the KV cache tab
    when it is open: its ledger tells the verdict too, and the step on show has not changed."""
    toggle.input(on_toggle, [session_id, toggle, scrubber],
                 ToggleViews(**vars(views), panel=play.panel, score=play.score).outputs(),
                 api_visibility="private", show_progress="hidden").then(
        None, js=LEDGER_FOLLOWS_JS, queue=False, api_visibility="private")
    commit = gr.Number(predict.COMMIT, visible=False)
    play.reveal_btn.click(on_predict, [session_id, scrubber, commit, play.guess],
                          PredictViews(**vars(views), reveal=play.reveal, score=play.score).outputs(),
                          api_name="predict", show_progress="hidden").then(
        None, js=LEDGER_FOLLOWS_JS, queue=False, api_visibility="private")


def guided_controls() -> tuple[gr.Button, gr.Button, gr.Markdown]:
    """The guided step's answer buttons and the reveal line, under the phase's text."""
    with gr.Row(elem_id="guided-predict"):
        passes = gr.Button("It passes", size="sm", elem_id="guess-pass", min_width=100)
        fails = gr.Button("It fails", size="sm", elem_id="guess-fail", min_width=100)
    reveal = gr.Markdown("", elem_id="guided-reveal", label="reveal")
    return passes, fails, reveal


@dataclass
class GuessViews(PhaseViews, named=("reveal",)):
    """The guided step after a guess about its test on show, and the reveal's words."""

    SAID_IN = "reveal"
    MARKED = True
    CLEARED = {}


def guess_views(session: Session, index, at, guess: int) -> GuessViews:
    """Score a guess about the test at guided phase `at` of the step on show, then draw that phase again."""
    run, index, _ = step_on_show(session, index, "nothing to predict yet")
    node = phases.test_node(run, index, int(at or 0))
    if node is None:
        raise UserError("this phase is not a test: go to a Test phase (next phase →) to predict it")
    with session.lock:
        said = predict.predict(run, index, node, guess)
    return GuessViews(**vars(PhaseViews.of(session, index, at)),
                      reveal=said.markdown() + " " + predict.score_markdown(run))


@handler(GuessViews)
def on_guess(session, index, at, guess):
    return guess_views(session, index, at, guess)


def wire_guided(buttons: tuple, session_id, scrubber, phase, phase_views: list) -> None:
    """A guess about the test on show in the guided step."""
    passes, fails, reveal = buttons
    for button, guess in ((passes, 1), (fails, 0)):
        button.click(lambda sid, i, at, g=guess: on_guess(sid, i, at, g), [session_id, scrubber, phase],
                     phase_views + [reveal], api_visibility="private", show_progress="hidden")
