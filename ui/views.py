"""What a handler sends to the page, as named views: one dataclass per set of outputs, its fields in the order of
the event's output components (the same dataclass names the components in ui/layout.py, so no count is kept by
hand). A field left at its default is left out of the update (Gradio's skip): the page keeps what it shows.

Each class also says how a failure is shown in it (`failure`): where the message goes, which views it clears,
and whether a toast says it too (ui/handler.py encodes every error this one way)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import gradio as gr
import plotly.graph_objects as go

import viz
from dynasd.explorer.inputs import MAX_PROMPT_CHARS, Settings, UserError, settings_of_trace
from dynasd.explorer.lessons import phases
from dynasd.explorer.lessons.predict import as_far_as_seen, asks_first, score_markdown
from dynasd.explorer.measure.speed import compared_here
from dynasd.explorer.sessions.controller import Outcome, Show
from dynasd.explorer.sessions.session import Session
from viz.guided import guided_figure
from viz.predict import hidden_step_views

from .controls import CONTROL_NAMES
from .sent import page_of
from .status import status_line

FIGURES = ("tree", "mask", "pq", "stop", "timeline")  # the step's figures, which the page may already hold


def left_out() -> Any:
    """A view not sent: the page keeps what it shows."""
    return field(default_factory=gr.skip)


def marked(message: str, kind: str) -> str:
    """A failure's message with a plain mark, for a view that is not a status line: ✗ an error, ⚠ a warning."""
    return f"{'✗' if kind == 'error' else '⚠'} {message}"


