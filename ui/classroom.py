"""A class follows one run, on the page: the lecturer's Class tab (start a class: its code, a link and QR code that
learners can reach, ui/class_address.py; the question; Step, Second vote and Reveal for the class; the answers of
both votes as they come; the summary; the results as CSV) and the learner's page at /class (a route of the same app:
join by code and name, kept as the browser's rejoin token; the lecturer's step; an answer per vote before the
reveal, chosen from a short list or by tapping the candidate on the tree; the outcome and the score). The class
itself (rounds, answers, scores, bounds) is dynasd/explorer/sessions/classroom.py; the answers' bars and the
summary are viz/classroom.py's. No learner runs a model: the lecturer's Step goes through the lecturer's own
session and its controller, and every learner's page draws the lecturer's trace.

Why a route: the learner's page is light (its own config: a handful of components, three figures, no model
controls; the main page's config and scripts are not loaded on a phone), and its address is a link and a QR
code. Why polling: each learner's page asks every POLL_S seconds, without the queue, whether its view changed,
and is answered with the key of what it should show (LearnerView.key): only a new key fetches the views, and the
figures of a round are drawn once for the whole class (`drawn`); a step reaches every page within POLL_S and two
requests (scripts/classroom.py --class-mode measures it).
"""
from __future__ import annotations

import csv
import functools
import html
import io
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import gradio as gr
import segno

import viz
from dynasd.explorer.inputs import UserError
from dynasd.explorer.lessons import phases
from dynasd.explorer.sessions.classroom import (
    FIRST,
    SECOND,
    Ask,
    Classroom,
    LearnerView,
    Phase,
    same_run,
)
from dynasd.explorer.sessions.session import Session
from viz.classroom import answers_figure, summary_markdown
from viz.predict import hidden_step_views

from . import state
from .class_address import learner_address
from .controls import settings_from
from .handler import handler, told
from .page_scripts import figure_view
from .play import controller
from .status import status_line
from .views import StepViews, Views, marked, step_figures

POLL_S = 0.5            # a learner's page asks this often whether the lecturer's step changed
LECTURER_POLL_S = 1.0   # the lecturer's page asks this often for the answers in
CLASS_PATH = "class"
MAX_ADDRESS_CHARS = 300
ASKS = {ask.value: ask for ask in Ask}
LEARNER_FIGURES = ("tree", "mask", "pq")  # a learner's page draws these of the step's figures (no stop, no timeline)
CLASS_PANEL = ("class_status", "answers", "class_summary")  # the lecturer's Class tab: lecturer_fields builds them

CLASS_HELP = ("**Teach a class from this run.** Start a class: learners open the link (or scan the code) on their "
              "phones and pick a name. Each **Step** you take, here or with Step and the lecture keys above, shows "
              "on every learner's page with its verdicts hidden; they answer the question, you see the answers "
              "come in. Peer instruction: let them discuss with their neighbours, open a **Second vote**, and "
              "they answer again; **Reveal** shows everyone the outcome and their score (on their last answer). "
              "**End class** shows the summary; **Results as CSV** downloads every answer and score. Learners "
              "run no model and see no one else's name.")

# The learner's route makes the app multipage, and Gradio's frontend then draws a navbar ("Home") on both pages even
# where gr.Navbar(visible=False) says not to: hidden here, as the two pages ask.
CLASS_CSS = """
.nav-holder { display: none !important; }
#class-code-big { font-size: 2.4em; font-weight: 700; letter-spacing: 0.15em; font-family: ui-monospace, monospace; }
#class-code-big p { margin: 0; }
#class-qr svg { width: 220px; height: 220px; }
#class-follow { display: none !important; }
#class-page { max-width: 760px; margin: 0 auto; }
#class-page #class-choice label { min-height: 44px; font-size: 1.05em; }
#class-page #class-learner-status, #class-page #class-outcome { font-size: 1.1em; }
#class-page .dynasd-figure { min-width: 0; }
#class-tap-hint { min-height: 1.2em; font-size: 0.95em; color: #3d3d45; }
#class-address-warning { border-left: 4px solid #8a4b00; padding-left: 8px; }
@media (max-width: 640px) {
  #class-page { padding: 0; }
  /* the tree keeps room for its labels: it scrolls sideways (and says so above it) rather than squeezing or cutting
     its deepest levels; !important: Gradio's block sets overflow: visible inline */
  #class-page #class-tree { overflow-x: auto !important; width: 0 !important; min-width: 100% !important; }
  #class-page #class-tree::before { content: "Scroll sideways for every level of the tree →"; display: block;
                                    position: sticky; left: 0; font-size: 0.85em; color: #5c5c66; padding: 2px 0 4px; }
  #class-page #class-tree .dynasd-figure { min-width: 560px; }
  #class-page .js-plotly-plot .modebar { display: none !important; }
}
"""

