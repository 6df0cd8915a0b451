"""DynaSD Explorer: run multi-candidate speculative decoding one step at a time and watch what happens.

    python app.py                                       # embedded SmolLM2 pair, http://127.0.0.1:7860
    python app.py --pair tiny-random --port 7861        # seeded tiny pair: instant, offline, for tests

This file is the UI only: widgets, events and session handling. Decoding lives in dynasd/, figures in viz/.
Set DYNASD_PUBLIC=1 on a public server: custom model ids and paths are then refused, unless DYNASD_MODEL_DIR names
a folder: custom models are then the folders and .gguf files inside it (never hub ids, never paths outside it); and
only the decision models shipped in dynasd/assets may be chosen, never a folder path.
Without DYNASD_PUBLIC, DYNASD_MODEL_DIR confines local paths to that folder and hub ids still work.
Every control of a decoder option is built from its entry in dynasd/options.py (label, range, help).
Through the API, the step's five figures (tree, mask, p vs q, stop scores, timeline) are Plotly JSON strings; a
figure left out of an update (gr.skip(): an update without a value) is the one the session already received.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import gradio as gr
import pandas as pd
import plotly
import plotly.graph_objects as go

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
from dynasd.explorer.peer import PEER_LABEL, run_peer
from dynasd.explorer.recipes import RECIPES, recipe_values
from dynasd.explorer.registry import SessionRegistry
from dynasd.explorer.session import Session, SessionFailed, compare_methods, load_trace
from dynasd.models import has_feature_draft
from dynasd.options import METHODS, OPTIONS, Choice, Option, Shape
from dynasd.stopping import DEFAULT_DECISION_MODEL, shipped_decision_models
from dynasd.trace import save_run
from dynasd.tree import TreeShape

try:  # a Hugging Face ZeroGPU Space: every model call must run inside spaces.GPU (elsewhere it changes nothing)
    import spaces
except ImportError:
    spaces = None

# The GPU time a handler asks ZeroGPU for, from the run's length: a shorter request is scheduled sooner, one that
# runs out is cut off. 0.1 s a token is several times a token's cost on a GPU for the embedded pair, and the base
# covers loading a pair inside the GPU process (a pair other than the one loaded at start-up).
GPU_BASE_S, GPU_S_PER_TOKEN, GPU_MAX_S = 20, 0.1, 300


def on_gpu(runs: int = 0, seconds: int | None = None):
    """The decorator for a handler that runs models: `spaces.GPU` when the `spaces` package is importable, the
    handler itself otherwise. Its duration covers one Step (`runs=0`), `runs` runs of the requested length, or a
    fixed number of `seconds` (the losslessness check's many one-step samples)."""
    if spaces is None:
        return lambda handler: handler

    def duration(*args, max_new_tokens=MAX_NEW_TOKENS_LIMIT, **controls) -> int:
        if seconds is not None:
            return seconds
        tokens = max_new_tokens if isinstance(max_new_tokens, (int, float)) else MAX_NEW_TOKENS_LIMIT
        return int(min(GPU_MAX_S, GPU_BASE_S + runs * GPU_S_PER_TOKEN * max(1, tokens)))

    return spaces.GPU(duration=duration)


def on_zero_gpu(environ=os.environ) -> bool:
    """Whether this process is a ZeroGPU Space (the variable its runtime sets; `spaces` is then importable)."""
    return spaces is not None and environ.get("SPACES_ZERO_GPU", "") not in ("", "0", "false")


MODEL_DIR = os.environ.get("DYNASD_MODEL_DIR", "") or None
STREAM_EVERY_S = 0.08  # the API's Run sends at most one update per this many seconds (and always the last step)
CUSTOM_RECIPE = "custom (set by hand)"  # the Recipe box's value once a method control is changed by hand
RUNNING, STOPPING = "Running…", "Stopping after the current step…"  # statuses of a Run (the page reads RUNNING)

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

_DEFAULT_TREE = TreeShape(OPTIONS["k_config"].default)  # the mcsd and Compare help speak of the default tree
METHOD_HELP = {
    "ar": "**ar**: the target alone, one forward per token. The baseline every other method is measured against.",
    "sd": "**sd**: the draft guesses a *chain* of γ tokens; the target verifies them in one forward and keeps the "
          "agreeing prefix plus one token of its own. Lossless.",
    "mcsd": f"**mcsd**: the draft guesses a *tree*: k-config `{Shape.text(_DEFAULT_TREE.branching)}` means "
            f"{_DEFAULT_TREE.branching[0]} first guesses and then, level by level, "
            f"{', '.join(map(str, _DEFAULT_TREE.branching[1:]))} continuations of each: {_DEFAULT_TREE.num_nodes} "
            f"candidates, depth {_DEFAULT_TREE.depth}. More shots at being right per forward. Lossless.",
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
- <span style="color:#b9b9b9">●</span> **not reached**: below a node that was not accepted, never tested.
  <span style="color:#a9cdb1">●</span> **not tested**: a sibling was accepted first, so the walk went on from it.
- ■ square nodes came from **prompt lookup** (pld, or sd/mcsd with lookup on): copied from an earlier place in the
  text, so their q is 1 and a node is accepted with probability p.
- <span style="color:#2f7fd1">★</span> **bonus** or <span style="color:#f08a24">★</span> **correction**: the
  target's own token, sampled after the last accepted node. The lossless methods add one every step, so a step
  never commits fewer than one token. ti-mcsd adds none: it commits the winning chain, root included.

Hover a node for p (target probability), q (draft probability), p/q and the random draw u: a candidate is
accepted when u ≤ p'/q' (at temperature 0: when it is the target's top token). **p' and q'** are p and q after
the siblings tested before it were rejected: the residual max(p − q, 0) and q without them, each renormalised;
for the first sibling they equal p and q. A correction token is drawn from that residual, so its hover gives
**p_residual**, not the target's p.
"""

MASK_HELP = """
**What am I seeing?** The attention mask of the target's single verification pass. Each **row** is a position the
target scores, labelled *id·token* (✓ = accepted); each **column** a position it may look at (blue = allowed), in
the same order, marked by node id. The whole committed text is one column on the left (ctx): everyone sees it.
Inside the tree block, a candidate sees only **itself and its ancestors**, never its siblings or cousins: that is
what lets all branches of the tree be checked at once without mixing them up. Green rows are the accepted path.
With dynamic depth, the grey area is the mask of the largest tree and the red box is the *slice* used this step:
the tree stopped growing early and the same mask is simply cut.
"""

DECISIONS_HELP = """
**What am I seeing?** *Top*: for every candidate, the target's probability **p** (filled bar, coloured by what
happened) and the draft's probability **q** (outline), in the tree's order (a large tree's bars carry node ids, as
in the mask's rows; hover a bar for its token). When p ≥ q the candidate is always accepted; when p < q it
is accepted with probability p/q, which makes the output follow the target exactly. *Bottom*: with a stop policy,
after each draft level every tip gets a score (e.g. the draft's confidence); drafting goes one level deeper only
while the best score reaches the threshold (dashed line). Low confidence means the next guess is likely wrong, so
stopping early saves draft work.
"""

SUMMARY_HELP = """
**What am I seeing?** *Left*: how many tokens each step committed, by origin. *Right*: tokens written so far (green)
against target forwards spent (grey); autoregressive decoding spends one forward per token (dashed red), so the
gap is the target work saved. **Tokens per target forward** is the hardware-independent speed-up. **Tokens / s
(decoding)** counts the steps' time only (draft + verify + accept) and depends on this machine; the prompt's
prefill is reported apart, once, because it is paid before the first step whatever the method.
"""

COMPARE_HELP = f"""
**What am I seeing?** The same prompt and settings through every method. **same text as ar** says whether a
method wrote exactly what the target alone writes. At temperature 0 every lossless method must say *yes*; a
*NO* from ti-mcsd is its lossiness showing. At temperature > 0 texts differ even for lossless methods because the
random draws differ (they agree in distribution, not token by token).

**hf-assisted (transformers)** is the peer: transformers' own assisted generation, `generate(assistant_model=...)`,
with the same pair, prompt, sampling settings, seed and token budget, and its own defaults otherwise: a chain of
up to 20 draft tokens a round, cut where the draft's confidence falls under 0.4; no tree. Its numbers are read
like ours: tokens / s counts decoding only (its prefill, done inside `generate`, is measured apart just before,
one forward of each model over the prompt, and taken out), and each target forward is one verification round.

**Why can a speculative method be slower than ar here?** On a CPU a forward's cost grows with the rows it scores:
the CPU is busy computing, not waiting for memory, so verifying the {_DEFAULT_TREE.num_nodes + 1} rows of the default \
{Shape.text(_DEFAULT_TREE.branching)} tree costs several single-token forwards, and each of the tree's \
{_DEFAULT_TREE.depth} draft forwards is not free either. A wide tree then saves target forwards (tokens / target \
forward > 1) yet loses time (tokens / s below ar). On a GPU, one forward over {_DEFAULT_TREE.num_nodes + 1} rows \
costs about as much as over one, which is where trees pay. On a CPU narrow trees win: see the
recipe *Fastest lossless on a CPU*.
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


# the controls a recipe may set: changing one by hand turns the Recipe box to "custom"
RECIPE_CONTROLS = tuple(name for name, o in OPTIONS.items() if o.group != "sampling")


def settings_from(controls: dict) -> Settings:
    return Settings(**controls).normalised()


def pair_choices() -> list[str]:
    return known_pairs() + ([CUSTOM] if PAIRS.allow_custom else [])


def _status(message: str, kind: str = "info") -> str:
    # plain symbols, not emoji: they render on machines without an emoji font (headless browsers, servers)
    icon = {"info": "→", "warn": "⚠", "error": "✗", "ok": "✓"}[kind]
    return f"{icon} {message}"


FIGURES = ("tree", "mask", "pq", "stop", "timeline")  # the step's figures, in the order of the views' outputs


def _figures_sent(session: Session, figures: dict[str, go.Figure | None]) -> list:
    """Each figure as it is sent to the session's page: its Plotly JSON (None: no figure), or gr.skip() when the
    page shows that very content already (dynasd/explorer/shown.py), so it neither travels nor is drawn again."""
    with session.sent.update() as page:
        sent = []
        for name in FIGURES:
            plot = None if figures[name] is None else figures[name].to_json()
            sent.append(plot if page.changed(name, plot or "") else gr.skip())
    return sent


def _empty_views(session: Session, status: str) -> tuple:
    return (gr.HighlightedText(value=[], color_map={}), *_figures_sent(session, dict.fromkeys(FIGURES)), "",
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
                   mask=viz.mask_figure(step, viz.max_mask_rows(run.config, step.max_nodes), root_label=root),
                   pq=viz.pq_figure(step), stop=viz.stop_figure(step), timeline=viz.timeline_figure(run, index))
    return viz.text_spans(run, index), figures, viz.summary_markdown(run, index), story


def render(session: Session, index: int | None = None, status: str = "") -> tuple:
    """Every view of one step of the session's run, as sent to its page: a figure the page shows already is
    left out."""
    run = session.run
    if run is None or not run.steps:
        return _empty_views(session, status or _status("Press **Step** or **Run** to start."))
    last = len(run.steps) - 1
    index = last if index is None else max(0, min(int(index), last))
    spans, figures, summary, story = step_views(run, index)
    return (
        gr.HighlightedText(value=spans, color_map=viz.text_color_map(spans)),
        *_figures_sent(session, figures),
        summary,
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
    if isinstance(exc, FinishedRun):  # not a mistake: no toast, and the step being looked at stays on show
        return tuple(gr.skip() for _ in range(7)) + (_status(message[0].upper() + message[1:] + ".", "info"),
                                                     gr.skip(), gr.skip(), session.id)
    gr.Warning(message)
    try:
        return render(session, status=_status(message, kind))
    except Exception as render_exc:  # the run on show cannot be drawn (a hostile trace?): show nothing instead
        _unexpected(render_exc)
        return _empty_views(session, _status(message, kind))


class FinishedRun(UserError):
    """Step or Run pressed once on a finished run: the run and the step on show stay as they are."""


def _unexpected(exc: Exception) -> SessionFailed:
    """A bug, not a user mistake: the traceback goes to the server log, the user gets one line."""
    traceback.print_exception(exc, file=sys.stderr)
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return SessionFailed(f"something went wrong on the server ({type(exc).__name__}{': ' + first if first else ''});"
                         " other sessions are not affected; press Reset to start over")


def _busy_guard(session: Session) -> None:
    if session.run_in_progress:
        raise UserError("a Run is in progress in this session: press Stop first")


# ---------------------------------------------------------------------------------------------------------------
# event handlers

def _ensure_run(session: Session, settings: Settings, prompt: str) -> str:
    """Start a new run when there is none, or the settings or prompt changed. A finished run is not replaced
    silently: the first Step or Run after it says so (it stays on show), the second starts the new run. A failed
    session stays failed (and says so) until Reset or a change of settings or prompt."""
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
    session.start(PAIRS, settings, prompt)
    return f"{reason}; {_start_costs(session)}"


def _start_costs(session: Session) -> str:
    """What starting the run cost, said once, because no step's time includes it."""
    loaded = f"loading the models took {session.load_seconds:.1f} s, " if session.load_seconds >= 0.05 else ""
    tokens = len(session.run.prompt_ids)
    return f"{loaded}prefill of {tokens} prompt tokens took {session.prefill_seconds * 1000:.0f} ms"


def _announce_loading(settings: Settings) -> bool:
    """On the first use of a pair, a toast says the models are loading (tens of seconds on a CPU): it goes at
    once, in the event's own stream and so before its update, which a separate status event could not promise.
    Returns whether it was said."""
    if settings.pair_key in PAIRS.loaded():
        return False
    gr.Info(f"Loading the model pair {settings.pair_key[:80]} (first use: this can take a while on a CPU)…")
    return True


def _step_time(step) -> str:
    ms = (step.draft_seconds + step.verify_seconds + step.accept_seconds) * 1000
    return f"Step {step.index} took {ms:.0f} ms (draft + verify + accept; prefill not included)."


@on_gpu(runs=0)
def on_step(session_id, prompt, **controls):
    session = SESSIONS.get(session_id)
    try:
        _busy_guard(session)
        settings = settings_from(controls)
        _announce_loading(settings)
        with session.lock:
            note = _ensure_run(session, settings, prompt)
            step = session.step(PAIRS)
        status = _step_time(step) + (f" ({note})" if note else "")
        if session.done:
            status += " The run is finished."
        return render(session, status=_status(status, "ok"))
    except Exception as exc:
        return _failed(session, exc)


def _run_finished_status(session: Session, run) -> str:
    summary = run.summary()
    verb = "Stopped" if session.stop_requested and not run.finished else "Done"
    return _status(f"{verb} after {summary['steps']} steps: {summary['new_tokens']} tokens, "
                   f"{summary['tokens_per_target_forward']:.2f} tokens per target forward.", "ok")


@on_gpu(runs=0)
def on_run_begin(session_id, prompt, tick, **controls):
    """The browser's Run: start (or continue) the run, take its first step and hand the page a new `tick`. The
    page asks for each next step (on_run_next) only after it has applied this one, so a slow page slows the run
    down instead of falling behind it: the server used to finish a run seconds before the page had drawn it,
    and Stop arrived after the end."""
    session = SESSIONS.get(session_id)
    try:
        settings = settings_from(controls)
        _announce_loading(settings)
        with session.lock:
            _busy_guard(session)  # under the lock: two Runs in one session cannot both pass
            note = _ensure_run(session, settings, prompt)
            session.stop_requested = session.stopped_by_page = False
            session.paced_at = time.monotonic()  # in progress from its first step on: a Stop then is heard
            step = session.step(PAIRS)
            ended = session.done or session.stop_requested  # a Stop heard during the step ends the run with it
            session.paced_at = None if ended else time.monotonic()
        if ended:
            return render(session, status=_run_finished_status(session, session.run)) + (gr.skip(),)
        running = f"{RUNNING} step {step.index}" + (f" ({note})" if note else "")
        return render(session, status=_status(running)) + ((tick or 0) + 1,)
    except Exception as exc:
        session.paced_at = None
        return _failed(session, exc) + (gr.skip(),)


@on_gpu(runs=0)
def on_run_next(session_id, tick, stop_pressed=False):
    """One more step of a browser-paced Run (see on_run_begin), or its end: Stop (pressed in the page, which
    says so with this request: `stop_pressed`, or heard by on_stop), Reset, or the run finished."""
    session = SESSIONS.get(session_id)
    if session.paced_at is None:  # Reset, a loaded trace or a new Step replaced the run: nothing more to draw
        return tuple(gr.skip() for _ in range(12))
    try:
        with session.lock:
            if stop_pressed and not session.stop_requested:  # the page saw Stop before its request reached us
                session.stop_requested = session.stopped_by_page = True
            run = session.run
            if session.stop_requested or run is None or run.finished:
                session.paced_at = None
                return render(session, status=_run_finished_status(session, run)) + (gr.skip(),)
            step = session.step(PAIRS)
            ended = session.done or session.stop_requested  # a Stop heard during the step ends the run with it
            session.paced_at = None if ended else time.monotonic()
        if ended:
            return render(session, status=_run_finished_status(session, run)) + (gr.skip(),)
        return render(session, status=_status(f"{RUNNING} step {step.index}")) + ((tick or 0) + 1,)
    except Exception as exc:
        session.paced_at = None
        return _failed(session, exc) + (gr.skip(),)


@on_gpu(runs=1)
def on_run(session_id, prompt, **controls):
    """The Run of API clients: a stream of updates, at most one per STREAM_EVERY_S, until done or Stop (checked
    between steps). The browser's Run button is paced by the page instead (on_run_begin)."""
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
                    yield render(session, status=_status(f"{RUNNING} step {len(run.steps) - 1}"))
        finally:
            session.running = False
            session.touch()
        yield render(session, status=_run_finished_status(session, run))
    except Exception as exc:
        yield _failed(session, exc)


@on_gpu(runs=0)
def on_follow_up(session_id, message):
    session = SESSIONS.get(session_id)
    try:
        _busy_guard(session)
        with session.lock:
            session.follow_up(PAIRS, message)
        return render(session, status=_status(f"Turn {len(session.turns)} of the conversation: press **Step** or "
                                              "**Run** to answer the follow-up.", "ok"))
    except Exception as exc:
        return _failed(session, exc)


def on_stop(session_id):
    """Stop takes effect before the next step. With nothing running it says so, and the status does not wait
    for an end that will never come. The page's paced Run is told by the page itself (NEXT_STEP_JS), which also
    writes "Stopping…" at once: this reply then leaves the page's status alone, since it may arrive after the
    run's last update ("Stopped after …"), which it must not overwrite."""
    session = SESSIONS.get(session_id)
    if session.stopped_by_page:  # this Stop's own click already ended the page's Run
        session.stopped_by_page = False
        return gr.skip(), session.id
    if not session.run_in_progress:
        steps = len(session.run.steps) if session.run is not None else 0
        where = (f" (the run on show is finished: {steps} steps)" if session.done
                 else f" (the run on show stopped after {steps} steps: Run or Step go on with it)" if steps
                 else " (Run to start one, Step to take one step)")
        return _status("Nothing is running: nothing to stop" + where + "."), session.id
    session.stop_requested = True
    return (gr.skip() if session.paced_run_alive else _status(STOPPING)), session.id


def on_reset(session_id):
    session = SESSIONS.get(session_id)
    if session.run_in_progress:
        session.stop_requested = True
    with session.lock:
        session.reset()
    return _empty_views(session, _status("Reset. Press **Step** or **Run** to start a new run."))


def on_show_step(session_id, index):
    session = SESSIONS.get(session_id)
    if session.run is None or not session.run.steps:
        return _empty_views(session, _status("Nothing to show yet: press **Step** or **Run**."))
    try:
        index = int(index)
        return render(session, index, status=_status(f"Showing step {index}."))
    except Exception as exc:
        return _failed(session, exc)


@on_gpu(runs=len(METHODS) + 1)
def on_compare(session_id, prompt, **controls):
    """Every method on the prompt, then transformers' assisted generation as the peer (when the pair allows it;
    dynasd/explorer/peer.py); the table grows as each one finishes."""
    session = SESSIONS.get(session_id)
    rows, runs = [], {}
    try:
        settings = settings_from(controls)
        for method, run in compare_methods(PAIRS, settings, prompt):
            runs[method] = run
            rows = viz.compare_rows(runs)
            yield (pd.DataFrame(rows), viz.compare_figure(rows), _status(f"{method} done…"), session.id)
        yield (gr.skip(), gr.skip(), _status(f"Our methods done; running {PEER_LABEL}…"), session.id)
        try:
            peers = {PEER_LABEL: run_peer(PAIRS, settings, prompt)}
            done = f"all methods compared, and {PEER_LABEL} beside them."
        except UserError as exc:  # the explorer's rows stand; the status says why the peer is missing
            peers, done = {}, f"all methods compared; no {PEER_LABEL} row: {exc}."
        rows = viz.compare_rows(runs, peers)
        yield pd.DataFrame(rows), viz.compare_figure(rows), _status(done[0].upper() + done[1:], "ok"), session.id
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
        return _empty_views(session, _status("Choose a trace file (.json) to load.", "warn")) + _control_updates()
    try:
        _busy_guard(session)
        run = load_trace(path)
        if not run.steps:
            raise UserError("that trace has no steps")
        with session.lock:
            session.load(run)
            try:
                step_views(run, 0)  # the scrubber can reach both ends
                views = render(session, status=_status(
                    f"Loaded a {run.method[:40]} trace of {len(run.steps)} steps on {run.pair[:80]}: replaying, "
                    "no model needed.", "ok"))
            except Exception as exc:  # passed the schema checks but cannot be drawn: refuse it, say why
                _unexpected(exc)
                session.reset()
                raise UserError("cannot show that trace: its steps do not describe a drawable tree") from exc
        return views + _control_updates(run.prompt, settings_of_trace(run))
    except Exception as exc:
        return _failed(session, exc) + _control_updates()


def on_recipe(name: str | None):
    """Set the method controls to a recipe; the pair, prompt and sampling controls stay as they are. A recipe
    that turns dynamic depth on opens that section, so the settings it changed are in sight.
    Returns the control updates, the status and the Dynamic depth accordion."""
    unchanged = _control_updates()[1:]  # [0] is the prompt box, which a recipe leaves alone
    if not name or name == CUSTOM_RECIPE:
        return unchanged + (gr.update(), gr.update())
    try:
        values = {key: OPTIONS[key].record(value) for key, value in recipe_values(name).items()}
    except ValueError as exc:
        return unchanged + (_status(str(exc), "warn"), gr.update())
    shown = ", ".join(f"{OPTIONS[key].title} {value}" for key, value in values.items())
    return (tuple(gr.update(value=values[control]) if control in values else gr.update()
                  for control in CONTROL_NAMES)
            + (_status(f"Recipe set ({shown}). Press **Step** or **Run**.", "ok"),
               gr.update(open=True) if values.get("dynamic_depth") else gr.update()))


def on_control_edited():
    """A method control changed by hand: the controls no longer are the recipe on show."""
    return CUSTOM_RECIPE


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
/* every token is its own span: a hairline between pieces shows where the tokenizer cut ("Ray" + "leigh") */
#dynasd-text .textfield .token { margin: 1px 1px; box-shadow: inset -1px 0 0 rgba(0, 0, 0, 0.35); }
.explain { font-size: 0.92em; }
.clamp-note { color: #b35900; font-size: 0.85em; margin-top: 2px; }
#run-buttons { flex-wrap: nowrap; gap: 6px; }
#run-buttons button { min-width: 0; padding-left: 4px; padding-right: 4px; }
/* a phone: prompt, buttons and status on top, then the results, then the settings */
@media (max-width: 640px) {
  .gradio-container { padding: 4px !important; }
  #intro { font-size: 0.85em; }
  #intro h1 { font-size: 1.3em; margin: 0; }
  #intro p:not(:last-of-type) { display: none; }
  #main-row { flex-direction: column; }
  #controls-column { display: contents; }
  #top-controls { order: 0; }
  #results-column { order: 1; }
  #settings-column { order: 2; }
  #example-prompts, #top-controls .gallery { display: none; }
  .js-plotly-plot .modebar { display: none !important; }
}
"""

# Sliders clamp a typed value to their range without a word (Gradio's own behaviour): this note says what
# was typed and what it became, next to the slider, so a run at 2.0 after typing 5 is no surprise.
CLAMP_NOTE_JS = """
<script>
document.addEventListener("change", (event) => {
  const box = event.target;
  if (!(box instanceof HTMLInputElement) || box.type !== "number") return;
  const block = box.closest(".block");
  const range = block && block.querySelector("input[type=range]");
  if (!range) return;
  const typed = parseFloat(box.value), low = parseFloat(range.min), high = parseFloat(range.max);
  let note = block.querySelector(".clamp-note");
  if (Number.isNaN(typed) || (typed >= low && typed <= high)) { if (note) note.remove(); return; }
  if (!note) { note = document.createElement("div"); note.className = "clamp-note"; block.appendChild(note); }
  const used = Math.min(Math.max(typed, low), high);
  note.textContent = `${typed} is outside ${low} to ${high}: set to ${used}.`;
}, true);
</script>
"""


# The paced Run's page side. Stop sets a flag in the page at once (its request to the server may arrive after
# the page's next request for a step); the page asks for the next step a frame and a task after it applied the
# last one, when its figures are drawn and a click made meanwhile has been handled, and sends the flag with it.
RUN_PRESSED_JS = "() => { window.dynasdStopPressed = false; }"
WORKING_JS = f"() => {json.dumps(_status('Working on the next step…'))}"
STOP_PRESSED_JS = f"""
(status) => {{
  window.dynasdStopPressed = true;
  return (typeof status === "string" && status.startsWith({json.dumps(_status(RUNNING))}))
    ? {json.dumps(_status(STOPPING))} : status;
}}
"""
NEXT_STEP_JS = """
async (session, tick, stopPressed) => {
  await new Promise((drawn) => requestAnimationFrame(() => setTimeout(drawn, 0)));
  return [session, tick, window.dynasdStopPressed === true];
}
"""


# The step's five figures are drawn by the page into one Plotly div each, kept from one update to the next
# (Plotly.react redraws it in place). gr.Plot rebuilds its Plotly component for every new figure and draws the
# figure twice, once into the component it throws away: half of a Step's drawing time in the page. The figures
# travel as Plotly JSON, drawn by the plotly.js of the installed plotly package (the version that wrote them).
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
FIGURE_HEAD = f'<script src="gradio_api/file={PLOTLY_JS.as_posix()}"></script>'
# The library is kept as window.dynasdPlotly at first use: a gr.Plot shown later (Learn, Compare) loads gradio's
# own copy as window.Plotly, and a div must stay with the library that drew it.
FIGURE_JS = """
const box = element.querySelector('.dynasd-figure');
const draw = () => {
  const plotly = window.dynasdPlotly = window.dynasdPlotly || window.Plotly;
  if (!plotly) { setTimeout(draw, 50); return; }  // plotly.js is still loading
  if (!props.value) { plotly.purge(box); return; }
  const figure = JSON.parse(props.value);
  figure.layout.autosize = true;
  plotly.react(box, figure.data, figure.layout, {displaylogo: false});
};
// A figure drawn in a hidden tab takes plotly's default width: redraw it to the box's width when that changes
// (the tab shown, the window resized).
let width = box.clientWidth;
new ResizeObserver(() => {
  const now = box.clientWidth;
  if (now && now !== width && box.data && window.dynasdPlotly) window.dynasdPlotly.Plots.resize(box);
  width = now;
}).observe(box);
watch('value', draw);
draw();
"""


def figure_view(label: str, elem_id: str) -> gr.HTML:
    """One of the step's figures: its value is the figure's Plotly JSON (None: empty), drawn by FIGURE_JS."""
    return gr.HTML(None, label=label, elem_id=elem_id, html_template='<div class="dynasd-figure"></div>',
                   js_on_load=FIGURE_JS, head=FIGURE_HEAD, container=True, min_height=120)


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
        gr.Markdown(INTRO, elem_id="intro")
        with gr.Row(equal_height=False, elem_id="main-row"):
            with gr.Column(scale=1, min_width=320, elem_id="controls-column"):
                # two columns inside: on a phone (CSS) the first stays on top, the results come next and the
                # settings last, so Step and the figures are in reach without scrolling past every control
                with gr.Column(elem_id="top-controls"):
                    prompt = gr.Textbox(label="Prompt", value=EXAMPLES[0], lines=3, max_lines=8, elem_id="prompt-box")
                    # one row of four, on a phone too (CSS), right under the prompt: Step must not need a scroll
                    with gr.Row(elem_id="run-buttons"):
                        step_btn = gr.Button("Step", variant="primary", elem_id="step-btn", min_width=60)
                        run_btn = gr.Button("Run", variant="primary", elem_id="run-btn", min_width=60)
                        stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn", min_width=60)
                        reset_btn = gr.Button("Reset", variant="secondary", elem_id="reset-btn", min_width=60)
                    with gr.Row(equal_height=True, elem_id="follow-up-row"):
                        follow_up = gr.Textbox(label="Follow-up message (after a finished run)", lines=1,
                                               scale=3, elem_id="follow-up")
                        follow_up_btn = gr.Button("Send follow-up", scale=1, elem_id="follow-up-btn")
                    status = gr.Markdown(_status("Press **Step** or **Run** to start."), elem_id="status",
                                         label="status")
                    scrubber = gr.Slider(minimum=0, maximum=1, value=0, step=1, label="Step on show",
                                         interactive=False, elem_id="scrubber")
                    gr.Examples(examples=[[e] for e in EXAMPLES], inputs=[prompt], label="Example prompts")
                with gr.Column(elem_id="settings-column"):
                    controls: dict[str, gr.Component] = {}
                    with gr.Accordion("Model and method", open=True):
                        controls["pair"] = gr.Dropdown(
                            pair_choices(), value=default_pair, label="Model pair (target + draft)",
                            info="tiny-random: instant toy pair; presets need the Hugging Face hub")
                        controls["target"] = gr.Textbox(label="Target model (hub id, folder or .gguf)",
                                                        value=default_target, visible=default_pair == CUSTOM)
                        controls["draft"] = gr.Textbox(label="Draft model (same tokenizer)", value=default_draft,
                                                       visible=default_pair == CUSTOM)
                        recipe = gr.Dropdown([CUSTOM_RECIPE, *RECIPES], value=CUSTOM_RECIPE, label="Recipe",
                                             elem_id="recipe",
                                             info="set the method controls to a paper's configuration or the fastest "
                                                  "one measured on a CPU")
                        for name in options_in("method"):
                            controls[name] = option_control(OPTIONS[name], default_pair)
                            if name == "method":
                                method_help = gr.Markdown(METHOD_HELP[OPTIONS["method"].default],
                                                          elem_classes="explain")
                    with gr.Accordion("Dynamic depth", open=False) as dynamic_section:
                        for name in options_in("dynamic"):
                            controls[name] = option_control(OPTIONS[name], default_pair)
                    with gr.Accordion("Sampling", open=False):
                        for name in options_in("sampling"):
                            controls[name] = option_control(OPTIONS[name], default_pair)
                        controls["max_new_tokens"] = gr.Slider(1, MAX_NEW_TOKENS_LIMIT,
                                                               value=RUN_FIELDS["max_new_tokens"], step=1,
                                                               label="Max new tokens", elem_id="max-new-tokens")
                    with gr.Accordion("Advanced", open=False):
                        for name in options_in("advanced"):
                            controls[name] = option_control(OPTIONS[name], default_pair)
            with gr.Column(scale=3, elem_id="results-column"):
                text = gr.HighlightedText(label="Generated text (colour = where each token came from)",
                                          color_map=viz.text_color_map(), show_legend=True,
                                          show_inline_category=False, combine_adjacent=False,
                                          elem_id="dynasd-text")
                story = gr.Markdown("", elem_id="story", label="story")
                with gr.Row(equal_height=False):
                    with gr.Column(scale=1, min_width=360):
                        tree_plot = figure_view("Candidate tree", "tree-plot")
                        with gr.Accordion("What am I seeing? (tree)", open=True):
                            gr.Markdown(TREE_HELP, elem_classes="explain")
                    with gr.Column(scale=1, min_width=360):
                        mask_plot = figure_view("Verify mask", "mask-plot")
                        with gr.Accordion("What am I seeing? (mask)", open=True):
                            gr.Markdown(MASK_HELP, elem_classes="explain")
                with gr.Tabs(overflow_behavior="wrap") as tabs:  # on a phone every tab stays a button
                    with gr.Tab("Decisions"):
                        with gr.Row(equal_height=False):
                            with gr.Column(scale=3):
                                pq_plot = figure_view("p vs q per candidate", "pq-plot")
                                stop_plot = figure_view("Early-stop scores", "stop-plot")
                            gr.Markdown(DECISIONS_HELP, elem_classes="explain")
                    with gr.Tab("Summary"):
                        with gr.Row(equal_height=False):
                            with gr.Column(scale=3):
                                summary = gr.Markdown("", elem_id="summary", label="summary")
                                timeline_plot = figure_view("Run timeline", "timeline-plot")
                            gr.Markdown(SUMMARY_HELP, elem_classes="explain")
                    with gr.Tab("Compare"):
                        with gr.Row(equal_height=False):
                            with gr.Column(scale=3):
                                compare_btn = gr.Button(f"Compare {', '.join(METHODS)} and transformers' "
                                                        "assisted generation on this prompt", elem_id="compare-btn")
                                compare_status = gr.Markdown("", label="compare status")
                                compare_table = gr.Dataframe(label="Methods side by side", interactive=False, wrap=True)
                                compare_plot = gr.Plot(label="Speed", elem_id="compare-plot", show_label=False)
                            gr.Markdown(COMPARE_HELP, elem_classes="explain")
                    with gr.Tab("Trace"):
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
        # No progress overlay on a Step, a Run's steps or a scrub: its animation kept a core of this 2-core machine
        # busy while the model stepped (the step took ~25% longer); the status line says at once that work began.
        step_btn.click(None, None, [status], js=WORKING_JS, queue=False, api_visibility="private")
        step_btn.click(on_step, [session_id, prompt], views, inputs_kwargs=controls, api_name="step",
                       show_progress="hidden")
        # Run in the page: one step per event, the next asked for (a tick State whose change is the request) once
        # the page has drawn the last, with whether Stop was pressed meanwhile (NEXT_STEP_JS), so the display
        # keeps pace and no step begins after a Stop the page has seen, however long the drawing takes.
        run_tick = gr.State(0)
        stop_pressed = gr.Checkbox(False, visible=False, label="Stop pressed during the Run")
        run_btn.click(None, js=RUN_PRESSED_JS, queue=False, api_visibility="private")
        run_btn.click(on_run_begin, [session_id, prompt, run_tick], views + [run_tick], inputs_kwargs=controls,
                      api_visibility="private", show_progress="hidden")
        run_tick.change(on_run_next, [session_id, run_tick, stop_pressed], views + [run_tick], js=NEXT_STEP_JS,
                        api_visibility="private", show_progress="hidden")
        # Run for API clients: a stream of updates (there is no page to pace it)
        run_api = gr.Button("Run (API)", visible=False)
        run_api.click(on_run, [session_id, prompt], views, inputs_kwargs=controls, api_name="run")
        follow_up_btn.click(on_follow_up, [session_id, follow_up], views, api_name="follow_up")
        stop_btn.click(None, [status], [status], js=STOP_PRESSED_JS, queue=False, api_visibility="private")
        stop_btn.click(on_stop, [session_id], [status, session_id], api_name="stop", queue=False)
        reset_btn.click(on_reset, [session_id], views, api_name="reset")
        # input: dragging (always_last keeps only the latest position) or typing a step number
        scrubber.input(on_show_step, [session_id, scrubber], views, api_name="show_step", trigger_mode="always_last",
                       show_progress="hidden")
        compare_btn.click(on_compare, [session_id, prompt], [compare_table, compare_plot, compare_status, session_id],
                          inputs_kwargs=controls, api_name="compare")
        save_btn.click(on_save, [session_id], [saved_file, status, session_id], api_name="save_trace")
        load_file.upload(on_load, [session_id, load_file], views + [prompt, *shown], api_name="load_trace")
        learn_section(demo, tabs, session_id, prompt, scrubber, controls, views)
        recipe.input(on_recipe, [recipe], [*shown, status, dynamic_section], api_visibility="private", queue=False)
        for name in RECIPE_CONTROLS:
            controls[name].input(on_control_edited, None, recipe, api_visibility="private", queue=False)
        controls["method"].change(on_method_change, [controls["method"]],
                                  [method_help, *(controls[name] for name in SHOWN_BY_METHOD)],
                                  api_visibility="private")
        controls["pair"].change(on_pair_change, [controls["pair"]],
                                [controls["target"], controls["draft"], controls["draft_kind"]],
                                api_visibility="private")
    return demo


# ---------------------------------------------------------------------------------------------------------------
# Learn: teaching views of the step on show (guided phases, the residual, the acceptance test, the cost model,
# two methods on one step, an empirical losslessness check, shareable links and example traces). Everything here
# is wired in learn_section(), called once from build_app; the figures are viz/residual.py, guided.py, cost.py,
# losslessness.py, the arithmetic dynasd/explorer/cost.py, losslessness.py, side_by_side.py and share.py.

from dynasd.explorer import cost as cost_model  # noqa: E402
from dynasd.explorer import losslessness, share, side_by_side  # noqa: E402
from dynasd.explorer.inputs import check_prompt  # noqa: E402
from dynasd.explorer.session import build_decoder, encode  # noqa: E402
from viz.cost import cost_figure, cost_markdown  # noqa: E402
from viz.guided import guided_figure, step_phases  # noqa: E402
from viz.losslessness import losslessness_figure, losslessness_markdown  # noqa: E402
from viz.residual import acceptance_figure, residual_explanation, residual_figure  # noqa: E402

LEARN_HELP = """
**Learn one step at a time.** Each view below explains the step on show (the step slider on the left) and follows
it while this tab is open (a Run is followed once it ends). **Guided step** replays it phase by phase: **→** /
**←** (or the buttons) go to the next / previous phase, **Shift + →** presses **Step**. **Residual** shows why
sampling stays exact when a candidate is rejected, **Acceptance test** the draw behind every decision. **Cost
model** explains the speed-up on this device; **Side by side** runs two methods from the same prefix;
**Losslessness** samples the next token hundreds of times and compares it with the target.
"""

# Keyboard shortcuts: a page-load script (Blocks.load with js only). Keys typed into a text box are left alone.
LEARN_KEYS_JS = """
() => {
  if (window.__dynasdLearnKeys) return;
  window.__dynasdLearnKeys = true;
  document.addEventListener('keydown', (event) => {
    const target = event.target;
    const tag = target && target.tagName ? target.tagName.toLowerCase() : '';
    if (tag === 'input' || tag === 'textarea' || tag === 'select' || (target && target.isContentEditable)) return;
    if (event.altKey || event.ctrlKey || event.metaKey) return;
    const click = (id) => { const b = document.getElementById(id); if (b) { b.click(); event.preventDefault(); } };
    if (event.key === 'ArrowRight' && event.shiftKey) click('step-btn');
    else if (event.key === 'ArrowRight') click('learn-next');
    else if (event.key === 'ArrowLeft') click('learn-prev');
  });
}
"""

LEARN_FOLLOWS_JS = """
() => {
  const explain = document.getElementById('learn-explain');
  const status = document.getElementById('status');
  const running = status && status.innerText.startsWith(%s);  // as STOP_PRESSED_JS tells a Run
  if (explain && explain.offsetParent !== null && !running) explain.click();
}
""" % json.dumps(_status(RUNNING))

# The link box receives "?query" from Python; the browser knows the page's own address and completes it.
FULL_LINK_JS = """
(query) => (typeof query === 'string' && query.startsWith('?'))
  ? window.location.origin + window.location.pathname + query : query
"""


def _learn_step(session: Session, index) -> tuple:
    """(run, index, step) of the step on show, or a UserError saying what to do first."""
    run = session.run
    if run is None or not run.steps:
        raise UserError("nothing to explain yet: press Step or Run (or replay an example) first")
    index = max(0, min(int(index or 0), len(run.steps) - 1))
    return run, index, run.steps[index]


def _greedy(run) -> bool:
    return float(run.config.get("temperature", 0.0)) == 0.0


def _guided_views(run, index: int, phase) -> tuple:
    step = run.steps[index]
    phases = step_phases(step)
    at = max(0, min(int(phase or 0), len(phases) - 1))
    shown = phases[at]
    figure = guided_figure(step, shown, viz.root_token(run, index), lossy=not run.lossless)
    text = f"**Phase {at + 1} of {len(phases)}: {shown.title}.** {shown.text}"
    slider = gr.Slider(minimum=0, maximum=max(len(phases) - 1, 1), value=at, step=1, interactive=len(phases) > 1,
                       label=f"Phase ({at + 1} of {len(phases)})")
    return figure, text, slider


def on_learn(session_id, index, phase=0):
    """Every Learn view of the step on show: the guided step at `phase`, the residual and the acceptance test."""
    session = SESSIONS.get(session_id)
    try:
        run, index, step = _learn_step(session, index)
        greedy = _greedy(run)
        return (*_guided_views(run, index, phase), residual_figure(step, greedy), residual_explanation(step, greedy),
                acceptance_figure(step, greedy), _status(f"Explaining step {index}.", "ok"), session.id)
    except UserError as exc:
        return (None, "", gr.update(), None, "", None, _status(str(exc), "warn"), session.id)
    except Exception as exc:
        return (None, "", gr.update(), None, "", None, _status(str(_unexpected(exc)), "error"), session.id)


def on_phase(session_id, index, phase):
    session = SESSIONS.get(session_id)
    try:
        run, index, _ = _learn_step(session, index)
        return (*_guided_views(run, index, phase), session.id)
    except UserError as exc:
        return (None, _status(str(exc), "warn"), gr.update(), session.id)


def _learn_failure(exc: Exception, outputs: int, session_id) -> tuple:
    """`outputs` empty views, then the message in the Learn status line (and a toast)."""
    if not isinstance(exc, (UserError, SessionFailed)):
        exc = _unexpected(exc)
    gr.Warning(str(exc))
    return (None,) * outputs + (_status(str(exc), "warn"), session_id)


@on_gpu(runs=0)
def on_cost(session_id, index, calibrate, **controls):
    """The cost model of the run on show: a calibrated verify cost when asked (runs the target), else the run's
    own verify times."""
    session = SESSIONS.get(session_id)
    try:
        run, index, _ = _learn_step(session, index)
        shape = cost_model.run_shape(run)
        calibration = None
        if calibrate:
            settings = session.settings or settings_from(controls)
            pair = PAIRS.get(settings)
            context = (list(run.prompt_ids) + list(run.new_token_ids))[-256:]
            with PAIRS.lock_for(pair):
                calibration = cost_model.calibrate(pair.target, context)
        costs = cost_model.costs_from(shape, calibration)
        where = "calibrated on this device" if calibration else "from this run's own verify times"
        text = cost_markdown(shape, costs)
        if not calibration and len(set(shape.verify_rows)) == 1:
            text = ("**Every step of this run verified the same number of rows**, so its own times cannot tell the "
                    "cost of a row from the cost of a forward: the numbers below treat rows as free (ar = one "
                    "verify). Tick *calibrate* to measure the row cost on this device.\n\n" + text)
        return (cost_figure(shape, costs), text,
                _status(f"Cost model of this {run.method} run ({where}).", "ok"), session.id)
    except ValueError as exc:  # UserError included: a run too short, a bad setting
        return _learn_failure(exc if isinstance(exc, UserError) else UserError(str(exc)), 2, session.id)
    except Exception as exc:
        return _learn_failure(exc, 2, session.id)


@on_gpu(runs=0)
def on_side_by_side(session_id, index, method_a, method_b, **controls):
    """Two methods from the prefix of the step on show (or from the prompt when there is no run)."""
    session = SESSIONS.get(session_id)
    try:
        settings = session.settings if session.run is not None and not session.replay else None
        settings = settings or settings_from(controls)
        run, index, _ = _learn_step(session, index)
        prefix = side_by_side.prefix_before(run, index)
        runs = side_by_side.side_by_side(PAIRS, settings, (method_a, method_b), prefix, run.prompt)
        views = []
        for method, one in runs.items():
            one.steps[0].index = index  # the one step is the run on show's step `index`, taken another way
            story = viz.step_story(one, 0).replace("**Step 0.**", f"**Step {index}.**", 1)
            if not one.lossless:
                story = "**LOSSY** (ti-mcsd, width > 1). " + story
            views += [viz.tree_figure(one.steps[0], viz.root_token(one, 0), lossy=not one.lossless),
                      f"**{method}** · {len(one.steps[0].committed)} token(s) for one target forward. {story}"]
        return (*views, _status(f"{method_a} and {method_b} from the prefix of step {index}.", "ok"), session.id)
    except Exception as exc:
        return _learn_failure(exc, 4, session.id)


@on_gpu(seconds=GPU_MAX_S)
def on_losslessness(session_id, prompt, lossless_method, samples, **controls):
    """The first token after the prompt, sampled `samples` times by a lossless method and by ti-mcsd, against p."""
    session = SESSIONS.get(session_id)
    try:
        settings = settings_from(controls)
        if settings.temperature == 0:
            raise UserError("set the temperature above 0 (Sampling): at temperature 0 every method is greedy and "
                            "there is nothing random to compare")
        samples = int(samples)
        if not 1 <= samples <= losslessness.MAX_SAMPLES:
            raise UserError(f"samples must lie in [1, {losslessness.MAX_SAMPLES}]")
        methods = list(dict.fromkeys([lossless_method, "ti-mcsd"]))
        pair = PAIRS.get(settings)
        ids = encode(pair, check_prompt(prompt))
        probs = losslessness.target_next_probs(pair.target, ids, settings.options.sampling)
        checks, lossless = {}, {}
        for method in methods:
            decoder = build_decoder(pair, settings, method)
            with PAIRS.lock_for(pair):
                draws = losslessness.sample_first_tokens(losslessness.decoder_first_token(decoder, ids), samples,
                                                         seed=settings.seed)
            checks[method], lossless[method] = losslessness.check_samples(draws, probs), decoder.lossless
        labels = dict(zip(checks[methods[0]].token_ids,
                          pair.token_strings([t for t in checks[methods[0]].token_ids if t >= 0])))
        # every check bins the same way (the bins depend on p and n only)
        return (losslessness_figure(checks, labels), losslessness_markdown(checks, lossless),
                _status(f"{samples} samples per method.", "ok"), session.id)
    except Exception as exc:
        return _learn_failure(exc, 2, session.id)


def on_link(session_id, prompt, index, **controls):
    """A link to this prompt, these settings and the step on show ('?query'; the browser completes it)."""
    session = SESSIONS.get(session_id)
    try:
        run = session.run
        step = int(index) if run is not None and run.steps else None
        return "?" + share.link_query(prompt, controls, step), _status("Link ready: copy it.", "ok"), session.id
    except Exception as exc:
        if not isinstance(exc, UserError):
            exc = _unexpected(exc)
        return "", _status(str(exc), "warn"), session.id


def on_open_link(request: gr.Request):
    """On page load: a link's prompt and settings go to the controls, its step to the 'linked step' box."""
    try:
        prompt, settings, step = share.settings_of_query(dict(request.query_params) if request else {})
    except UserError as exc:
        return _control_updates() + (gr.update(), _status(str(exc), "warn"))
    if prompt is None and settings is None:
        return _control_updates() + (gr.update(), gr.update())
    return (_control_updates(prompt, settings) + (gr.update(value=step or 0),
            _status("Opened a shared link: press **Run to the linked step**.", "ok")))


@on_gpu(runs=1)
def on_goto_step(session_id, prompt, target_step, **controls):
    """Start (or continue) the run of these settings until it has the linked step, then show that step."""
    session = SESSIONS.get(session_id)
    try:
        _busy_guard(session)
        target_step = int(target_step or 0)
        if not 0 <= target_step <= share.MAX_LINK_STEP:
            raise UserError(f"the step must lie in [0, {share.MAX_LINK_STEP}]")
        with session.lock:
            settings = settings_from(controls)
            if session.replay or not session.matches(settings, prompt):
                session.start(PAIRS, settings, prompt)
            while len(session.run.steps) <= target_step and not session.done:
                session.step(PAIRS)
        shown = min(target_step, len(session.run.steps) - 1)
        note = "" if shown == target_step else f" (the run finished after step {shown})"
        return render(session, shown, status=_status(f"Showing step {shown}{note}.", "ok"))
    except Exception as exc:
        return _failed(session, exc)


def on_example(session_id, name):
    """Replay a shipped example trace: no model is needed; its prompt and settings go to the controls."""
    session = SESSIONS.get(session_id)
    try:
        _busy_guard(session)
        run = share.load_example(name)
        with session.lock:
            session.load(run)
            views = render(session, 0, status=_status(
                f"Replaying the example '{name}': {len(run.steps)} steps of {run.method} on {run.pair}; no model "
                "needed. Drag the step slider.", "ok"))
        return views + _control_updates(run.prompt, settings_of_trace(run))
    except Exception as exc:
        return _failed(session, exc) + _control_updates()


def learn_section(demo: gr.Blocks, tabs: gr.Tabs, session_id, prompt, scrubber, controls: dict, views: list) -> None:
    """The Learn tab, added as the last of the page's `tabs`, and its events (each endpoint has an api_name)."""
    shown = [controls[name] for name in CONTROL_NAMES]
    examples = list(share.example_traces())
    with tabs, gr.Tab("Learn") as tab:
        gr.Markdown(LEARN_HELP, elem_classes="explain")
        with gr.Row(equal_height=True):
            learn_status = gr.Markdown("", elem_id="learn-status", label="learn status")
            explain_btn = gr.Button("Explain the step on show", elem_id="learn-explain", size="sm", scale=0,
                                    min_width=200)
        with gr.Tabs(overflow_behavior="wrap"):
            with gr.Tab("Guided step"):
                with gr.Row():
                    prev_btn = gr.Button("← previous phase", elem_id="learn-prev", size="sm")
                    next_btn = gr.Button("next phase →", elem_id="learn-next", size="sm", variant="primary")
                phase = gr.Slider(0, 1, value=0, step=1, label="Phase", elem_id="learn-phase")
                phase_text = gr.Markdown("", elem_id="learn-phase-text", label="phase explanation")
                guided_plot = gr.Plot(label="The step, phase by phase", elem_id="learn-guided-plot")
            with gr.Tab("Residual"):
                residual_text = gr.Markdown("", elem_classes="explain", elem_id="learn-residual-text",
                                            label="residual explanation")
                residual_plot = gr.Plot(label="p, q and the residual at the rejection", elem_id="learn-residual-plot")
            with gr.Tab("Acceptance test"):
                gr.Markdown("Each sampled test draws **u** uniformly in [0, 1) and keeps the candidate iff "
                            "**u < min(1, p/q)**: a token the target likes at least as much as the draft is always "
                            "kept, one it likes less is kept in proportion p/q.", elem_classes="explain")
                acceptance_plot = gr.Plot(label="min(1, p/q) and u per test", elem_id="learn-acceptance-plot")
            with gr.Tab("Cost model"):
                with gr.Row():
                    calibrate = gr.Checkbox(value=True, label="calibrate the verify cost on this device",
                                            info="times the target over 1..64 rows (a second or two); off: the "
                                                 "run's own verify times")
                    cost_btn = gr.Button("Explain the speed-up of this run", elem_id="learn-cost-btn")
                cost_text = gr.Markdown("", elem_classes="explain", elem_id="learn-cost-text",
                                        label="cost model explanation")
                cost_plot = gr.Plot(label="Expected speed-up over ar", elem_id="learn-cost-plot")
            with gr.Tab("Side by side"):
                with gr.Row():
                    method_a = gr.Dropdown(list(METHODS), value="sd", label="Method A", elem_id="learn-method-a")
                    method_b = gr.Dropdown(list(METHODS), value="mcsd", label="Method B", elem_id="learn-method-b")
                    pair_btn = gr.Button("Both from the prefix of the step on show", elem_id="learn-pair-btn")
                with gr.Row(equal_height=False):
                    with gr.Column(min_width=320):
                        tree_a = gr.Plot(label="Method A", elem_id="learn-tree-a")
                        story_a = gr.Markdown("", label="story of method A")
                    with gr.Column(min_width=320):
                        tree_b = gr.Plot(label="Method B", elem_id="learn-tree-b")
                        story_b = gr.Markdown("", label="story of method B")
            with gr.Tab("Losslessness"):
                gr.Markdown("Samples the **first token after the prompt** many times, one speculative step each "
                            "with a different seed, and compares the counts with the target's own p (temperature "
                            "and top-k/top-p from *Sampling*; set the temperature above 0).", elem_classes="explain")
                with gr.Row():
                    lossless_method = gr.Dropdown([m for m in METHODS if m not in ("ar", "ti-mcsd")], value="sd",
                                                  label="Lossless method (checked next to ti-mcsd)")
                    samples = gr.Slider(50, losslessness.MAX_SAMPLES, value=100, step=50, label="Samples per method",
                                        info="each sample is one prefill and one step; raise it to see ti-mcsd's "
                                             "skew (a few hundred on tiny-random)")
                    check_btn = gr.Button("Check", elem_id="learn-check-btn")
                check_text = gr.Markdown("", elem_id="learn-check-text", label="losslessness check result")
                check_plot = gr.Plot(label="First token: observed vs p", elem_id="learn-check-plot")
            with gr.Tab("Share and examples"):
                with gr.Row():
                    link_btn = gr.Button("Make a link to this prompt, these settings and this step",
                                         elem_id="learn-link-btn")
                    link = gr.Textbox(label="Link (copy it)", buttons=["copy"], elem_id="learn-link",
                                      interactive=False)
                with gr.Row():
                    linked_step = gr.Number(0, precision=0, label="Linked step", minimum=0)
                    goto_btn = gr.Button("Run to the linked step", elem_id="learn-goto-btn")
                with gr.Row():
                    example = gr.Dropdown(examples, value=examples[0] if examples else None,
                                          label="Example traces (replay at once, no model needed)")
                    example_btn = gr.Button("Replay the example", elem_id="learn-example-btn")

    learn_views = [guided_plot, phase_text, phase, residual_plot, residual_text, acceptance_plot, learn_status,
                   session_id]
    explain_btn.click(on_learn, [session_id, scrubber], learn_views, api_name="learn_step")
    # While the Learn tab is open its views follow the step on show (a Step, Shift+→, a scrub); not during a Run,
    # where they would add a server event to every step.
    scrubber.change(None, js=LEARN_FOLLOWS_JS, queue=False, api_visibility="private")
    tab.select(on_learn, [session_id, scrubber], learn_views, api_visibility="private")
    phase_views = [guided_plot, phase_text, phase, session_id]
    phase.input(on_phase, [session_id, scrubber, phase], phase_views, api_name="learn_phase",
                trigger_mode="always_last")
    next_btn.click(lambda sid, i, p: on_phase(sid, i, int(p or 0) + 1), [session_id, scrubber, phase], phase_views,
                   api_visibility="private")
    prev_btn.click(lambda sid, i, p: on_phase(sid, i, int(p or 0) - 1), [session_id, scrubber, phase], phase_views,
                   api_visibility="private")
    cost_btn.click(on_cost, [session_id, scrubber, calibrate], [cost_plot, cost_text, learn_status, session_id],
                   inputs_kwargs=controls, api_name="cost_model")
    pair_btn.click(on_side_by_side, [session_id, scrubber, method_a, method_b],
                   [tree_a, story_a, tree_b, story_b, learn_status, session_id], inputs_kwargs=controls,
                   api_name="side_by_side")
    check_btn.click(on_losslessness, [session_id, prompt, lossless_method, samples],
                    [check_plot, check_text, learn_status, session_id], inputs_kwargs=controls,
                    api_name="losslessness")
    link_btn.click(on_link, [session_id, prompt, scrubber], [link, learn_status, session_id], inputs_kwargs=controls,
                   api_name="share_link")
    link.change(None, [link], [link], js=FULL_LINK_JS, api_visibility="private")
    goto_btn.click(on_goto_step, [session_id, prompt, linked_step], views, inputs_kwargs=controls,
                   api_name="goto_step")
    example_btn.click(on_example, [session_id, example], views + [prompt, *shown], api_name="replay_example")
    demo.load(on_open_link, None, [prompt, *shown, linked_step, learn_status], api_visibility="private")
    demo.load(None, js=LEARN_KEYS_JS)


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
    gr.set_static_paths([PLOTLY_JS])  # the page's figures are drawn by it (figure_view)
    start_heap_trimmer()  # abandoned sessions' freed memory goes back to the OS (flat RSS in the soak)
    demo.queue(default_concurrency_limit=16).launch(
        server_name=host, server_port=port, css=CSS, head=CLAMP_NOTE_JS, max_file_size="20mb",
        footer_links=["api"],
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
