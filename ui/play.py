"""The Play tab's handlers: Step, the paced Run (and the API's streamed Run), Stop, Reset, the step slider, Compare,
saving and loading traces, recipes and the controls that follow the method and the pair. Each takes the session id
and the controls by name (ui/controls.py) and returns the views of ui/views.py. Handlers run in the serving process
and keep the session's state there; their model work goes through ui/gpu.py as calls of data in, data out (on a
ZeroGPU Space each is a GPU call in another process)."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import gradio as gr
import pandas as pd

import viz
from dynasd.device_info import machine_line
from dynasd.explorer import compare as compare_model
from dynasd.explorer import paced_run
from dynasd.explorer.inputs import CUSTOM, Settings, UserError, settings_of_trace
from dynasd.explorer.measured_here import KeptCompare, fastest_recipe_here, read_compare
from dynasd.explorer.session import Session, SessionFailed, load_trace
from dynasd.models import has_feature_draft, pick_device
from dynasd.options import OPTIONS
from dynasd.recipes import RECIPES, recipe_values
from dynasd.trace import save_run
from dynasd.tree import TreeShape

from . import gpu, state
from .controls import CONTROL_NAMES, CUSTOM_RECIPE, SHOWN_BY_METHOD, settings_from
from .status import RUNNING, STOPPING, status_line
from .texts import method_help
from .views import FinishedRun, control_updates, empty_views, failed, render, step_views, unexpected

STREAM_EVERY_S = 0.08  # the API's Run sends at most one update per this many seconds (and always the last step)


def busy_guard(session: Session) -> None:
    if session.run_in_progress:
        raise UserError("a Run is in progress in this session: press Stop first")


def _ensure_run(session: Session, settings: Settings, prompt: str, steps: int) -> str:
    """Start a new run when there is none, or the settings or prompt changed, computing its first `steps` steps
    in the same model call. A finished run is not replaced silently: the first Step or Run after it says so (it
    stays on show), the second starts the new run. A failed session stays failed (and says so) until Reset or a
    change of settings or prompt."""
    if session.error and session.settings == settings and session.prompt == prompt:
        raise SessionFailed(session.error)
    if session.matches(settings, prompt) and not session.done and not session.error:
        return ""
    if session.matches(settings, prompt) and session.done and not session.restart_asked:
        session.restart_asked = True
        raise FinishedRun(f"this run is finished ({len(session.run.steps)} steps, still on show: use the step "
                        "slider). Press again to start a new run with these settings; it replaces this one "
                        "(save it under Trace file first to keep it)")
    replaced = session.run is not None and not session.replay
    reason = ("settings changed: started a new run" if replaced and not session.done
              else "started a new run in place of the finished one" if replaced else "started a new run")
    session.start(gpu.compute(), settings, prompt, steps=steps)
    return f"{reason}; {_start_costs(session)}{_wide_tree_on_a_cpu(settings)}"


WIDE_TREE_NODES = 8  # the narrow recipe's (2, 1, 1, 1) tree; wider ones lost to ar on every CPU measured


def _wide_tree_on_a_cpu(settings: Settings) -> str:
    """Said at the start of a run whose tree is wider than any that paid on a CPU (docs/benchmarks.md), when the
    models run on one: a learner's first Run would otherwise show speculation losing without a word of why."""
    branching = settings.options.for_method().branching()
    if not branching or settings.method not in ("mcsd", "ti-mcsd") or gpu.on_zero_gpu():
        return ""
    nodes = TreeShape(branching).num_nodes
    if nodes <= WIDE_TREE_NODES or pick_device(None).type != "cpu":
        return ""
    return (f". On a CPU this {nodes}-node tree is expected to be slower than ar: each step verifies {nodes + 1} "
            f"rows and runs {len(branching)} draft forwards, which cost more here than the tokens they win (Learn → "
            "Cost model measures both on this machine)")


def _start_costs(session: Session) -> str:
    """What starting the run cost, said once, because no step's time includes it."""
    loaded = f"loading the models took {session.load_seconds:.1f} s, " if session.load_seconds >= 0.05 else ""
    tokens = len(session.run.prompt_ids)
    return f"{loaded}prefill of {tokens} prompt tokens took {session.prefill_seconds * 1000:.0f} ms"