# The lecturer's page: a Step or a reveal made with the page's own buttons or keys changes the status line; the class
# then follows the lecturer's run (a click on the Class tab's hidden button), while a class is on.
FOLLOW_PAGE_JS = """
() => {
  const code = document.getElementById('class-code-big');
  const button = document.getElementById('class-follow');
  if (button && code && code.innerText.trim()) button.click();
}
"""
# The learner's page: a tap (or click) on a candidate in the tree chooses it, when the question lists it (the "rejected
# first" question lists the candidates tested while every test passes); another candidate is said in one line. The
# tree's div is drawn anew each round (figure_view), so the handler is attached to whichever div is on show.
TAP_JS = """
() => {
  const hint = () => document.querySelector('#class-tap-hint');
  const say = (words) => { const box = hint(); if (box) box.textContent = words; };
  let asked = '';
  const attach = () => {
    // a new question or phase (another round, a second vote, the reveal): the last tap's words no longer apply
    const now = [document.querySelector('#class-question'), document.querySelector('#class-learner-status')]
      .map((e) => (e ? e.textContent : '')).join('|');
    if (now !== asked) { asked = now; say(''); }
    const box = document.querySelector('#class-tree .dynasd-figure');
    if (!box || !box.on || box.dynasdTap === box._fullLayout) return;
    box.dynasdTap = box._fullLayout;
    box.on('plotly_click', (event) => {
      const point = event && event.points && event.points[0];
      if (!point || point.customdata === undefined || point.customdata === null) return;
      const node = Number(point.customdata);
      const labels = [...document.querySelectorAll('#class-choice label')];
      if (!labels.length) return;
      const chosen = labels.find((label) => label.textContent.trim().startsWith(`node ${node} ·`));
      if (chosen) {
        chosen.click();
        say(`You chose node ${node}: press Answer to send it.`);
      } else if (labels.some((label) => label.textContent.trim().startsWith('node '))) {
        say(`Node ${node} is not on the list: the walk tests the listed candidates before any other.`);
      } else {
        say('This question is answered from the list below the question.');
      }
    });
  };
  setInterval(attach, 400);
}
"""
# Start: the page's own address, so that the link and its QR code reach this server as the learners see it.
ADDRESS_JS = "(session, address) => [session, window.location.origin + window.location.pathname]"


# -- the learner's page ---------------------------------------------------------------------------------------------
# Each learner event sends only the outputs it sets, as plain values where it can: Gradio rebuilds the component of
# every update it sends (a skip too), ~5 ms each on a 2-core CPU, where a plain value costs a fraction of that. So the
# page's poll (PollViews) answers with the view's key alone; a new key (a `.change`) asks for the views (ShowViews),
# the answers' choices with them (a key changes with the round, its question, this learner's answer, the reveal and
# the end: each time the choices, with the learner's own answer chosen, are the right ones to show).

@dataclass
class LearnerViews(Views):
    """A learner event's outputs. A failure is said in the status line (no toast: the learner's events skip the
    queue, which carries toasts); a learner has no session."""

    SAID_IN = "status"
    TOAST = False

    @classmethod
    def said(cls, message: str, kind: str) -> "LearnerViews":
        return cls(**{cls.SAID_IN: status_line(message, kind)})

    @classmethod
    def failure(cls, session, message: str, kind: str) -> "LearnerViews":
        return cls.said(message, kind)

    @classmethod
    def bare(cls, session, message: str, kind: str) -> "LearnerViews":
        return cls.said(message, kind)


@dataclass
class PollViews(LearnerViews, named=("latest",)):
    """The key of what the learner's page should show (LearnerView.key); a failure is a key of its own."""

    SAID_IN = "latest"

    @classmethod
    def said(cls, message: str, kind: str) -> "PollViews":
        return cls(latest=status_line(message, kind))


@dataclass
class JoinViews(LearnerViews, named=("token", "join_box", "status", "latest", "timer", "stored", "you")):
    """Joined: the join box gives way, the page starts asking, the browser keeps the code, the name and the
    learner's rejoin token (the page's every request carries it). The token comes first: the views that `latest`
    asks for (its .change) go with the token."""

    @classmethod
    def of(cls, klass: Classroom, token: str) -> "JoinViews":
        view = klass.view(token)
        return cls(token, gr.Column(visible=False), status_line(learner_status(klass, view)), view.key,
                   gr.Timer(active=True), [klass.code, view.name, token],
                   f"You are **{view.name}** in this browser: a reload, the link again or another tab of it is you "
                   "too, with your answers.")


@dataclass
class AnswerViews(LearnerViews, named=("status", "latest")):
    """An answer counted: said at once; the views follow the new key."""

    @classmethod
    def of(cls, klass: Classroom, view: LearnerView) -> "AnswerViews":
        return cls(status_line(learner_status(klass, view), "ok"), view.key)


