"""DynaSD Explorer: run multi-candidate speculative decoding one step at a time and watch what happens.

    python app.py                                       # embedded SmolLM2 pair, http://127.0.0.1:7860
    python app.py --pair tiny-random --port 7861        # seeded tiny pair: instant, offline, for tests

This file is the UI only: widgets, events and session handling. Decoding lives in dynasd/, figures in viz/.
Set DYNASD_PUBLIC=1 on a public server: custom model ids and paths are then refused, unless DYNASD_MODEL_DIR names
a folder: custom models are then the folders and .gguf files inside it (never hub ids, never paths outside it); and
only the decision models shipped in dynasd/assets may be chosen, never a folder path.
Without DYNASD_PUBLIC, DYNASD_MODEL_DIR confines local paths to that folder and hub ids still work.
Every control of a decoder option is built from its entry in dynasd/options.py (label, range, help).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import gradio as gr
import pandas as pd

import viz
from dynasd.explorer.inputs import (
    CUSTOM,
    MAX_NEW_TOKENS_LIMIT,
    MAX_PROMPT_CHARS,
    RUN_FIELDS,
    Settings,
    UserError,
    known_pairs,
    settings_of_trace,
)
from dynasd.explorer.memory import start_heap_trimmer
from dynasd.explorer.pairs import pairs_from_env
from dynasd.explorer.recipes import RECIPES, recipe_values
from dynasd.explorer.registry import SessionRegistry
from dynasd.explorer.session import Session, SessionFailed, compare_methods, load_trace
from dynasd.models import has_feature_draft
from dynasd.options import METHODS, OPTIONS, Choice, Option
from dynasd.stopping import DEFAULT_DECISION_MODEL, shipped_decision_models
from dynasd.trace import save_run

try:  # a Hugging Face ZeroGPU Space: every model call must run inside spaces.GPU (elsewhere it changes nothing)
    import spaces
except ImportError:
    spaces = None

# The GPU time a handler asks ZeroGPU for, from the run's length: a shorter request is scheduled sooner, one that
# runs out is cut off. 0.1 s a token is several times a token's cost on a GPU for the embedded pair, and the base
# covers loading a pair inside the GPU process (a pair other than the one loaded at start-up).
GPU_BASE_S, GPU_S_PER_TOKEN, GPU_MAX_S = 20, 0.1, 300


def on_gpu(runs: int = 0):
    """The decorator for a handler that runs models: `spaces.GPU` when the `spaces` package is importable, the
    handler itself otherwise. Its duration covers one Step (`runs=0`) or `runs` runs of the requested length."""
    if spaces is None:
        return lambda handler: handler

    def duration(*args, max_new_tokens=MAX_NEW_TOKENS_LIMIT, **controls) -> int:
        tokens = max_new_tokens if isinstance(max_new_tokens, (int, float)) else MAX_NEW_TOKENS_LIMIT
        return int(min(GPU_MAX_S, GPU_BASE_S + runs * GPU_S_PER_TOKEN * max(1, tokens)))

    return spaces.GPU(duration=duration)


def on_zero_gpu(environ=os.environ) -> bool:
    """Whether this process is a ZeroGPU Space (the variable its runtime sets; `spaces` is then importable)."""
    return spaces is not None and environ.get("SPACES_ZERO_GPU", "") not in ("", "0", "false")


MODEL_DIR = os.environ.get("DYNASD_MODEL_DIR", "") or None
STREAM_EVERY_S = 0.08  # Run sends at most one update per this many seconds (and always the last step)

EXAMPLES = [
    "Explain why the sky is blue in two sentences.",
    "Write a haiku about a cat watching rain.",
    "List three tips for learning a new language.",
    "What is the capital of France, and what is it famous for?",
]

INTRO = """
# DynaSD Explorer
**Speculative decoding in one picture.** A large *target* model writes text one token per forward pass, and each
pass is slow. A small *draft* model is fast but often wrong. So the draft **guesses several tokens ahead**, and the
target **checks all the guesses in a single forward pass**: it keeps the guesses it agrees with, and where it
disagrees it writes its own token instead. With *multiple candidates* the draft proposes a whole **tree** of
alternatives, so when one guess is wrong a sibling may be right. Lossless methods produce exactly the text the
target would have written alone, only in fewer target passes.

