"""The Learn tab's named views: one dataclass per set of outputs (the guided step with the residual and the
acceptance test, the Cost model, two methods side by side, the losslessness check, a link), each built from the step
on show by its `of`. The figures are viz/residual.py, guided.py, cost.py and losslessness.py; the arithmetic and
the sampling dynasd/explorer (measure/speed.py, lessons/losslessness.py, lessons/phases.py, lessons/side_by_side.py,
sessions/share.py). The handlers that return them are ui/learn.py's; the widgets they fill, ui/learn_layout.py's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

import viz
from dynasd.explorer.costs.trees_by_budget import best_trees
from dynasd.explorer.inputs import UserError
from dynasd.explorer.lessons.predict import asks_first
from dynasd.explorer.measure.speed import speed_here
from dynasd.explorer.sessions import share
from dynasd.explorer.sessions.session import Session
from dynasd.options import options_of_run
from viz.cost import budget_figure, cost_figure, cost_markdown
from viz.losslessness import losslessness_figure, losslessness_markdown
from viz.residual import acceptance_figure, residual_explanation, residual_figure

from .controls import settings_from
from .status import status_line
from .views import PhaseViews, Views, control_updates, step_on_show


def learn_step(session: Session, index) -> tuple:
    """(run, index, step) of the step on show, or a UserError saying what to do first."""
    return step_on_show(session, index, "nothing to explain yet")


WAITS_FOR_THE_GUESS = ("*The residual and each test's draw wait for your guess of this step's commit in Play "
                       "(Let me predict first): they would answer it.*")


def _greedy(run) -> bool:
    return options_of_run(run.method, run.config).temperature == 0.0


@dataclass
class LearnViews(Views, named=("guided", "phase_text", "phase", "residual", "residual_text", "acceptance", "status",
                               "session_id")):
    """Every Learn view of the step on show: the guided step, the residual and the acceptance test."""

    CLEARED = {"guided": None, "phase_text": "", "residual": None, "residual_text": "", "acceptance": None}
    TOAST = False

    @classmethod
    def of(cls, session: Session, index, at) -> "LearnViews":
        run, index, step = learn_step(session, index)
        guided, greedy = PhaseViews.of(session, index, at), _greedy(run)
        if asks_first(session, index):  # the tests' outcomes would answer Play's question
            return cls(guided.figure, guided.text, guided.slider, None, WAITS_FOR_THE_GUESS, None,
                       status_line(f"Explaining step {index} up to its verify: its tests wait for your guess in "
                                   "Play.", "info"), session.id)
        return cls(guided.figure, guided.text, guided.slider, residual_figure(step, greedy),
                   residual_explanation(step, greedy), acceptance_figure(step, greedy),
                   status_line(f"Explaining step {index}.", "ok"), session.id)


@dataclass
class CostViews(Views, named=("plot", "budget", "text", "status", "session_id")):
    """Learn → Cost model: the speed-up curves, the best tree by budget, their words and the Learn status. Every
    number is the run's speed figures (dynasd/explorer/measure/speed.py)."""

    CLEARED = {"plot": None, "budget": None, "text": None}

    @classmethod
    def of(cls, session: Session, run, settings, measured, why_not: str) -> "CostViews":
        """`measured`: this device's costs (None, and `why_not`, where they could not be measured)."""
        speed = speed_here(run, measured, settings.controls(), settings.pair_key)
        where = ("costs kept from an earlier measurement of this device" if measured and measured.kept
                 else "costs measured now on this device" if measured else "costs modelled, not measured")
        return cls(cost_figure(speed), budget_figure(best_trees(run, speed.costs, speed.scale, speed.expected)),
                   cost_markdown(speed, why_not),
                   status_line(f"Cost model of this {run.method} run ({where}).", "ok" if measured else "warn"),
                   session.id)


@dataclass
class SideBySideViews(Views, named=("tree_a", "story_a", "tree_b", "story_b", "status", "session_id")):
    """Two methods' trees and stories from the prefix of the step on show (each empty unless given)."""

    tree_a: Any = None
    story_a: Any = None
    tree_b: Any = None
    story_b: Any = None

    @classmethod
    def of(cls, session: Session, index: int, methods: tuple[str, str], runs: dict) -> "SideBySideViews":
        """`runs`: each method's one step from the prefix of step `index` (side_by_side.standing_for)."""
        views = []
        for method, one in runs.items():
            views += [viz.tree_figure(one.steps[0], viz.root_token(one, 0), lossy=not one.lossless),
                      f"**{method}** · {len(one.steps[0].committed)} token(s) for one target forward. "
                      f"{viz.step_story(one, 0)}"]
        said = status_line(f"{methods[0]} and {methods[1]} from the prefix of step {index}.", "ok")
        return cls(*views, said, session.id)


@dataclass
class LosslessViews(Views, named=("figure", "text", "status", "session_id")):
    """The first token after the prompt, sampled by a lossless method and by ti-mcsd, against p."""

    figure: Any = None
    text: Any = None

    @classmethod
    def of(cls, session: Session, result) -> "LosslessViews":
        """`result`: the check's draws and verdicts (ui/gpu.py check_losslessness)."""
        return cls(losslessness_figure(result.checks, result.labels),
                   losslessness_markdown(result.checks, result.lossless),
                   status_line(f"{result.samples} samples per method.", "ok"), session.id)


@dataclass
class LinkViews(Views, named=("link", "status", "session_id")):
    """A link to this prompt, these settings and the step on show (link_of)."""

    TOAST = False
    link: Any = ""


def side_by_side_settings(session: Session, controls: dict):
    """The run on show's own settings (its steps are the prefix), else the controls'."""
    live = session.run is not None and not session.replay
    return (session.settings if live else None) or settings_from(controls)


def link_of(session: Session, prompt, index, controls: dict) -> LinkViews:
    """A link to this prompt, these settings and the step on show ('?query'; the browser completes it)."""
    step = int(index) if session.run is not None and session.run.steps else None
    return LinkViews("?" + share.link_query(prompt, controls, step), status_line("Link ready: copy it.", "ok"),
                     session.id)


def opened_link(query: dict) -> tuple:
    """The prompt box, every control, the linked step, the status and whether a link was opened."""
    try:
        prompt, settings, step = share.settings_of_query(query)
    except UserError as exc:
        return (*_flat(control_updates()), gr.update(), status_line(str(exc), "warn"), False)
    if prompt is None and settings is None:
        return (*_flat(control_updates()), gr.update(), gr.update(), False)
    return (*_flat(control_updates(prompt, settings)), gr.update(value=step or 0),
            status_line(f"Replaying to step {step or 0}…", "info"), True)


def _flat(updates: tuple) -> tuple:
    prompt, controls = updates
    return (prompt, *controls)