@dataclass
class ShowViews(LearnerViews, named=("status", "question", "outcome", "text", "story", *LEARNER_FIGURES, "asked",
                                     "round_box", "answer_box", "choice", "answer_btn")):
    """What the learner sees now: the status, the question, the outcome and score, the step's text and figures (drawn
    once per round and phase for the class), the round on show (`asked`), the round's box (hidden while there is
    no round yet), the question's box (hidden once the class has ended), the answers to choose from (the learner's
    own chosen) and the Answer button (only while this learner's answer is open)."""

    @classmethod
    def of(cls, klass: Classroom, view: LearnerView) -> "ShowViews":
        current = view.round
        drawn = dict(drawn_for_class(klass))
        drawn["text"] = gr.HighlightedText(drawn["text"], color_map=drawn.pop("colours"))
        return cls(status_line(learner_status(klass, view)), learner_question(view), learner_outcome(view, klass),
                   **drawn, asked=current.number if current else 0,
                   round_box=gr.Column(visible=current is not None),
                   answer_box=gr.Column(visible=view.phase is not Phase.ENDED),
                   choice=gr.Radio(choices=plain_choices(current.question.choices) if current else [],
                                   value=view.mine),
                   answer_btn=gr.Button(interactive=view.phase is Phase.ASKING and view.mine is None))


def plain_choices(choices) -> list[tuple[str, int]]:
    """A question's choices as a radio button shows them: plain text (a label is written for Markdown, with a token
    such as <s> escaped; a radio button's label is text already)."""
    return [(html.unescape(label), value) for label, value in choices]


def learner_question(view: LearnerView) -> str:
    """The question on show; in a second vote, what the learner said first and what to do now."""
    current = view.round
    if current is None or view.phase is Phase.ENDED:
        return ""
    text = f"**{current.question.text}**"
    if current.vote == SECOND and not current.revealed:
        first = current.question.label(view.first) if view.first is not None else "no answer"
        text = (f"**Second vote.** Talk it over with your neighbours, then answer again (your first answer: "
                f"{first}; the second is the one scored).\n\n{text}")
    if current.question.ask is Ask.FIRST_REJECTED and not current.revealed:
        text += "\n\nTap a candidate on the tree, or pick it from the list."
    return text


def learner_status(klass: Classroom, view: LearnerView) -> str:
    you = f"**{view.name}** in class **{klass.code}**"
    current = view.round
    if view.phase is Phase.WAITING:
        return f"{you}: waiting for the lecturer's first step…"
    if view.phase is Phase.ENDED:
        return f"{you}: the class has ended. Your score: **{view.right} of {view.asked}**."
    if view.phase is Phase.REVEALED:
        return f"{you}: step {current.index} revealed. Your score: **{view.right} of {view.asked}**."
    vote = " in the second vote" if current.vote == SECOND else ""
    if view.mine is None:
        return f"{you}: step {current.index} is on show. Predict, then press **Answer**{vote}, before the reveal!"
    return (f"{you}: your answer to step {current.index}{vote} is in (**{current.question.label(view.mine)}**). "
            "Waiting for the reveal…")


def learner_outcome(view: LearnerView, klass: Classroom) -> str:
    current = view.round
    if view.phase is Phase.ENDED:
        return summary_markdown(klass.summary(), len(klass.learners))
    if current is None or not current.revealed:
        return ""
    question, scored = current.question, current.final(view.learner)
    if scored is None:
        mark = f"You did not answer step {current.index}"
    elif scored == question.answer:
        mark = "✓ **Right**"
    else:
        mark = f"✗ **Not quite** (you said {question.label(scored)})"
    moved = " The lecturer moved on before revealing it." if current.moved_on else ""
    return f"{mark}: {question.said}. {question.why}{moved}"


def drawn_for_class(klass: Classroom) -> dict:
    """The text, story and figures of the class's round on show, drawn once per round and phase for every learner
    (kept with the class, not in its state: another process draws them again). One request draws; the pages that
    ask meanwhile wait for it rather than draw it again beside it."""
    frame = klass.frame()
    drawn = klass.drawn.get(frame)
    if drawn is not None:
        return drawn
    with DRAWING[hash(klass.id) % len(DRAWING)]:
        frame = klass.frame()
        if frame not in klass.drawn:
            klass.drawn = {frame: _draw(klass)}
        return klass.drawn[frame]


DRAWING = [threading.Lock() for _ in range(8)]  # by class (a lock is no state: the class stays data)