Press **Step** to watch one round (draft → verify → commit), **Run** to keep going, and drag the **step slider**
to look back at any earlier round.
"""

METHOD_HELP = {
    "ar": "**ar**: the target alone, one forward per token. The baseline every other method is measured against.",
    "sd": "**sd**: the draft guesses a *chain* of γ tokens; the target verifies them in one forward and keeps the "
          "agreeing prefix plus one token of its own. Lossless.",
    "mcsd": "**mcsd**: the draft guesses a *tree*: k-config `4,2,2,1` means 4 first guesses, 2 continuations of "
            "each, 2 of each of those, then 1: 44 candidates, depth 4. More shots at being right per forward. "
            "Lossless.",
    "ti-mcsd": "**ti-mcsd**: the first token of each of *width* chains comes from the **target's** own top "
               "choices (known from the previous step), the draft extends each chain *depth* tokens. The chain "
               "with most accepted tokens wins, which can pick the target's 2nd choice: **LOSSY** when width > 1.",
    "pld": "**pld**: prompt lookup decoding, no draft model. When the last tokens occurred earlier in the text "
           "(prompt or output), the tokens that followed them there become a chain of candidates (■, q = 1); "
           "otherwise the target takes a plain step. Free guesses: good on repetitive text. Lossless. "
           "*Prompt lookup* below sets the chain length (0 = 8); sd and mcsd can use lookup too.",
}

TREE_HELP = """
**What am I seeing?** Every token the draft proposed this step, as a tree growing left to right from the *root*
(the last token already written). Each column is one draft level; siblings are alternative guesses for the same
position. After the target's single check:
- <span style="color:#2e9e44">●</span> **accepted**: the target agreed; the thick green line is the path kept.
- <span style="color:#d64541">●</span> **rejected**: tested and refused.
  <span style="color:#9b7fcf">●</span> **passed, other chain won**: e.g. ti-mcsd's target roots (◆) not chosen.
- <span style="color:#b9b9b9">●</span> **not reached**: below a rejected node, never tested.
- ■ square nodes came from **prompt lookup** (pld, or sd/mcsd with lookup on): copied from an earlier place in the
  text, so their q is 1 and a node is accepted with probability p.
- <span style="color:#2f7fd1">★</span> **bonus** or <span style="color:#f08a24">★</span> **correction**: the
  target's own token, sampled after the last accepted node. One is added every step, so a step never commits
  fewer than one token.