def _announce_loading(settings: Settings) -> bool:
    """On the first use of a pair, a toast says the models are loading (tens of seconds on a CPU): it goes at
    once, in the event's own stream and so before its update, which a separate status event could not promise.
    Returns whether it was said."""
    if settings.pair_key in state.PAIRS.loaded():
        return False
    gr.Info(f"Loading the model pair {settings.pair_key[:80]} (first use: this can take a while on a CPU)…")
    return True


def _step_time(step) -> str:
    ms = (step.draft_seconds + step.verify_seconds + step.accept_seconds) * 1000
    return f"Step {step.index} took {ms:.0f} ms (draft + verify + accept; prefill not included)."


def on_step(session_id, prompt, **controls):
    session = state.SESSIONS.get(session_id)
    try:
        busy_guard(session)
        settings = settings_from(controls)
        _announce_loading(settings)
        with session.lock:
            compute = gpu.compute()
            note = _ensure_run(session, settings, prompt, compute.chunk)
            step = session.step(compute)
        status = _step_time(step) + (f" ({note})" if note else "")
        if session.done:
            status += " The run is finished."
        return render(session, status=status_line(status, "ok"))
    except Exception as exc:
        return failed(session, exc)


def _run_finished_status(session: Session, run) -> str:
    summary = run.summary()
    verb = "Stopped" if session.stop_requested and not run.finished else "Done"
    return status_line(f"{verb} after {summary['steps']} steps: {summary['new_tokens']} tokens, "
                       f"{summary['tokens_per_target_forward']:.2f} tokens per target forward.", "ok")


def on_run_begin(session_id, prompt, tick, **controls):
    """The browser's Run: start (or continue) the run, take its first step and hand the page a new `tick`. The
    page asks for each next step (on_run_next) only after it has applied this one, so a slow page slows the run
    down instead of falling behind it: the server never finishes a run the page has not drawn, and Stop ends
    it one step after the one on show. On ZeroGPU the first request computes the whole run in one GPU call and the
    page plays it back: the next requests need no GPU."""
    session = state.SESSIONS.get(session_id)
    try:
        settings = settings_from(controls)
        _announce_loading(settings)
        with session.lock:
            busy_guard(session)  # under the lock: two Runs in one session cannot both pass
            note = _ensure_run(session, settings, prompt, gpu.run_steps())
            step, ended = paced_run.first_step(session, gpu.compute(), gpu.run_steps())
        if ended:
            return render(session, status=_run_finished_status(session, session.run)) + (gr.skip(),)
        running = f"{RUNNING} step {step.index}" + (f" ({note})" if note else "")
        return render(session, status=status_line(running)) + ((tick or 0) + 1,)
    except Exception as exc:
        paced_run.end(session)
        return failed(session, exc) + (gr.skip(),)


def on_run_next(session_id, tick, stop_pressed=False):
    """One more step of a browser-paced Run (see on_run_begin), or its end: Stop (pressed in the page, which
    says so with this request: `stop_pressed`, or heard by on_stop), Reset, or the run finished."""
    session = state.SESSIONS.get(session_id)
    if session.paced_at is None:  # Reset, a loaded trace or a new Step replaced the run: nothing more to draw
        return tuple(gr.skip() for _ in range(12))
    try:
        with session.lock:
            run = session.run
            step, ended = paced_run.next_step(session, gpu.compute(), stop_pressed, gpu.run_steps())
        if ended:
            return render(session, status=_run_finished_status(session, run)) + (gr.skip(),)
        return render(session, status=status_line(f"{RUNNING} step {step.index}")) + ((tick or 0) + 1,)
    except Exception as exc:
        paced_run.end(session)
        return failed(session, exc) + (gr.skip(),)