def _draw(klass: Classroom) -> dict:
    """A learner's light view of the round on show: the text, the story, the tree, the mask and the decisions (no
    timeline, no stop scores); before the reveal the step's verdicts hidden, as Play hides them (viz/predict.py)."""
    current, run = klass.current, klass.run
    if current is None or run is None:
        return dict(text=[], colours={}, story="", **dict.fromkeys(LEARNER_FIGURES))
    index, step = current.index, run.steps[current.index]
    if current.revealed:
        figures = step_figures(run, index)
        spans, story = viz.text_spans(run, index), viz.step_story(run, index)
    else:
        before = (viz.text_spans(run, index - 1), {}, "", "") if index else None
        spans, figures, _, story = hidden_step_views(run, index, phases.before_the_tests(step), before, "")
    figures = {name: None if figures.get(name) is None else figures[name].to_json() for name in LEARNER_FIGURES}
    return dict(text=spans, colours=text_colours(spans), story=story, **figures)


def text_colours(spans) -> dict:
    """The text's colour legend with only the kinds of token this text has (a phone has no room for the rest)."""
    every = viz.text_color_map()
    shown = {label for _, label in spans if label}
    return {label: colour for label, colour in every.items() if label in shown}


def learner_handler(views: type[LearnerViews]) -> Callable:
    """`@learner_handler(ShowViews)` over `def on_x(klass, token, ...) -> ShowViews`: the event's first input is the
    class code; the body gets the class. A failure is said the one way every handler says it (ui/handler.py told),
    in the views' SAID_IN."""
    def wrap(body: Callable) -> Callable:
        @functools.wraps(body)
        def plain(code, *args, **kwargs):
            *_, sent = told(views, None, lambda _: body(state.CLASSES.find(code), *args, **kwargs))
            return sent[0] if len(sent) == 1 else sent  # one output: Gradio takes the value itself
        return plain
    return wrap


@learner_handler(JoinViews)
def on_join(klass, name, token=""):
    """Join under a name, or come back with the browser's rejoin token (a reload, another tab): the page starts
    asking for the class's views."""
    return JoinViews.of(klass, klass.join(name, token))


@learner_handler(PollViews)
def on_poll(klass, token):
    """A learner's page asking what it should show: the key alone (the views follow only when it changed)."""
    return PollViews(klass.view(token).key)


@learner_handler(ShowViews)
def on_show(klass, token):
    return ShowViews.of(klass, klass.view(token))


@learner_handler(AnswerViews)
def on_answer(klass, token, number, choice):
    """A learner's answer to round `number` (the round the page shows), in the vote open now."""
    return AnswerViews.of(klass, klass.answer(token, number, choice))


def on_learner_open(stored, request: gr.Request):
    """Page load: the link's code in the code box; a browser that joined this class before (a reload, another tab,
    the link again) comes back as the same learner at once, with its rejoin token. What the learner may have typed
    already is kept (a skip) when there is nothing to put in its place."""
    code = str(dict(request.query_params).get("code", "") if request else "")[:32]
    known = list(stored) if isinstance(stored, (list, tuple)) and len(stored) == 3 else ["", "", ""]
    same = bool(code) and str(known[0]).upper() == code.upper()
    name, token = (str(known[1]), str(known[2])) if same else ("", "")
    joined = on_join(code, name, token) if token else JoinViews().outputs()
    return (code or gr.skip(), name or gr.skip(), *joined)


def learner_page(demo: gr.Blocks) -> None:
    """The learner's page: a route of the app (`/class?code=CODE`), phone width first."""
    with demo.route("Class", f"/{CLASS_PATH}", show_in_navbar=False):
        gr.Navbar(visible=False)  # a learner has no way to the lecturer's page
        learner_column(demo)


