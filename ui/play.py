"""The Play tab's handlers: Step, the paced Run (and the API's streamed Run), Stop, Reset, the step slider, Compare,
saving and loading traces, recipes and the controls that follow the method and the pair. Each is one line behind
ui/handler.py's decorator: the session's controller (dynasd/explorer/sessions/controller.py) does the action, the
views of ui/views.py show its outcome. Model work goes through ui/gpu.py as calls of data in, data out (on a ZeroGPU
Space each is a GPU call in another process)."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import gradio as gr
import pandas as pd

import viz
from dynasd.device_info import machine_line
from dynasd.explorer.inputs import CUSTOM, Settings, UserError
from dynasd.explorer.measure import compare as compare_model
from dynasd.explorer.measure.measured_here import KeptCompare, fastest_recipe_here, read_compares, recipe_here
from dynasd.explorer.sessions.controller import Controller, Outcome
from dynasd.explorer.sessions.session import Session
from dynasd.loading.models import has_feature_draft
from dynasd.options import OPTIONS
from dynasd.recipes import RECIPES, recipe_values
from dynasd.trace import save_run

from . import gpu
from .controls import CONTROL_NAMES, CUSTOM_RECIPE, SHOWN_BY_METHOD, settings_from
from .handler import handler
from .status import status_line
from .texts import method_help
from .views import CompareViews, LoadViews, RunViews, SaveViews, StepViews, StopViews, control_updates, drawable

STREAM_EVERY_S = 0.08  # the API's Run sends at most one update per this many seconds (and always the last step)


def controller(session: Session, starting: Settings | None = None) -> Controller:
    """The session's controller, its model calls through ui/gpu.py (on ZeroGPU: GPU calls in chunks). `starting`:
    the settings of an action that may start a run, whose pair, when it loads first, is said in a toast."""
    if starting is not None:
        gpu.say_pair_loads(starting)
    return Controller(session, gpu.page_calls())


def paced(session: Session, outcome: Outcome, tick) -> RunViews:
    """A paced Run's views: the page asks for the next step by changing the tick, left out when the Run ended."""
    return RunViews.of(session, outcome, **({"tick": (tick or 0) + 1} if outcome.more else {}))


@handler(StepViews)
def on_step(session, prompt, **controls):
    settings = settings_from(controls)
    return StepViews.of(session, controller(session, settings).step(settings, prompt))


@handler(RunViews)
def on_run_begin(session, prompt, tick, **controls):
    """The browser's Run: its first step and a new `tick` (controller.run_begin says how the page paces it)."""
    settings = settings_from(controls)
    return paced(session, controller(session, settings).run_begin(settings, prompt), tick)


@handler(RunViews)
def on_run_next(session, tick, stop_pressed=False):
    return paced(session, controller(session).run_next(bool(stop_pressed)), tick)


@handler(StepViews)
def on_run(session, prompt, **controls):
    """The Run of API clients: a stream of updates (the browser's Run is paced by the page: on_run_begin)."""
    settings = settings_from(controls)
    yield from (StepViews.of(session, o) for o in controller(session, settings).run(settings, prompt, STREAM_EVERY_S))


@handler(StepViews)
def on_follow_up(session, message):
    return StepViews.of(session, controller(session).follow_up(message))


@handler(StopViews)
def on_stop(session):
    return StopViews.of(session, controller(session).stop())


@handler(StepViews)
def on_reset(session):
    return StepViews.of(session, controller(session).reset())


@handler(StepViews)
def on_show_step(session, index):
    return StepViews.of(session, controller(session).show_step(index))


@handler(CompareViews)
def on_compare(session, prompt, **controls):
    """Every method in interleaved rounds with peer runs between (dynasd/explorer/measure/compare.py), one model call a
    round (ui/gpu.py). It says up front how long it takes here (the last Compare's time), then the rounds so far and
    the seconds spent; Stop Compare ends it between two rounds (nothing is kept). While it measures, only the
    status line changes: a table and a chart redrawn at every round would be drawn on the cores the measurement
    runs on, and slow whichever methods ran meanwhile. The table and chart come once, when the Compare is complete;
    it is then kept (measured_here.py) with its time, so that every view of a run of these settings on this prompt
    quotes it."""
    settings, started = settings_from(controls), time.monotonic()
    estimate = compare_model.how_long(read_compares(machine_line(), settings.pair_key))
    yield CompareViews(table=None, plot=None, session_id=session.id, status=status_line(
        f"Comparing the methods on this prompt: {estimate or 'the first Compare here (no earlier one to time it by)'}"
        ". **Stop Compare** ends it between two rounds.", "info"))
    for compared in gpu.compare(settings, prompt):
        result = compare_model.compare_result(compared)
        said, kind = compare_model.progress(compared, result)
        if not compared.complete:
            spent = f" {time.monotonic() - started:.0f} s so far" + (f", of {estimate}" if estimate else "") + "."
            yield CompareViews(status=status_line(said + spent, kind), session_id=session.id)
            continue
        compare_model.keep(result, compared, time.monotonic() - started)
        yield CompareViews(pd.DataFrame(viz.compare_table(result)), viz.compare_figure(result),
                           status_line(said, kind), session.id)