def on_run(session_id, prompt, **controls):
    """The Run of API clients: a stream of updates, at most one per STREAM_EVERY_S, until done or Stop (checked
    between steps). The browser's Run button is paced by the page instead (on_run_begin). On ZeroGPU the run is
    computed in as few GPU calls as fit (ui/gpu.py), then streamed."""
    session = state.SESSIONS.get(session_id)
    try:
        with session.lock:
            busy_guard(session)  # under the lock: two Runs in one session cannot both pass
            settings = settings_from(controls)
            compute, steps = gpu.compute(), gpu.run_steps()
            _ensure_run(session, settings, prompt, steps)
            run = session.run
            session.running, session.stop_requested = True, False
        last_sent = 0.0
        try:
            # Stop is honoured between steps only, so a stopped run is a consistent one: Step or Run continue it.
            while not run.finished and not session.stop_requested:
                with session.lock:
                    if session.run is not run:  # Reset (or a loaded trace) replaced the run: stop quietly
                        return
                    session.step(compute, steps)
                now = time.monotonic()
                if now - last_sent >= STREAM_EVERY_S and not run.finished:
                    last_sent = now
                    yield render(session, status=status_line(f"{RUNNING} step {len(run.steps) - 1}"))
        finally:
            session.running = False
            session.touch()
        yield render(session, status=_run_finished_status(session, run))
    except Exception as exc:
        yield failed(session, exc)


def on_follow_up(session_id, message):
    session = state.SESSIONS.get(session_id)
    try:
        busy_guard(session)
        with session.lock:
            session.follow_up(gpu.compute(), message)
        return render(session, status=status_line(f"Turn {len(session.turns)} of the conversation: press **Step** or "
                                                  "**Run** to answer the follow-up.", "ok"))
    except Exception as exc:
        return failed(session, exc)


def on_stop(session_id):
    """Stop takes effect before the next step. With nothing running it says so, and the status does not wait
    for an end that will never come. The page's paced Run is told by the page itself (NEXT_STEP_JS), which also
    writes "Stopping…" at once: this reply then leaves the page's status alone, since it may arrive after the
    run's last update ("Stopped after …"), which it must not overwrite."""
    session = state.SESSIONS.get(session_id)
    if session.stopped_by_page:  # this Stop's own click already ended the page's Run
        session.stopped_by_page = False
        return gr.skip(), session.id
    if not session.run_in_progress:
        steps = len(session.run.steps) if session.run is not None else 0
        where = (f" (the run on show is finished: {steps} steps)" if session.done
                 else f" (the run on show stopped after {steps} steps: Run or Step go on with it)" if steps
                 else " (Run to start one, Step to take one step)")
        return status_line("Nothing is running: nothing to stop" + where + "."), session.id
    session.stop_requested = True
    return (gr.skip() if session.paced_run_alive else status_line(STOPPING)), session.id


def on_reset(session_id):
    session = state.SESSIONS.get(session_id)
    if session.run_in_progress:
        session.stop_requested = True
    with session.lock:
        session.reset()
    return empty_views(session, status_line("Reset. Press **Step** or **Run** to start a new run."))


def on_show_step(session_id, index):
    session = state.SESSIONS.get(session_id)
    if session.run is None or not session.run.steps:
        return empty_views(session, status_line("Nothing to show yet: press **Step** or **Run**."))
    try:
        index = int(index)
        return render(session, index, status=status_line(f"Showing step {index}."))
    except Exception as exc:
        return failed(session, exc)


def on_compare(session_id, prompt, **controls):
    """Every method on the prompt in interleaved rounds (dynasd/explorer/compare.py: each round gives every method
    a short chunk of steps, so load falls on all of them alike), with whole runs of transformers' assisted
    generation between the rounds; the table grows after each round. One model call per round (ui/gpu.py)."""
    session = state.SESSIONS.get(session_id)
    result = None
    try:
        settings = settings_from(controls)
        for compared in gpu.compare(settings, prompt):
            result = compare_model.compare_result(compared)
            if not compared.finished or compared.peer_due():
                said = status_line(f"Round {result.rounds}: {len(result.rows)} of {len(compared.methods)} methods "
                                   f"under way ({result.conditions()})…")
                yield pd.DataFrame(viz.compare_table(result)), viz.compare_figure(result), said, session.id
                continue
            _keep_compare(compared, result)
            done = "all methods compared" + (f"; {result.peer_note}" if result.peer_note else "")
            said = f"{done[0].upper() + done[1:]} ({result.conditions()}). {compare_model.verdict(result)}"
            yield (pd.DataFrame(viz.compare_table(result)), viz.compare_figure(result), status_line(said, "ok"),
                   session.id)
    except Exception as exc:
        if not isinstance(exc, (UserError, SessionFailed)):
            exc = unexpected(exc)
        gr.Warning(str(exc))
        shown = result is not None and result.rows
        yield (pd.DataFrame(viz.compare_table(result)) if shown else None,
               viz.compare_figure(result) if shown else None, status_line(str(exc), "warn"), session.id)