def learner_column(demo: gr.Blocks) -> None:
    """The learner's page's components and events (phone width first: one column, the question above the step)."""
    with gr.Column(elem_id="class-page"):
        gr.Markdown("## DynaSD Explorer · class", elem_id="class-title")
        with gr.Column(elem_id="class-join") as join_box:
            code = gr.Textbox(label="Class code", max_lines=1, elem_id="class-code-box")
            name = gr.Textbox(label="Your name (others never see it)", max_lines=1, elem_id="class-name-box")
            join_btn = gr.Button("Join", variant="primary", elem_id="class-join-btn")
        status = gr.Markdown(status_line("Type the class code and your name, then press **Join**."), label="status",
                             elem_id="class-learner-status")
        you = gr.Markdown("", label="who you are", elem_id="class-you")
        # shown once there is a round: the question, then the lecturer's step (its text, story and figures)
        with gr.Column(visible=False, elem_id="class-round") as round_box:
            with gr.Column(elem_id="class-answer-box") as answer_box:
                question = gr.Markdown("", label="question", elem_id="class-question")
                choice = gr.Radio([], label="Your answer", elem_id="class-choice")
                # the round's choices change with each round: the answer is checked against them by the class
                # (Classroom.answer), not by Gradio against the choices the page was built with
                choice.preprocess = lambda payload: payload
                gr.HTML("<div id='class-tap-hint' aria-live='polite'></div>", padding=False)
                answer_btn = gr.Button("Answer", variant="primary", elem_id="class-answer-btn")
            outcome = gr.Markdown("", label="outcome and score", elem_id="class-outcome")
            text = gr.HighlightedText(label="Generated text", color_map=viz.text_color_map(), show_legend=True,
                                      show_inline_category=False, combine_adjacent=False, elem_id="class-text")
            story = gr.Markdown("", label="step story", elem_id="class-story")
            tree = figure_view("Candidate tree", "class-tree")
            mask = figure_view("Verify mask", "class-mask")
            pq = figure_view("Decisions: p vs q per candidate", "class-pq")
        asked = gr.Number(0, visible=False, precision=0, label="round on show")
        latest = gr.Textbox("", visible=False, label="view to show")
        timer = gr.Timer(POLL_S, active=False)
        token = gr.Textbox("", visible=False, label="rejoin token")
        # code, name and rejoin token: every tab of this browser is one learner (localStorage is shared by its tabs)
        stored = gr.BrowserState(["", "", ""], storage_key="dynasd-class-learner")
        # No learner event waits in the queue (none runs a model): each is a plain request, as the page's poll
        quiet = dict(show_progress="hidden", queue=False)
        # the page's own plumbing (what a page shows, its timer and browser state): callable, as the measuring
        # scripts call it, but not documented as the app's API
        plumbing = dict(quiet, api_visibility="undocumented")
        joined = JoinViews(token, join_box, status, latest, timer, stored, you).outputs()
        join_btn.click(on_join, [code, name, token], joined, api_name="class_join", **plumbing)
        name.submit(on_join, [code, name, token], joined, api_visibility="private", **quiet)
        timer.tick(on_poll, [code, token], [latest], api_name="class_poll", **plumbing)
        shown = ShowViews(status, question, outcome, text, story, tree, mask, pq, asked, round_box, answer_box,
                          choice, answer_btn)
        latest.change(on_show, [code, token], shown.outputs(), api_name="class_show", **plumbing)
        answer_btn.click(on_answer, [code, token, asked, choice], [status, latest], api_name="class_answer",
                         **plumbing)
        demo.load(on_learner_open, [stored], [code, name, *joined], api_visibility="private", **quiet)
        demo.load(None, js=TAP_JS, api_visibility="private", queue=False)


# -- the lecturer's Class tab -----------------------------------------------------------------------------------------

@dataclass
class ClassPanel(Views, named=(*CLASS_PANEL, "session_id")):
    """The lecturer's Class tab as each action updates it: its status line, the answers' bars and the summary. A
    failure is said in the class's status line (marked ⚠ or ✗), with a toast."""

    SAID_IN = "class_status"
    MARKED = True

    @classmethod
    def of(cls, klass: Classroom, said: str | None = None, **more) -> "ClassPanel":
        """The class as its lecturer sees it: the answers to the round on show (their count, never a name)."""
        return cls(**lecturer_fields(klass, said), session_id=klass.lecturer_session, **more)


@dataclass
class ClassStartViews(ClassPanel, named=("code", "token", "link", "qr")):
    """A class started (or ended): its panel, its code, the lecturer's token, the link and its QR code."""


@dataclass
class ClassKeyViews(Views, named=("key", "session_id")):
    """The lecturer's poll: the key of the answers in (lecturer_key); the panel follows only when it changed."""

    SAID_IN = "key"
    MARKED = True
    TOAST = False


@dataclass
class ClassStepViews(StepViews, named=CLASS_PANEL):
    """The lecturer's Step or Reveal for the class: the page's step views and the class's panel."""

    @classmethod
    def failure(cls, session: Session, message: str, kind: str) -> "ClassStepViews":
        views = super().failure(session, message, kind)
        views.class_status = marked(message, kind)
        return views


def lecturer_fields(klass: Classroom, said: str | None = None) -> dict:
    current = klass.current
    summary = summary_markdown(klass.summary(), len(klass.learners)) if klass.ended else ""
    answers = answers_figure(current.question if current else None, current.tally(FIRST) if current else {},
                             bool(current and current.revealed), len(klass.learners),
                             second=current.tally(SECOND) if current and current.second is not None else None)
    return dict(class_status=status_line(said or lecturer_status(klass), "ok" if said else "info"),
                answers=answers.to_json(), class_summary=summary)


def lecturer_key(klass: Classroom) -> str:
    current = klass.current
    answered = len(current.answers) + len(current.second or {}) if current else 0
    return f"{klass.id}.{klass.version}.{len(klass.learners)}.{answered}"


