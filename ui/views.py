"""What a handler sends to the page: every view of one step of a session's run (a figure the page shows already is
left out), the empty views, a failure's message, and the controls set to a loaded run's prompt and settings."""
from __future__ import annotations

import sys
import traceback

import gradio as gr
import plotly.graph_objects as go

import viz
from dynasd.explorer.inputs import MAX_PROMPT_CHARS, Settings, UserError
from dynasd.explorer.predict import asks_first
from dynasd.explorer.session import Session, SessionFailed
from viz.predict import hidden_step_views

from .controls import CONTROL_NAMES
from .status import status_line

FIGURES = ("tree", "mask", "pq", "stop", "timeline")  # the step's figures, in the order of the views' outputs


def figures_sent(session: Session, figures: dict[str, go.Figure | None]) -> list:
    """Each figure as it is sent to the session's page: its Plotly JSON (None: no figure), or gr.skip() when the
    page shows that very content already (dynasd/explorer/shown.py), so it neither travels nor is drawn again."""
    with session.sent.update() as page:
        sent = []
        for name in FIGURES:
            plot = None if figures[name] is None else figures[name].to_json()
            sent.append(plot if page.changed(name, plot or "") else gr.skip())
    return sent


def empty_views(session: Session, status: str) -> tuple:
    return (gr.HighlightedText(value=[], color_map={}), *figures_sent(session, dict.fromkeys(FIGURES)), "",
            status, "", gr.Slider(minimum=0, maximum=1, value=0, interactive=False, label="Step on show"),
            session.id)


def step_views(run, index: int) -> tuple[list, dict, str, str]:
    """The text spans, figures, summary and story of step `index` of `run` (pure builders; nothing is sent)."""
    step = run.steps[index]
    root = viz.root_token(run, index)
    lossy = not run.lossless
    story = viz.step_story(run, index)
    if lossy:
        story = "**LOSSY method** (ti-mcsd, width > 1): the text may differ from the target's own. " + story
    figures = dict(tree=viz.tree_figure(step, root, lossy=lossy),
                   mask=viz.mask_figure(step, viz.max_mask_rows(run, step.max_nodes), root_label=root),
                   pq=viz.pq_figure(step), stop=viz.stop_figure(step), timeline=viz.timeline_figure(run, index))
    return viz.text_spans(run, index), figures, viz.summary_markdown(run, index), story


def render(session: Session, index: int | None = None, status: str = "") -> tuple:
    """Every view of one step of the session's run, as sent to its page: a figure the page shows already is
    left out."""
    run = session.run
    if run is None or not run.steps:
        return empty_views(session, status or status_line("Press **Step** or **Run** to start."))
    last = len(run.steps) - 1
    index = last if index is None else max(0, min(int(index), last))
    if asks_first(session, index):  # predict, then reveal (ui/predict.py): the verdicts wait for the guess
        spans, figures, summary, story = hidden_step_views(run, index, step_views(run, index - 1) if index else None,
                                                           asks_first(session, index))
    else:
        spans, figures, summary, story = step_views(run, index)
    return (
        gr.HighlightedText(value=spans, color_map=viz.text_color_map(spans)),
        *figures_sent(session, figures),
        summary,
        status,
        story,
        gr.Slider(minimum=0, maximum=max(last, 1), value=index, step=1, interactive=last > 0,
                  label=f"Step on show ({index} of {last})"),
        session.id,
    )


def failed(session: Session, exc: Exception) -> tuple:
    """A clear message in a toast and in the status line; the figures stay as they were."""
    if not isinstance(exc, (UserError, SessionFailed)):
        exc = unexpected(exc)
    kind = "error" if isinstance(exc, SessionFailed) else "warn"
    message = str(exc)
    if isinstance(exc, FinishedRun):  # not a mistake: no toast, and the step being looked at stays on show
        return tuple(gr.skip() for _ in range(7)) + (status_line(message[0].upper() + message[1:] + ".", "info"),
                                                     gr.skip(), gr.skip(), session.id)
    gr.Warning(message)
    try:
        return render(session, status=status_line(message, kind))
    except Exception as render_exc:  # the run on show cannot be drawn (a hostile trace?): show nothing instead
        unexpected(render_exc)
        return empty_views(session, status_line(message, kind))


class FinishedRun(UserError):
    """Step or Run pressed once on a finished run: the run and the step on show stay as they are."""


def unexpected(exc: Exception) -> SessionFailed:
    """A bug, not a user mistake: the traceback goes to the server log, the user gets one line."""
    traceback.print_exception(exc, file=sys.stderr)
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return SessionFailed(f"something went wrong on the server ({type(exc).__name__}{': ' + first if first else ''});"
                         " other sessions are not affected; press Reset to start over")



def control_updates(prompt: str | None = None, settings: Settings | None = None) -> tuple:
    """The prompt box and every control set to a loaded run's prompt and settings; unchanged where unknown."""
    prompt_update = gr.update() if prompt is None else gr.update(value=prompt[:MAX_PROMPT_CHARS])
    if settings is None:
        return (prompt_update,) + tuple(gr.update() for _ in CONTROL_NAMES)
    values = settings.controls()
    return (prompt_update,) + tuple(gr.update(value=values[name]) for name in CONTROL_NAMES)


def step_on_show(session: Session, index, nothing_yet: str) -> tuple:
    """(run, index, step) of the step on show, the index kept within the run's steps; a UserError saying
    `nothing_yet` ("nothing to explain yet", ...) and what to press first when there is no step."""
    run = session.run
    if run is None or not run.steps:
        raise UserError(f"{nothing_yet}: press Step or Run (or replay an example) first")
    index = max(0, min(int(index or 0), len(run.steps) - 1))
    return run, index, run.steps[index]