@dataclass
class Views:
    """Named outputs, in the order of the event's components. `SAID_IN` is the view a failure's message goes to,
    `MARKED` whether it goes there with a plain mark (⚠/✗) rather than as a status line, `CLEARED` the views a
    failure empties, `TOAST` whether a toast says it too.

    A subclass names the views it adds once, in their order: `class CostViews(Views, named=("plot", "budget",
    "text", "status", "session_id"))`; each is left out (`left_out`) unless the class body declares it with another
    default (`file: Any = None`), and @dataclass, applied next, makes them its fields. So a view set that grows from
    another (a Step's views and the class's panel) adds a list of names, not a second copy of their declarations."""

    SAID_IN: ClassVar[str] = "status"
    MARKED: ClassVar[bool] = False
    CLEARED: ClassVar[dict] = {}
    TOAST: ClassVar[bool] = True

    def __init_subclass__(cls, named: tuple[str, ...] = (), **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if not named:
            return
        declared = cls.__dict__.get("__annotations__", {})
        unnamed = set(declared) - set(named)
        if unnamed:
            raise TypeError(f"{cls.__name__} declares {sorted(unnamed)} without naming them in `named`")
        cls.__annotations__ = {name: declared.get(name, Any) for name in named}
        for name in named:
            if name not in cls.__dict__:
                setattr(cls, name, left_out())

    def outputs(self) -> tuple:
        """The views as Gradio takes them: in field order, a tuple field (the controls) spread out."""
        sent: list = []
        for one in fields(self):
            value = getattr(self, one.name)
            sent.extend(value if isinstance(value, tuple) else (value,))
        return tuple(sent)

    @classmethod
    def failure(cls, session: Session, message: str, kind: str) -> "Views":
        said = marked(message, kind) if cls.MARKED else status_line(message, kind)
        return cls(**{**cls.CLEARED, cls.SAID_IN: said, "session_id": session.id})

    @classmethod
    def bare(cls, session: Session, message: str, kind: str) -> "Views":
        """The failure where its own views cannot be drawn."""
        return Views.failure.__func__(cls, session, message, kind)


# -- the step's views ------------------------------------------------------------------------------------------------

@dataclass
class SaveViews(Views, named=("file", "status", "session_id")):
    """A file to download and the status line."""

    file: Any = None


@dataclass
class StepViews(Views, named=("text", *FIGURES, "summary", "status", "story", "scrubber", "session_id")):
    """Every view of the step on show (ui/layout.py's `views`)."""

    @classmethod
    def of(cls, session: Session, outcome: Outcome, **more) -> "StepViews":
        """The views an action's outcome asks for, and `more` (the fields a subclass adds)."""
        status = gr.skip() if outcome.said is None else status_line(outcome.said, outcome.kind)
        if outcome.show is Show.NOTHING:
            return cls(**more)
        if outcome.show is Show.KEEP:
            return cls(status=status, session_id=session.id, **more)
        if outcome.show is Show.EMPTY:
            return cls(**empty_views(session, status), **more)
        return cls(**step_on_page(session, outcome.index, status), **more)

    @classmethod
    def failure(cls, session: Session, message: str, kind: str) -> "StepViews":
        """The run on show stays, the message in the status line."""
        return cls(**step_on_page(session, None, status_line(message, kind)))

    @classmethod
    def bare(cls, session: Session, message: str, kind: str) -> "StepViews":
        """The run on show cannot be drawn (a bug in a figure builder): empty views, the message in the status."""
        return cls(**empty_views(session, status_line(message, kind)))


@dataclass
class RunViews(StepViews, named=("tick",)):
    """A paced Run's step and the tick the page answers with its request for the next one (left out: no more)."""


@dataclass
class LoadViews(StepViews, named=("prompt", "controls")):
    """A replayed run's views, and the prompt box and every control set to its prompt and settings."""

    controls: tuple = field(default_factory=lambda: tuple(gr.skip() for _ in CONTROL_NAMES))

    @classmethod
    def of(cls, session: Session, outcome: Outcome, **more) -> "LoadViews":
        run = outcome.loaded
        if run is None:
            return super().of(session, outcome)
        prompt, controls = control_updates(run.prompt, settings_of_trace(run))
        return super().of(session, outcome, prompt=prompt, controls=controls)


@dataclass
class StopViews(Views, named=("status", "session_id")):
    """Stop's reply: the status line only (left out when the page has said it already)."""

    @classmethod
    def of(cls, session: Session, outcome: Outcome) -> "StopViews":
        return cls(gr.skip() if outcome.said is None else status_line(outcome.said, outcome.kind), session.id)


@dataclass
class PredictViews(StepViews, named=("reveal", "score")):
    """Play's reveal: the step, the reveal's words and the run's score."""

    @classmethod
    def of(cls, session: Session, outcome: Outcome, **more) -> "PredictViews":
        return super().of(session, outcome, reveal=outcome.reveal.markdown(), score=score_markdown(session.run))

    @classmethod
    def failure(cls, session: Session, message: str, kind: str) -> "PredictViews":
        views = super().failure(session, message, kind)
        views.reveal = f"⚠ {message}" if kind == "warn" else ""
        return views


@dataclass
class ToggleViews(StepViews, named=("panel", "score")):
    """'Let me predict first' turned on or off: the step again, the panel shown or hidden, the score."""


@dataclass
class LectureViews(StepViews, named=("box",)):
    """Lecture mode turned on or off: the step again, the lecture's buttons shown or hidden."""


@dataclass
class FigureViews(Views, named=("figure", "text", "session_id")):
    """One figure and its words: the KV cache ledger, the misconceptions lab, and the Learn views that measure this
    device (Rows and batches, Where would it pay?). A failure is said in the words, marked ⚠ or ✗, and empties the
    figure."""

    SAID_IN = "text"
    MARKED = True
    CLEARED = {"figure": None}
    TOAST = False


@dataclass
class CompareViews(Views, named=("table", "plot", "status", "session_id")):
    """Compare's table, figure and status line, sent after every round. A failure is said in the status line (and a
    toast); the table and figure keep the rounds the page shows."""


@dataclass
class PhaseViews(Views, named=("figure", "text", "slider", "session_id")):
    """The guided step at one phase: its figure, its words and the phase slider."""

    SAID_IN = "text"
    CLEARED = {"figure": None}
    TOAST = False

    @classmethod
    def of(cls, session: Session, index, at) -> "PhaseViews":
        run, index, _ = step_on_show(session, index, "nothing to explain yet")
        shown = phases.guided_view(run, index, at, sealed=bool(asks_first(session, index)))
        return cls(guided_figure(shown.step, shown.phase, viz.root_token(run, index), lossy=not run.lossless),
                   f"**Phase {shown.at + 1} of {shown.count}: {shown.phase.title}.** {shown.phase.text}",
                   gr.Slider(minimum=0, maximum=max(shown.count - 1, 1), value=shown.at, step=1,
                             interactive=shown.count > 1, label=f"Phase ({shown.at + 1} of {shown.count})"),
                   session.id)



def step_views(run, index: int, compared=None) -> tuple[list, dict, str, str]:
    """The text spans, figures, summary and story of step `index` of `run` (pure builders; nothing is sent);
    `compared`: what Compare measured for the run's method, settings and prompt, which the summary quotes."""
    step = run.steps[index]
    figures = dict(step_figures(run, index), stop=viz.stop_figure(step), timeline=viz.timeline_figure(run, index))
    return (viz.text_spans(run, index), figures, viz.summary_markdown(run, index, compared),
            viz.step_story(run, index))


def step_figures(run, index: int) -> dict:
    """The tree, the verify mask and the decisions of step `index`, drawn the one way the page and a class's
    learners see them (a learner's page shows these three only: ui/classroom.py)."""
    step = run.steps[index]
    root = viz.root_token(run, index)
    return dict(tree=viz.tree_figure(step, root, lossy=not run.lossless),
                mask=viz.mask_figure(step, viz.max_mask_rows(run, step.max_nodes), root_label=root),
                pq=viz.pq_figure(step))


def step_on_page(session: Session, index: int | None, status) -> dict:
    """The step views of step `index` (the last when None) as its page is sent them: a figure the page shows
    already is left out. With 'Let me predict first' on, the verdicts wait for the guess (ui/predict.py)."""
    run = session.run
    if run is None or not run.steps:
        return empty_views(session, status)
    last = len(run.steps) - 1
    index = last if index is None else max(0, min(int(index), last))
    question = asks_first(session, index)
    compared = compared_for_show(session)
    drawn = as_far_as_seen(session, index)  # with predictions on, no step the learner has not seen
    if question:
        spans, figures, summary, story = hidden_step_views(run, index, phases.before_the_tests(run.steps[index]),
                                                           step_views(drawn, index - 1, compared) if index else None,
                                                           question)
    else:
        spans, figures, summary, story = step_views(drawn, index, compared)
    return dict(text=gr.HighlightedText(value=spans, color_map=viz.text_color_map(spans)),
                **figures_sent(session, figures), summary=summary, status=status, story=story,
                scrubber=gr.Slider(minimum=0, maximum=max(last, 1), value=index, step=1, interactive=last > 0,
                                   label=step_counter(index, last)),
                session_id=session.id)


def step_counter(index: int, last: int) -> str:
    """The step slider's label: steps count from 0, so it names their range ("3 of 13" read as 13 steps). A
    one-step run's slider still spans 0 to 1 (Gradio's shortest); the page hides its end (ui/page_scripts.py)."""
    if last == 0:
        return "Step on show: 0 (1 step so far)"
    return f"Step on show: {index} (steps 0 to {last})"


def compared_for_show(session: Session):
    """What Compare measured on this machine for the run on show's method, settings and prompt (None for a
    replayed run: its settings are the trace's, not this machine's)."""
    if session.replay or session.settings is None or session.run is None:
        return None
    return compared_here(session.run, session.settings.controls(), session.settings.pair_key)


def empty_views(session: Session, status) -> dict:
    return dict(text=gr.HighlightedText(value=[], color_map={}), **figures_sent(session, dict.fromkeys(FIGURES)),
                summary="", status=status, story="",
                scrubber=gr.Slider(minimum=0, maximum=1, value=0, interactive=False, label="Step on show"),
                session_id=session.id)


def figures_sent(session: Session, figures: dict[str, go.Figure | None]) -> dict:
    """Each figure as it is sent to the session's page: its Plotly JSON (None: no figure), or left out when the
    page shows that very content already (ui/sent.py), so it neither travels nor is drawn again."""
    sent = {}
    with page_of(session).update() as page:
        for name in FIGURES:
            plot = None if figures[name] is None else figures[name].to_json()
            sent[name] = plot if page.changed(name, plot or "") else gr.skip()
    return sent


def control_updates(prompt: str | None = None, settings: Settings | None = None) -> tuple[Any, tuple]:
    """The prompt box and every control set to a loaded run's prompt and settings; unchanged where unknown."""
    prompt_update = gr.update() if prompt is None else gr.update(value=prompt[:MAX_PROMPT_CHARS])
    if settings is None:
        return prompt_update, tuple(gr.update() for _ in CONTROL_NAMES)
    values = settings.controls()
    return prompt_update, tuple(gr.update(value=values[name]) for name in CONTROL_NAMES)


def drawable(run) -> None:
    """Raises when a replayed run's ends cannot be drawn (a trace that passed the schema checks but describes no
    drawable tree): the last step is shown first, and the scrubber reaches the first."""
    step_views(run, 0)
    step_views(run, len(run.steps) - 1)


def step_on_show(session: Session, index, nothing_yet: str) -> tuple:
    """(run, index, step) of the step on show, the index kept within the run's steps; a UserError saying
    `nothing_yet` ("nothing to explain yet", ...) and what to press first when there is no step."""
    run = session.run
    if run is None or not run.steps:
        raise UserError(f"{nothing_yet}: press Step or Run (or replay an example) first")
    index = max(0, min(int(index or 0), len(run.steps) - 1))
    return run, index, run.steps[index]