def lecturer_status(klass: Classroom) -> str:
    current, learners = klass.current, len(klass.learners)
    joined = f"Class **{klass.code}**: {learners} learner(s) joined"
    if klass.ended:
        return f"{joined}. The class has ended: the summary is below."
    if current is None:
        return f"{joined}. Press **Step** (here, or above) to show the class a step; it asks: {klass.ask.value}"
    answers = f"{len(current.answers)} of {learners} answered"
    if current.second is not None:
        answers += f", {len(current.second)} of {learners} in the second vote"
    if current.revealed:
        return f"{joined}. Step {current.index} revealed ({answers}). Step on for the next question."
    if current.second is None:
        return (f"{joined}. Step {current.index}: {answers}. Let them discuss and open a **Second vote**, or "
                "press **Reveal**.")
    return f"{joined}. Step {current.index}: {answers}. Press **Reveal** when the second vote is in."


def class_link(address: str, code: str) -> tuple[str, str]:
    """The learner's link and, when phones cannot open it, the warning that says so (ui/class_address.py): from
    this page's address (as the lecturer's browser sees it) and how the server listens."""
    page = address if isinstance(address, str) and address.startswith(("http://", "https://")) \
        and len(address) <= MAX_ADDRESS_CHARS and not any(c in address for c in "\"'<> ") else ""
    reach = learner_address(page) if page else None
    base = reach.base if reach else ""
    return f"{base.rstrip('/')}/{CLASS_PATH}?code={code}", reach.warning if reach else ""


def qr_svg(link: str) -> str:
    """The link as a QR code (inline SVG: black on white, with a quiet zone) for the lecture screen."""
    return segno.make(link, error="m").svg_inline(scale=6, dark="#000000", light="#ffffff", title=f"QR code: {link}")


def prime(klass: Classroom) -> Classroom:
    """Draw the round on show for the learners now, before their pages ask (the lecturer's request pays once)."""
    drawn_for_class(klass)
    return klass


def follow(klass: Classroom, session: Session) -> bool:
    """The class follows the lecturer's run, except during a Run (it shows the Run's last step once it ends)."""
    klass.lecturer_session = session.id
    return not session.run_in_progress and klass.follow(session.run)


@handler(ClassStartViews)
def on_class_start(session, address):
    """A new class, taught from this session's run: its code, link and QR code; the verdicts of every step this
    page shows from now on wait for the reveal."""
    return started(session, state.CLASSES.start(session.id, session.run), address)


def started(session: Session, klass: Classroom, address: str) -> ClassStartViews:
    session.predict_first = True  # the lecture screen shows no verdict before the class has answered
    return shown_to_lecturer(klass, address, f"Class {klass.code} started: learners open the link or scan the code.")


def shown_to_lecturer(klass: Classroom, address: str, said: str) -> ClassStartViews:
    link, warning = class_link(address, klass.code)
    warned = f"\n\n<div id='class-address-warning'>\n\n⚠ {warning}\n\n</div>" if warning else ""
    return ClassStartViews.of(klass, said, code=klass.code, token=klass.token, qr=qr_svg(link),
                              link=f"<div id='class-code-big'>{klass.code}</div>\n\nLearners open **{link}** (or "
                                   f"scan the code) and pick a name.{warned}")


def on_lecturer_page(code, token) -> tuple:
    """The lecturer's page after a start, an end or a reload: the browser keeps the class's code and secret (for a
    reload), and the page asks for the answers while the class is on."""
    try:
        klass = state.CLASSES.lecturing(code, token) if code else None
    except UserError:  # the class has gone: nothing to ask for
        klass = None
    return [code, token], gr.Timer(active=klass is not None and not klass.ended)


def on_lecturer_open(kept, address) -> tuple:
    """A reload of the lecturer's page: the class this browser started is on show again (its code, link, QR code,
    answers and the lecturer's secret), so the lecturer goes on stepping and revealing it; the page keeps its own
    session (a Step shows the class a new run). Nothing kept, or a class gone: nothing changes."""
    code, token = kept if isinstance(kept, (list, tuple)) and len(kept) == 2 else ("", "")
    try:
        klass = state.CLASSES.lecturing(code, token) if code else None
    except UserError:  # the class has expired, or the server restarted: there is nothing to go back to
        klass = None
    if klass is None:
        return ClassStartViews().outputs()
    views = shown_to_lecturer(klass, address, f"Class {klass.code} is on show again.")
    views.session_id = gr.skip()
    return views.outputs()


@handler(ClassStepViews)
def on_class_step(session, code, token, prompt, **controls):
    """The lecturer's Step for the class: the next step of the lecturer's run (the model runs once, here), then
    every learner's page shows it, verdicts hidden."""
    klass = state.CLASSES.lecturing(code, token)
    if klass.ended:
        raise UserError("the class has ended: start a new one (Step above goes on without it)")
    outcome = controller(session).step(settings_from(controls), prompt)
    if follow(klass, session):
        prime(klass)
    return ClassStepViews.of(session, outcome, **lecturer_fields(klass))