def on_compare_stopped():
    """Stop Compare: the Compare's event is cancelled between two rounds (the round under way finishes first);
    nothing of it is kept."""
    return status_line("Compare stopped: nothing was kept. Press Compare to measure again.", "warn")


def on_recipe_menu(pair: str):
    """The Recipe menu for this machine and pair: each recipe that a kept Compare on this machine ran with its
    settings shows that Compare's ratio against ar, the clear winner of the newest Compare is marked ★, and a line
    names the machine and says what was (or was not) measured on it. A label says nothing else of speed."""
    kept = read_compares(machine_line(), str(pair or ""))
    newest = kept[0] if kept else None
    star = fastest_recipe_here(newest, RECIPES)
    choices = [(CUSTOM_RECIPE, CUSTOM_RECIPE)] + [(recipe_choice(label, values, kept, star), label)
                                                  for label, values in RECIPES.items()]
    return gr.update(choices=choices, info=recipe_info(newest, star))


def recipe_choice(label: str, values: dict, kept: list[KeptCompare], star: str | None) -> str:
    """A recipe's entry: its label, and what Compare measured for its settings on this machine, if it did."""
    here = recipe_here(kept, values)
    if here is None:
        return label
    _, row = here
    said = ("1× ar (ar itself)" if row.method == "ar" else
            f"{row.ratio:.2f}× ar ({row.ratio_low:.2f}–{row.ratio_high:.2f})")
    return f"{'★ ' if label == star else ''}{label} · measured here: {said}"


def recipe_info(kept: KeptCompare | None, star: str | None) -> str:
    here = f"This machine: {machine_line()}."
    if kept is None:
        return (f"{here} Nothing measured here yet: Compare measures every method against ar on this machine, and "
                "each recipe it ran with the recipe's settings then shows its speed-up here.")
    best, clear = kept.fastest()
    when = f"{kept.said()}, on “{kept.prompt[:40]}”" if kept.prompt else kept.said()
    if star:
        return f"{here} Speed-ups: what Compare measured here against ar; ★ = the clear winner of the {when}."
    if kept.busy:
        return (f"{here} Speed-ups: what Compare measured here against ar. The {when} ran {kept.busy}: no recipe is "
                "marked ★ from a busy machine's Compare.")
    if not clear:
        return (f"{here} Speed-ups: what Compare measured here against ar. The {when} found no clear winner "
                f"({best.method} fastest, within the noise of another method): no recipe is marked ★.")
    return (f"{here} Speed-ups: what Compare measured here against ar. The {when} found {best.method} the clear "
            "winner, with settings no recipe has: no recipe is marked ★.")


@handler(SaveViews)
def on_save(session):
    path = save_trace(session)
    return SaveViews(str(path), status_line(f"Saved {len(session.run.steps)} steps to {path.name}.", "ok"), session.id)


def save_trace(session: Session) -> Path:
    """The run on show as a trace file in a folder of its own."""
    if session.run is None or not session.run.steps:
        raise UserError("Nothing to save yet: press Step or Run first.")
    with session.lock:
        path = Path(tempfile.mkdtemp(prefix="dynasd-trace-")) / (f"dynasd-{session.run.method}-"
                                                                 f"{len(session.run.steps)}steps.json")
        save_run(session.run, path)
        return path


@handler(LoadViews)
def on_load(session, path):
    """Replay a trace file; its prompt and settings go to the controls, so Step starts a run like it."""
    return LoadViews.of(session, controller(session).load(path, drawable))


def on_recipe(name: str | None):
    """Set the method controls to a recipe; the pair, prompt and sampling controls stay as they are.
    Returns the control updates, the status and the Dynamic depth accordion."""
    return recipe_updates(name)


def recipe_updates(name: str | None) -> tuple:
    """The controls a recipe sets, the status, and the Dynamic depth accordion: a recipe that turns dynamic depth
    on opens that section, so the settings it changed are in sight."""
    unchanged = control_updates()[1]  # the controls; the prompt box, which a recipe leaves alone, is not among them
    if not name or name == CUSTOM_RECIPE:
        return unchanged + (gr.update(), gr.update())
    try:
        values = {key: OPTIONS[key].record(value) for key, value in recipe_values(name).items()}
    except ValueError as exc:
        return unchanged + (status_line(str(exc), "warn"), gr.update())
    shown = ", ".join(f"{OPTIONS[key].title} {value}" for key, value in values.items())
    return (tuple(gr.update(value=values[control]) if control in values else gr.update()
                  for control in CONTROL_NAMES)
            + (status_line(f"Recipe set ({shown}). Press **Step** or **Run**.", "ok"),
               gr.update(open=True) if values.get("dynamic_depth") else gr.update()))


def on_control_edited():
    """A method control changed by hand: the controls no longer are the recipe on show."""
    return CUSTOM_RECIPE


def on_method_change(method: str, k_config=None):
    """The method's help (mcsd's for the k-config the controls hold), and each method-specific control shown only
    where the method reads it."""
    return (method_help(method, k_config),
            *(gr.update(visible=OPTIONS[name].read_by(method)) for name in SHOWN_BY_METHOD))


def on_pair_change(pair: str):
    custom = pair == CUSTOM
    return (gr.Textbox(visible=custom), gr.Textbox(visible=custom),
            gr.Radio(visible=has_feature_draft(pair), value=OPTIONS["draft_kind"].default))