def _keep_compare(compared, result) -> None:
    """Keep this Compare as what this machine measured (dynasd/explorer/measured_here.py): the Recipe menu reads
    it."""
    compare_model.keep(result, compared)


def on_recipe_menu(pair: str):
    """The Recipe menu for this machine and pair: the recipe that this machine's kept Compare measured a clear
    winner marked ★, and a line that names the machine and says what was (or was not) measured on it."""
    kept = read_compare(machine_line(), str(pair or ""))
    star = fastest_recipe_here(kept, RECIPES)
    choices = [(CUSTOM_RECIPE, CUSTOM_RECIPE)] + [
        (f"★ measured fastest here · {label}" if label == star else label, label) for label in RECIPES]
    return gr.update(choices=choices, info=recipe_info(kept, star))


def recipe_info(kept: KeptCompare | None, star: str | None) -> str:
    here = f"This machine: {machine_line()}."
    if kept is None:
        return (f"{here} The labels say where a recipe was measured fastest (docs/benchmarks.md); nothing was "
                "measured on this machine yet: Compare measures every method here and marks a clear winner ★.")
    best, clear = kept.fastest()
    when = f"Compare here at {kept.measured_at} UTC"
    if star:
        return f"{here} ★ = measured fastest by {when} ({best.tokens_per_s:.1f} tokens/s)."
    if kept.busy:
        return (f"{here} {when}, {kept.busy}: {best.method} fastest ({best.low:.1f}–{best.high:.1f} tokens/s), "
                "but no recipe is marked from a busy machine's Compare.")
    if not clear:
        return (f"{here} {when}: no clear winner ({best.method} fastest, {best.low:.1f}–{best.high:.1f} tokens/s, "
                "within the run's noise of another method); no recipe is marked.")
    return (f"{here} {when}: {best.method} was the clear winner ({best.tokens_per_s:.1f} tokens/s), with settings "
            "no recipe has; no recipe is marked.")


def on_save(session_id):
    session = state.SESSIONS.get(session_id)
    if session.run is None or not session.run.steps:
        gr.Warning("nothing to save yet: press Step or Run first")
        return None, status_line("Nothing to save yet: press **Step** or **Run** first.", "warn"), session.id
    try:
        with session.lock:
            folder = Path(tempfile.mkdtemp(prefix="dynasd-trace-"))
            path = folder / f"dynasd-{session.run.method}-{len(session.run.steps)}steps.json"
            save_run(session.run, path)
            steps = len(session.run.steps)
    except Exception as exc:
        message = str(unexpected(exc))
        gr.Warning(message)
        return None, status_line(message, "error"), session.id
    return str(path), status_line(f"Saved {steps} steps to {path.name}.", "ok"), session.id


def on_load(session_id, path):
    """Replay a trace file; its prompt and settings go to the controls, so Step starts a run like it."""
    session = state.SESSIONS.get(session_id)
    if not path:
        return empty_views(session, status_line("Choose a trace file (.json) to load.", "warn")) + control_updates()
    try:
        busy_guard(session)
        run = load_trace(path)
        if not run.steps:
            raise UserError("that trace has no steps")
        with session.lock:
            session.load(run)
            try:
                step_views(run, 0)  # the scrubber can reach both ends
                views = render(session, status=status_line(
                    f"Loaded a {run.method[:40]} trace of {len(run.steps)} steps on {run.pair[:80]}: replaying, "
                    "no model needed.", "ok"))
            except Exception as exc:  # passed the schema checks but cannot be drawn: refuse it, say why
                unexpected(exc)
                session.reset()
                raise UserError("cannot show that trace: its steps do not describe a drawable tree") from exc
        return views + control_updates(run.prompt, settings_of_trace(run))
    except Exception as exc:
        return failed(session, exc) + control_updates()


def on_recipe(name: str | None):
    """Set the method controls to a recipe; the pair, prompt and sampling controls stay as they are. A recipe
    that turns dynamic depth on opens that section, so the settings it changed are in sight.
    Returns the control updates, the status and the Dynamic depth accordion."""
    unchanged = control_updates()[1:]  # [0] is the prompt box, which a recipe leaves alone
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