@handler(ClassStepViews)
def on_class_reveal(session, code, token):
    """The lecturer's Reveal: answers close, every learner sees the outcome and their score; the lecturer's page
    shows the step's verdicts too (when it shows the class's run)."""
    klass = state.CLASSES.lecturing(code, token)
    current = klass.reveal()
    prime(klass)
    if not same_run(klass.run, session.run, current.index):
        return ClassStepViews(**lecturer_fields(klass), session_id=session.id)
    return ClassStepViews.of(session, controller(session).reveal(current.index), **lecturer_fields(klass))


@handler(ClassPanel)
def on_class_follow_page(session, code, token):
    """The lecturer's page stepped or revealed with its own buttons or keys: the class follows."""
    klass = state.CLASSES.lecturing(code, token)
    return ClassPanel.of(prime(klass)) if follow(klass, session) else ClassPanel()


@handler(ClassPanel)
def on_class_second_vote(session, code, token):
    """Peer instruction's second vote: learners talk it over, then answer the round on show again."""
    klass = state.CLASSES.lecturing(code, token)
    current = klass.open_second_vote()
    return ClassPanel.of(prime(klass), f"Second vote on step {current.index} open: learners discuss with their "
                                       "neighbours, then answer again (their second answer is scored).")


@dataclass
class ClassResultsViews(ClassPanel, named=("results",)):
    """The class's results as a CSV file to download."""


# A spreadsheet reads a cell that starts with one of these as a formula: a learner's name must stay text
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
RESULT_COLUMNS = ("kind", "round", "step", "question", "right_answer", "learner", "first_vote", "second_vote", "right",
                  "score", "revealed_rounds")


def results_csv(rows: list[dict]) -> str:
    """The class's results (Classroom.results) as CSV text: per round and learner the question, the answer in each
    vote and the right answer; per learner the score. Cells that a spreadsheet would run as formulas are quoted."""
    out = io.StringIO()
    writer = csv.DictWriter(out, RESULT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: f"'{value}" if isinstance(value, str) and value.startswith(FORMULA_STARTS) else value
                         for key, value in row.items()})
    return out.getvalue()


@handler(ClassResultsViews)
def on_class_results(session, code, token, without_names):
    """The class's results to download as CSV (at most MAX_ROUNDS x MAX_LEARNERS answer rows), names left out when
    asked. Written to a temporary folder, which Gradio serves to this page only."""
    klass = state.CLASSES.lecturing(code, token)
    if not klass.rounds:
        raise UserError("no step has been shown to the class yet: there are no results")
    folder = Path(tempfile.mkdtemp(prefix="dynasd-class-"))
    path = folder / f"class-{klass.code}-results{'-no-names' if without_names else ''}.csv"
    rows = klass.results(names=not without_names)
    path.write_text(results_csv(rows), encoding="utf-8")
    answers = sum(row["kind"] == "answer" for row in rows)
    return ClassResultsViews.of(klass, f"Results of {len(klass.rounds)} step(s), {answers} answer row(s), "
                                       f"{'without' if without_names else 'with'} names: download below.",
                                results=gr.File(str(path), visible=True))


@handler(ClassPanel)
def on_class_ask(session, code, token, ask, node):
    """The question the class is asked (the round on show too, while no one has answered it)."""
    klass = state.CLASSES.lecturing(code, token)
    return ClassPanel.of(prime(klass), klass.set_question(asked_kind(ask), asked_node(node)))


def asked_kind(ask) -> Ask:
    if ask not in ASKS:
        raise UserError(f"the question is one of: {', '.join(ASKS)}")
    return ASKS[ask]


def asked_node(node) -> int | None:
    if node is None or node == "":
        return None
    try:
        return int(node)
    except (TypeError, ValueError):
        raise UserError("a candidate is a node number, 0 or more") from None


@handler(ClassKeyViews)
def on_class_key(session, code, token):
    """The lecturer's page asking whether the answers changed: the key alone (the panel follows when it did)."""
    return ClassKeyViews(lecturer_key(state.CLASSES.lecturing(code, token)), session.id)


@handler(ClassPanel)
def on_class_panel(session, code, token):
    return ClassPanel.of(state.CLASSES.lecturing(code, token))


@handler(ClassStartViews)
def on_class_end(session, code, token):
    """The class ends: every learner's page shows the summary and their score."""
    klass = state.CLASSES.lecturing(code, token)
    klass.end()
    session.predict_first = False
    return ClassStartViews.of(prime(klass), "The class has ended: the summary is below (and on every learner's "
                              "page).")