Hover a node for p (target probability), q (draft probability), p/q and the random draw u: a candidate is
accepted when u ≤ p/q (at temperature 0: when it is the target's top token).
"""

MASK_HELP = """
**What am I seeing?** The attention mask of the target's single verification pass. Each **row** is a position the
target scores, each **column** a position it may look at (blue = allowed). The whole committed text is one column
on the left: everyone sees it. Inside the tree block, a candidate sees only **itself and its ancestors**, never its
siblings or cousins: that is what lets all branches of the tree be checked at once without mixing them up.
Green rows are the accepted path. With dynamic depth, the grey area is the mask of the largest tree and the red
box is the *slice* used this step: the tree stopped growing early and the same mask is simply cut.
"""

DECISIONS_HELP = """
**What am I seeing?** *Top*: for every candidate, the target's probability **p** (filled bar, coloured by what
happened) and the draft's probability **q** (outline). When p ≥ q the candidate is always accepted; when p < q it
is accepted with probability p/q, which makes the output follow the target exactly. *Bottom*: with a stop policy,
after each draft level every tip gets a score (e.g. the draft's confidence); drafting goes one level deeper only
while the best score reaches the threshold (dashed line). Low confidence means the next guess is likely wrong, so
stopping early saves draft work.
"""

SUMMARY_HELP = """
**What am I seeing?** *Left*: how many tokens each step committed, by origin. *Right*: tokens written so far (green)
against target forwards spent (grey); autoregressive decoding spends one forward per token (dashed red), so the
gap is the target work saved. **Tokens per target forward** is the hardware-independent speed-up; tokens/s depends
on this machine (on a CPU the draft is not much cheaper than the target, so wall time gains are small).
"""

COMPARE_HELP = """
**What am I seeing?** The same prompt and settings through every method. **same text as ar** says whether a
method wrote exactly what the target alone writes. At temperature 0 every lossless method must say *yes*; a
*NO* from ti-mcsd is its lossiness showing. At temperature > 0 texts differ even for lossless methods because the
random draws differ (they agree in distribution, not token by token).
"""

TRACE_HELP = """
**Trace files.** Save the current run (every step, every candidate, p, q, masks) as JSON; load one to replay it
here with no model loaded. Use the step slider to walk through a loaded run. Loading also sets the prompt and the
controls to the ones the run was made with, so **Step** or **Run** makes it again (with a model).
"""


# ---------------------------------------------------------------------------------------------------------------
# server-side state: models and sessions (never in gr.State, which only holds the session id)

PAIRS = pairs_from_env()
SESSIONS = SessionRegistry(max_sessions=64, ttl_s=3600)
# Every control that shapes a run, by name: the run's own (pair, target, draft, max_new_tokens), then one per
# decoder option (dynasd/options.py). Handlers take them as keyword arguments of these names, which are also the
# API's parameter names; a loaded trace or a recipe updates them in this order.
CONTROL_NAMES = tuple(RUN_FIELDS) + tuple(OPTIONS)
# controls shown only for the methods that read them (draft_kind follows the pair: on_pair_change)
SHOWN_BY_METHOD = tuple(name for name, o in OPTIONS.items() if o.methods != METHODS and name != "draft_kind")


def settings_from(controls: dict) -> Settings:
    return Settings(**controls).normalised()


def pair_choices() -> list[str]:
    return known_pairs() + ([CUSTOM] if PAIRS.allow_custom else [])


def _status(message: str, kind: str = "info") -> str:
    # plain symbols, not emoji: they render on machines without an emoji font (headless browsers, servers)
    icon = {"info": "→", "warn": "⚠", "error": "✗", "ok": "✓"}[kind]
    return f"{icon} {message}"


def _empty_views(session_id: str, status: str) -> tuple:
    return (gr.HighlightedText(value=[], color_map={}), None, None, None, None, None, "", status, "",
            gr.Slider(minimum=0, maximum=1, value=0, interactive=False, label="Step on show"), session_id)


def render(session: Session, index: int | None = None, status: str = "") -> tuple:
    """Every view of one step of the session's run (pure figure builders; no model involved)."""
    run = session.run
    if run is None or not run.steps:
        return _empty_views(session.id, status or _status("Press **Step** or **Run** to start."))
    last = len(run.steps) - 1
    index = last if index is None else max(0, min(int(index), last))
    step = run.steps[index]
    root = viz.root_token(run, index)
    max_rows = viz.max_mask_rows(run.config, step.max_nodes)
    lossy = not run.lossless
    story = viz.step_story(run, index)
    if lossy:
        story = "**LOSSY method** (ti-mcsd, width > 1): the text may differ from the target's own. " + story
    spans = viz.text_spans(run, index)
    return (
        gr.HighlightedText(value=spans, color_map=viz.text_color_map(spans)),
        viz.tree_figure(step, root, lossy=lossy),
        viz.mask_figure(step, max_rows, root_label=root),
        viz.pq_figure(step),
        viz.stop_figure(step),
        viz.timeline_figure(run, index),
        viz.summary_markdown(run, index),
        status,
        story,
        gr.Slider(minimum=0, maximum=max(last, 1), value=index, step=1, interactive=last > 0,
                  label=f"Step on show ({index} of {last})"),
        session.id,
    )


def _failed(session: Session, exc: Exception) -> tuple:
    """A clear message in a toast and in the status line; the figures stay as they were."""
    if not isinstance(exc, (UserError, SessionFailed)):
        exc = _unexpected(exc)
    kind = "error" if isinstance(exc, SessionFailed) else "warn"
    message = str(exc)
    gr.Warning(message)
    try:
        return render(session, status=_status(message, kind))
    except Exception as render_exc:  # the run on show cannot be drawn (a hostile trace?): show nothing instead
        _unexpected(render_exc)
        return _empty_views(session.id, _status(message, kind))


def _unexpected(exc: Exception) -> SessionFailed:
    """A bug, not a user mistake: the traceback goes to the server log, the user gets one line."""
    traceback.print_exception(exc, file=sys.stderr)
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return SessionFailed(f"something went wrong on the server ({type(exc).__name__}{': ' + first if first else ''});"
                         " other sessions are not affected; press Reset to start over")


def _busy_guard(session: Session) -> None:
    if session.running:
        raise UserError("a Run is in progress in this session: press Stop first")


# ---------------------------------------------------------------------------------------------------------------
# event handlers

def _ensure_run(session: Session, settings: Settings, prompt: str) -> str:
    """Start a new run when there is none, the settings or prompt changed, or the last run finished. A failed
    session stays failed (and says so) until Reset or a change of settings or prompt."""
    if session.error and session.settings == settings and session.prompt == prompt:
        raise SessionFailed(session.error)
    if session.matches(settings, prompt) and not session.done and not session.error:
        return ""
    reason = ("settings changed: started a new run" if session.run is not None and not session.done
              and not session.replay else "started a new run")
    session.start(PAIRS, settings, prompt)
    return reason


@on_gpu(runs=0)
def on_step(session_id, prompt, **controls):
    session = SESSIONS.get(session_id)
    try:
        _busy_guard(session)
        with session.lock:
            settings = settings_from(controls)
            note = _ensure_run(session, settings, prompt)
            step = session.step(PAIRS)
        ms = (step.draft_seconds + step.verify_seconds + step.accept_seconds) * 1000
        status = f"Step {step.index} took {ms:.0f} ms." + (f" ({note})" if note else "")
        if session.done:
            status += " The run is finished."
        return render(session, status=_status(status, "ok"))
    except Exception as exc:
        return _failed(session, exc)


@on_gpu(runs=1)
def on_run(session_id, prompt, **controls):
    session = SESSIONS.get(session_id)
    try:
        with session.lock:
            _busy_guard(session)  # under the lock: two Runs in one session cannot both pass
            settings = settings_from(controls)
            _ensure_run(session, settings, prompt)
            run = session.run
            session.running, session.stop_requested = True, False
        last_sent = 0.0
        try:
            # Stop is honoured between steps only, so a stopped run is a consistent one: Step or Run continue it.
            while not run.finished and not session.stop_requested:
                with session.lock:
                    if session.run is not run:  # Reset (or a loaded trace) replaced the run: stop quietly
                        return
                    session.step(PAIRS)
                now = time.monotonic()
                if now - last_sent >= STREAM_EVERY_S and not run.finished:
                    last_sent = now
                    yield render(session, status=_status(f"Running… step {len(run.steps) - 1}"))
        finally:
            session.running = False
            session.touch()
        summary = run.summary()
        verb = "Stopped" if session.stop_requested and not run.finished else "Done"
        yield render(session, status=_status(
            f"{verb} after {summary['steps']} steps: {summary['new_tokens']} tokens, "
            f"{summary['tokens_per_target_forward']:.2f} tokens per target forward.", "ok"))
    except Exception as exc:
        yield _failed(session, exc)


def on_stop(session_id):
    session = SESSIONS.get(session_id)
    session.stop_requested = True
    return _status("Stopping after the current step…"), session.id


def on_reset(session_id):
    session = SESSIONS.get(session_id)
    if session.running:
        session.stop_requested = True
    with session.lock:
        session.reset()
    return _empty_views(session.id, _status("Reset. Press **Step** or **Run** to start a new run."))


def on_show_step(session_id, index):
    session = SESSIONS.get(session_id)
    if session.run is None or not session.run.steps:
        return _empty_views(session.id, _status("Nothing to show yet: press **Step** or **Run**."))
    try:
        index = int(index)
        return render(session, index, status=_status(f"Showing step {index}."))
    except Exception as exc:
        return _failed(session, exc)


@on_gpu(runs=len(METHODS))
def on_compare(session_id, prompt, **controls):
    session = SESSIONS.get(session_id)
    rows, runs = [], {}
    try:
        settings = settings_from(controls)
        for method, run in compare_methods(PAIRS, settings, prompt):
            runs[method] = run
            rows = viz.compare_rows(runs)
            done = len(runs) < len(METHODS)
            yield (pd.DataFrame(rows), viz.compare_figure(rows),
                   _status(f"{method} done{'…' if done else ': all methods compared.'}",
                           "info" if done else "ok"), session.id)
    except Exception as exc:
        if not isinstance(exc, (UserError, SessionFailed)):
            exc = _unexpected(exc)
        gr.Warning(str(exc))
        yield (pd.DataFrame(rows) if rows else None, viz.compare_figure(rows) if rows else None,
               _status(str(exc), "warn"), session.id)


def on_save(session_id):
    session = SESSIONS.get(session_id)
    if session.run is None or not session.run.steps:
        gr.Warning("nothing to save yet: press Step or Run first")
        return None, _status("Nothing to save yet: press **Step** or **Run** first.", "warn"), session.id
    try:
        with session.lock:
            folder = Path(tempfile.mkdtemp(prefix="dynasd-trace-"))
            path = folder / f"dynasd-{session.run.method}-{len(session.run.steps)}steps.json"
            save_run(session.run, path)
            steps = len(session.run.steps)
    except Exception as exc:
        message = str(_unexpected(exc))
        gr.Warning(message)
        return None, _status(message, "error"), session.id
    return str(path), _status(f"Saved {steps} steps to {path.name}.", "ok"), session.id


def _control_updates(prompt: str | None = None, settings: Settings | None = None) -> tuple:
    """The prompt box and every control set to a loaded run's prompt and settings; unchanged where unknown."""
    prompt_update = gr.update() if prompt is None else gr.update(value=prompt[:MAX_PROMPT_CHARS])
    if settings is None:
        return (prompt_update,) + tuple(gr.update() for _ in CONTROL_NAMES)
    values = settings.controls()
    return (prompt_update,) + tuple(gr.update(value=values[name]) for name in CONTROL_NAMES)


def on_load(session_id, path):
    """Replay a trace file; its prompt and settings go to the controls, so Step starts a run like it."""
    session = SESSIONS.get(session_id)
    if not path:
        return _empty_views(session.id, _status("Choose a trace file (.json) to load.", "warn")) + _control_updates()
    try:
        _busy_guard(session)
        run = load_trace(path)
        if not run.steps:
            raise UserError("that trace has no steps")
        with session.lock:
            session.load(run)
            try:
                views = render(session, status=_status(
                    f"Loaded a {run.method[:40]} trace of {len(run.steps)} steps on {run.pair[:80]}: replaying, "
                    "no model needed.", "ok"))
                render(session, 0)  # the scrubber can reach both ends
            except Exception as exc:  # passed the schema checks but cannot be drawn: refuse it, say why
                _unexpected(exc)
                session.reset()
                raise UserError("cannot show that trace: its steps do not describe a drawable tree") from exc
        return views + _control_updates(run.prompt, settings_of_trace(run))
    except Exception as exc:
        return _failed(session, exc) + _control_updates()


def on_recipe(name: str | None):
    """Set the method controls to a recipe; the pair, prompt and sampling controls stay as they are."""
    unchanged = _control_updates()[1:]  # [0] is the prompt box, which a recipe leaves alone
    if not name:
        return unchanged + (gr.update(),)
    try:
        values = {key: OPTIONS[key].record(value) for key, value in recipe_values(name).items()}
    except ValueError as exc:
        return unchanged + (_status(str(exc), "warn"),)
    shown = ", ".join(f"{OPTIONS[key].title} {value}" for key, value in values.items())
    return (tuple(gr.update(value=values[control]) if control in values else gr.update()
                  for control in CONTROL_NAMES)
            + (_status(f"Recipe set ({shown}). Press **Step** or **Run**.", "ok"),))


def on_method_change(method: str):
    """The method's help, and each method-specific control shown only where the method reads it."""
    return (METHOD_HELP.get(method, ""),
            *(gr.update(visible=OPTIONS[name].read_by(method)) for name in SHOWN_BY_METHOD))


def on_pair_change(pair: str):
    custom = pair == CUSTOM
    return (gr.Textbox(visible=custom), gr.Textbox(visible=custom),
            gr.Radio(visible=has_feature_draft(pair), value=OPTIONS["draft_kind"].default))


# ---------------------------------------------------------------------------------------------------------------
# layout

CSS = """
#dynasd-text { font-family: ui-monospace, monospace; }
.explain { font-size: 0.92em; }
"""


def options_in(group: str) -> list[str]:
    return [name for name, o in OPTIONS.items() if o.group == group]


def option_control(o: Option, pair: str) -> gr.Component:
    """The control of one decoder option, from its entry in dynasd/options.py: label, help (as info), range."""
    visible = has_feature_draft(pair) if o.name == "draft_kind" else o.read_by(OPTIONS["method"].default)
    common = dict(label=o.label, info=o.help, visible=visible, elem_id=o.name.replace("_", "-"))
    value = o.record(o.default)
    if o.widget == "radio":
        return gr.Radio(list(o.kind.choices), value=value, **common)
    if o.widget == "dropdown":
        if isinstance(o.kind, Choice):
            return gr.Dropdown(list(o.kind.choices), value=value, **common)
        # a decision model: a shipped one by name, or (not on a public server) any folder typed in
        choices = [(f"default ({DEFAULT_DECISION_MODEL})", "")] + shipped_decision_models()
        return gr.Dropdown(choices, value=value, allow_custom_value=PAIRS.allow_decision_paths, **common)
    if o.widget == "slider":
        low, high, step = o.ui_range
        return gr.Slider(low, high, value=value, step=step, **common)
    if o.widget == "number":
        return gr.Number(value=value, precision=0, **common)
    if o.widget == "checkbox":
        return gr.Checkbox(value=value, **common)
    return gr.Textbox(value=value, **common)


def build_app(default_pair: str = "embedded", default_target: str = "", default_draft: str = "") -> gr.Blocks:
    with gr.Blocks(title="DynaSD Explorer") as demo:
        session_id = gr.State(None)
        gr.Markdown(INTRO)
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=320):
                prompt = gr.Textbox(label="Prompt", value=EXAMPLES[0], lines=3, max_lines=8)
                gr.Examples(examples=[[e] for e in EXAMPLES], inputs=[prompt], label="Example prompts")
                with gr.Row():
                    step_btn = gr.Button("Step", variant="primary", elem_id="step-btn")
                    run_btn = gr.Button("Run", variant="primary", elem_id="run-btn")
                with gr.Row():
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                    reset_btn = gr.Button("Reset", variant="secondary", elem_id="reset-btn")
                status = gr.Markdown(_status("Press **Step** or **Run** to start."), elem_id="status")
                scrubber = gr.Slider(minimum=0, maximum=1, value=0, step=1, label="Step on show",
                                     interactive=False, elem_id="scrubber")
                controls: dict[str, gr.Component] = {}
                with gr.Accordion("Model and method", open=True):
                    controls["pair"] = gr.Dropdown(
                        pair_choices(), value=default_pair, label="Model pair (target + draft)",
                        info="tiny-random: instant toy pair; presets need the Hugging Face hub")
                    controls["target"] = gr.Textbox(label="Target model (hub id, folder or .gguf)",
                                                    value=default_target, visible=default_pair == CUSTOM)
                    controls["draft"] = gr.Textbox(label="Draft model (same tokenizer)", value=default_draft,
                                                   visible=default_pair == CUSTOM)
                    recipe = gr.Dropdown(list(RECIPES), value=None, label="Recipe", elem_id="recipe",
                                         info="set the method controls to a paper's configuration or the fastest "
                                              "one measured on a CPU")
                    for name in options_in("method"):
                        controls[name] = option_control(OPTIONS[name], default_pair)
                        if name == "method":
                            method_help = gr.Markdown(METHOD_HELP[OPTIONS["method"].default], elem_classes="explain")
                with gr.Accordion("Dynamic depth", open=False):
                    for name in options_in("dynamic"):
                        controls[name] = option_control(OPTIONS[name], default_pair)
                with gr.Accordion("Sampling", open=False):
                    for name in options_in("sampling"):
                        controls[name] = option_control(OPTIONS[name], default_pair)
                    controls["max_new_tokens"] = gr.Slider(1, MAX_NEW_TOKENS_LIMIT, value=RUN_FIELDS["max_new_tokens"],
                                                           step=1, label="Max new tokens")
                with gr.Accordion("Advanced", open=False):
                    for name in options_in("advanced"):
                        controls[name] = option_control(OPTIONS[name], default_pair)
            with gr.Column(scale=3):
                text = gr.HighlightedText(label="Generated text (colour = where each token came from)",
                                          color_map=viz.text_color_map(), show_legend=True,
                                          show_inline_category=False, combine_adjacent=False,
                                          elem_id="dynasd-text")
                story = gr.Markdown("", elem_id="story")
                with gr.Row(equal_height=False):
                    with gr.Column(scale=1, min_width=360):
                        tree_plot = gr.Plot(label="Candidate tree", elem_id="tree-plot")
                        with gr.Accordion("What am I seeing? (tree)", open=True):
                            gr.Markdown(TREE_HELP, elem_classes="explain")
                    with gr.Column(scale=1, min_width=360):
                        mask_plot = gr.Plot(label="Verify mask", elem_id="mask-plot")
                        with gr.Accordion("What am I seeing? (mask)", open=True):
                            gr.Markdown(MASK_HELP, elem_classes="explain")
                with gr.Tabs():
                    with gr.Tab("Decisions"):
                        with gr.Row(equal_height=False):
                            with gr.Column(scale=3):
                                pq_plot = gr.Plot(label="p vs q per candidate", elem_id="pq-plot")
                                stop_plot = gr.Plot(label="Early-stop scores", elem_id="stop-plot")
                            gr.Markdown(DECISIONS_HELP, elem_classes="explain")
                    with gr.Tab("Run summary"):
                        with gr.Row(equal_height=False):
                            with gr.Column(scale=3):
                                summary = gr.Markdown("", elem_id="summary")
                                timeline_plot = gr.Plot(label="Run timeline", elem_id="timeline-plot")
                            gr.Markdown(SUMMARY_HELP, elem_classes="explain")
                    with gr.Tab("Compare"):
                        with gr.Row(equal_height=False):
                            with gr.Column(scale=3):
                                compare_btn = gr.Button("Compare ar, sd, mcsd, ti-mcsd and pld on this prompt",
                                                        elem_id="compare-btn")
                                compare_status = gr.Markdown("")
                                compare_table = gr.Dataframe(label="Methods side by side", interactive=False, wrap=True)
                                compare_plot = gr.Plot(label="Speed", elem_id="compare-plot")
                            gr.Markdown(COMPARE_HELP, elem_classes="explain")
                    with gr.Tab("Trace file"):
                        with gr.Row(equal_height=False):
                            with gr.Column(scale=3):
                                save_btn = gr.Button("Save this run as a trace file", elem_id="save-btn")
                                saved_file = gr.File(label="Trace file to download", interactive=False)
                                load_file = gr.File(label="Load a trace file (.json) to replay",
                                                    file_types=[".json"], type="filepath")
                            gr.Markdown(TRACE_HELP, elem_classes="explain")

        shown = [controls[name] for name in CONTROL_NAMES]
        views = [text, tree_plot, mask_plot, pq_plot, stop_plot, timeline_plot, summary, status, story, scrubber,
                 session_id]
        step_btn.click(on_step, [session_id, prompt], views, inputs_kwargs=controls, api_name="step")
        run_btn.click(on_run, [session_id, prompt], views, inputs_kwargs=controls, api_name="run")
        stop_btn.click(on_stop, [session_id], [status, session_id], api_name="stop", queue=False)
        reset_btn.click(on_reset, [session_id], views, api_name="reset")
        # input: dragging (always_last keeps only the latest position) or typing a step number
        scrubber.input(on_show_step, [session_id, scrubber], views, api_name="show_step", trigger_mode="always_last")
        compare_btn.click(on_compare, [session_id, prompt], [compare_table, compare_plot, compare_status, session_id],
                          inputs_kwargs=controls, api_name="compare")
        save_btn.click(on_save, [session_id], [saved_file, status, session_id], api_name="save_trace")
        load_file.upload(on_load, [session_id, load_file], views + [prompt, *shown], api_name="load_trace")
        recipe.input(on_recipe, [recipe], [*shown, status], api_visibility="private", queue=False)
        controls["method"].change(on_method_change, [controls["method"]],
                                  [method_help, *(controls[name] for name in SHOWN_BY_METHOD)],
                                  api_visibility="private")
        controls["pair"].change(on_pair_change, [controls["pair"]],
                                [controls["target"], controls["draft"], controls["draft_kind"]],
                                api_visibility="private")
    return demo


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="DynaSD Explorer (Gradio app)")
    parser.add_argument("--pair", default="embedded", help=f"model pair on start ({', '.join(known_pairs())})")
    parser.add_argument("--target", default="", help="custom target model (not in public mode)")
    parser.add_argument("--draft", default="", help="custom draft model (not in public mode)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    parser.add_argument("--model-dir", default=MODEL_DIR,
                        help="custom local models must lie in this folder (default: $DYNASD_MODEL_DIR)")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    args = parser.parse_args(argv)
    if args.model_dir:
        if not Path(args.model_dir).is_dir():
            parser.error(f"--model-dir '{args.model_dir}' is not a folder")
        PAIRS.model_dir, PAIRS.allow_custom = Path(args.model_dir).expanduser().resolve(), True
    pair = CUSTOM if (args.target or args.draft) else args.pair
    if pair not in pair_choices():
        parser.error(f"unknown pair '{pair}' (use {', '.join(pair_choices())})")
    PAIRS.device = args.device
    warm = Settings(pair=pair, target=args.target, draft=args.draft)
    if on_zero_gpu():
        # ZeroGPU's documented pattern: load at start-up and place the models on "cuda" outside any handler (its
        # emulation keeps them on the host until a spaces.GPU call attaches a GPU). In this thread, before
        # serving: the GPU process is forked from this one, and a fork while another thread holds the pair's
        # loading lock would leave the lock held in the child.
        PAIRS.device = "cuda" if args.device == "auto" else args.device
        _preload(warm)
    else:
        # Load the start-up pair in the background so the first Step does not wait for it.
        threading.Thread(target=_preload, args=(warm,), daemon=True).start()
    serve(build_app(pair, args.target, args.draft), args.host, args.port)


def serve(demo: gr.Blocks, host: str = "127.0.0.1", port: int = 7860, block: bool = True) -> gr.Blocks:
    """Launch with the server settings the app relies on (the tests launch in-process with block=False)."""
    start_heap_trimmer()  # abandoned sessions' freed memory goes back to the OS (flat RSS in the soak)
    demo.queue(default_concurrency_limit=16).launch(
        server_name=host, server_port=port, css=CSS, max_file_size="20mb", footer_links=["api"],
        prevent_thread_lock=not block, quiet=not block,
        # Gradio keeps each browser session's component values (our figures among them) for its 10,000 most
        # recent sessions: ~0.5 MB each, so abandoned tabs would grow memory for hours. Keep it in line with
        # the session registry, whose sessions are the only ones that can still be stepped anyway.
        state_session_capacity=2 * SESSIONS.max_sessions,
        show_error=True)  # every handler error is already one readable line; gradio's own input checks too
    return demo


def _preload(settings: Settings) -> None:
    try:
        PAIRS.get(settings)
    except Exception as exc:  # reported again, clearly, on first use
        print(f"could not preload model pair '{settings.pair}': {exc}")


if __name__ == "__main__":
    main()