def results_controls() -> tuple[gr.Checkbox, gr.Button, gr.File]:
    """The Class tab's results as CSV: names left out or not, the button, and the file (shown once written)."""
    with gr.Row():
        without_names = gr.Checkbox(False, label="Leave names out (learner 1, 2, …)", elem_id="class-no-names")
        export = gr.Button("Results as CSV", elem_id="class-export", min_width=100)
    results = gr.File(None, label="Class results (CSV)", visible=False, interactive=False, elem_id="class-results")
    return without_names, export, results


def class_section(demo: gr.Blocks, tabs: gr.Tabs, session_id, prompt, controls: dict, views: StepViews) -> None:
    """The lecturer's Class tab, added to the step's view tabs, and its events."""
    with tabs, gr.Tab("Class", elem_id="class-tab"):
        gr.Markdown(CLASS_HELP, elem_classes="explain")
        with gr.Row():
            start = gr.Button("Start a class", variant="primary", elem_id="class-start", min_width=120)
            end = gr.Button("End class", variant="stop", elem_id="class-end", min_width=100)
        with gr.Row(equal_height=False):
            with gr.Column(scale=2):
                link = gr.Markdown("", label="class code and link", elem_id="class-link")
                with gr.Row():
                    ask = gr.Radio(list(ASKS), value=Ask.COMMIT.value, label="Question for the class",
                                   elem_id="class-ask", scale=3)
                    node = gr.Number(None, precision=0, label="Candidate asked about (its node number)",
                                     elem_id="class-node", scale=1, min_width=120)
                with gr.Row():
                    step = gr.Button("Step for the class", variant="primary", elem_id="class-step", min_width=100)
                    second_vote = gr.Button("Second vote", elem_id="class-second-vote", min_width=100)
                    reveal = gr.Button("Reveal to the class", elem_id="class-reveal", min_width=100)
                class_status = gr.Markdown("", label="class status", elem_id="class-status")
            qr = gr.HTML("", label="QR code", elem_id="class-qr")
        answers = figure_view("Answers (no names)", "class-answers")
        summary = gr.Markdown("", label="class summary", elem_id="class-summary")
        without_names, export, results = results_controls()
        follow_btn = gr.Button("Follow the page's step", elem_id="class-follow", size="sm")
        code = gr.Textbox("", visible=False, label="class code")
        token = gr.Textbox("", visible=False, label="lecturer token")
        address = gr.Textbox("", visible=False, label="page address")
        key = gr.Textbox("", visible=False, label="answers on show")
        timer = gr.Timer(LECTURER_POLL_S, active=False)
    # outside the tab: a tab not yet shown is not rendered, and its browser state would not be read from the browser
    kept = gr.BrowserState(["", ""], storage_key="dynasd-class-lecturer")
    quiet = dict(show_progress="hidden")
    panel = ClassPanel(class_status, answers, summary, session_id).outputs()
    whole = ClassStartViews(*panel, code, token, link, qr).outputs()
    page_state = dict(fn=on_lecturer_page, inputs=[code, token], outputs=[kept, timer], api_visibility="private",
                      queue=False, **quiet)
    lecturer = [session_id, code, token]
    start.click(on_class_start, [session_id, address], whole, js=ADDRESS_JS, api_name="class_start", **quiet).then(
        **page_state)
    demo.load(on_lecturer_open, [kept, address], whole, js=ADDRESS_JS, api_visibility="private", queue=False,
              **quiet).then(**page_state)
    step_views = ClassStepViews(**vars(views), class_status=class_status, answers=answers,
                                class_summary=summary).outputs()
    step.click(on_class_step, [*lecturer, prompt], step_views, inputs_kwargs=controls, api_name="class_step", **quiet)
    reveal.click(on_class_reveal, lecturer, step_views, api_name="class_reveal", **quiet)
    second_vote.click(on_class_second_vote, lecturer, panel, api_name="class_second_vote", **quiet)
    export.click(on_class_results, [*lecturer, without_names], ClassResultsViews(*panel, results).outputs(),
                 api_name="class_results", **quiet)
    ask.input(on_class_ask, [*lecturer, ask, node], panel, api_name="class_question", **quiet)
    node.submit(on_class_ask, [*lecturer, ask, node], panel, api_visibility="private", **quiet)
    end.click(on_class_end, lecturer, whole, api_name="class_end", **quiet).then(**page_state)
    # polls skip the queue: the answers come in while the lecturer's Step waits there for the model
    timer.tick(on_class_key, lecturer, [key, session_id], api_name="class_answers", queue=False, **quiet)
    key.change(on_class_panel, lecturer, panel, api_visibility="private", queue=False, **quiet)
    follow_btn.click(on_class_follow_page, lecturer, panel, api_visibility="private", queue=False, **quiet)
    views.status.change(None, js=FOLLOW_PAGE_JS, queue=False, api_visibility="private")
