"""The page: every widget, and every event wired to its handler (ui/play.py, and the Learn tab's section from
ui/learn_layout.py). Each decoder option's control is built from its entry in dynasd/options.py."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Iterator

import gradio as gr

import viz
from dynasd.explorer.inputs import CUSTOM, MAX_NEW_TOKENS_LIMIT, RUN_FIELDS
from dynasd.loading.models import has_feature_draft
from dynasd.options import METHODS, OPTIONS, Choice, Option
from dynasd.recipes import RECIPES
from dynasd.stopping.policies import DEFAULT_DECISION_MODEL, shipped_decision_models

from . import predict as predict_ui
from . import state
from .classroom import class_section, learner_page
from .controls import CONTROL_NAMES, CUSTOM_RECIPE, RECIPE_CONTROLS, SHOWN_BY_METHOD, pair_choices
from .export import export_controls
from .gpu import on_zero_gpu
from .learn import on_link
from .learn_layout import learn_section
from .learn_views import LinkViews
from .lecture import STEP_KEYS_HELP, lecture_buttons, lecture_toggle, wire_lecture
from .ledger import ledger_section
from .page_scripts import (
    COPY_LINK_JS,
    NEXT_STEP_JS,
    READING_PROMPT_JS,
    RUN_PRESSED_JS,
    STOP_PRESSED_JS,
    WAITING_FOR_GPU_JS,
    WORKING_JS,
    figure_view,
    saying,
)
from .play import (
    on_compare,
    on_compare_stopped,
    on_control_edited,
    on_follow_up,
    on_load,
    on_method_change,
    on_pair_change,
    on_recipe,
    on_recipe_menu,
    on_reset,
    on_run,
    on_run_begin,
    on_run_next,
    on_save,
    on_show_step,
    on_step,
    on_stop,
)
from .status import status_line
from .texts import (
    COMPARE_HELP,
    DECISIONS_HELP,
    EXAMPLES,
    INTRO,
    MASK_HELP,
    METHOD_HELP,
    SUMMARY_HELP,
    TRACE_HELP,
    TREE_HELP,
    device_note,
)
from .views import CompareViews, LoadViews, RunViews, SaveViews, StepViews, StopViews


def options_in(group: str) -> list[str]:
    return [name for name, o in OPTIONS.items() if o.group == group]


def checked_by_the_handler(component: gr.Slider | gr.Number) -> gr.Slider | gr.Number:
    """`component`, its value passed to the handler as sent, even outside the control's range.

    Why: Gradio's own check refuses such a value (typed into a slider's box) before any handler runs, with a toast,
    and the status line stays at "Working…" (the page wrote it at the click). The handlers check every setting
    (Settings.normalised) and say in the status line what is wrong, as for any other bad input. (Set on the
    instance: a subclass of a Gradio component makes Gradio write a .pyi file beside this module.)"""
    component.preprocess = lambda payload: payload
    return component


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
        return gr.Dropdown(choices, value=value, allow_custom_value=state.PAIRS.allow_decision_paths, **common)
    if o.widget == "slider":
        low, high, step = o.ui_range
        return checked_by_the_handler(gr.Slider(low, high, value=value, step=step, **common))
    if o.widget == "number":
        return checked_by_the_handler(gr.Number(value=value, precision=0, **common))
    if o.widget == "checkbox":
        return gr.Checkbox(value=value, **common)
    return gr.Textbox(value=value, **common)


# Compares run in a lane of their own, this many at a time (None: in the queue's common lane, app.QUEUE_CONCURRENCY).
# Why: a Compare runs every method to the end (seconds of CPU for the embedded pair, many Steps' worth); in the
# common lane a classroom's Compares share the CPU, all finish late and hold the handlers Steps need; one at a
# time, most finish sooner and none later (docs/benchmarks.md, "A classroom at once").
COMPARE_CONCURRENCY: int | None = 1


def compare_lane() -> dict:
    if COMPARE_CONCURRENCY is None:
        return {}
    return dict(concurrency_id="compare", concurrency_limit=COMPARE_CONCURRENCY)


def queue_place(status: gr.Component) -> dict:
    """An event's progress shown on its status line only, as Gradio's small runtime display: "queue: 3/12 | 4.1s"
    while the event waits in the queue behind other learners' (app.QUEUE_CONCURRENCY run at once), then its running
    time. Why not hidden: a learner whose Step waits would see "Working…" and nothing else, a status that looks
    frozen. Why not "full": its spinner over every output kept a core of a 2-core machine busy while the model
    stepped (a step ~25% slower)."""
    return dict(show_progress="minimal", show_progress_on=[status])


# queue_place's runtime display goes on its own line under the status text (Gradio floats it at the component's
# corner, below a one-line status and out of sight), and the status text stays legible meanwhile (Gradio dims a
# pending Markdown to 20%). The line is kept when empty, so the page below does not jump at every step of a Run.
QUEUE_PLACE_CSS = """
#status, #compare-status { display: flex; flex-direction: column-reverse; overflow: visible !important; }
#status > .wrap, #compare-status > .wrap { position: static !important; padding: 0; background: none; min-height: 1.4em;
  overflow: visible; align-items: flex-start; }
#status .meta-text-center, #compare-status .meta-text-center { position: static; transform: none; padding: 0; }
#status .pending, #compare-status .pending { opacity: 1; }
"""


def build_app(default_pair: str = "embedded", default_target: str = "", default_draft: str = "") -> gr.Blocks:
    with gr.Blocks(title="DynaSD Explorer") as demo:
        w = SimpleNamespace(session_id=gr.State(None), controls={}, pair=default_pair)
        # no navbar: the learner's page of a class (/class) is a route reached by its link, not a page to browse to
        gr.Navbar(visible=False)
        gr.Markdown(INTRO, elem_id="intro")
        gr.Markdown(device_note(on_zero_gpu()), elem_id="device-line")
        with gr.Row(equal_height=False, elem_id="main-row"):
            with gr.Column(scale=1, min_width=320, elem_id="controls-column"):
                # two columns inside: on a phone (CSS) the first stays on top, the results come next and the
                # settings last, so Step and the figures are in reach without scrolling past every control
                _play_controls(w)
                _settings(w, default_target, default_draft)
            with gr.Column(scale=3, elem_id="results-column"):
                _step_figures(w)
                with gr.Tabs(overflow_behavior="wrap") as w.tabs:  # on a phone every tab stays a button
                    _figure_tabs(w)
        w.views = StepViews(w.text, w.tree_plot, w.mask_plot, w.pq_plot, w.stop_plot, w.timeline_plot, w.summary,
                            w.status, w.story, w.scrubber, w.session_id)
        _wire_play(w)
        _wire_trace_and_compare(w)
        ledger_section(w.tabs, w.session_id, w.scrubber)
        class_section(demo, w.tabs, w.session_id, w.prompt, w.controls, w.views)  # a class follows this page's run
        learn_section(demo, w.tabs, w.session_id, w.prompt, w.scrubber, w.controls, w.views)
        predict_ui.wire_play(w.predict_first, w.play_predict, w.session_id, w.scrubber, w.views)
        wire_lecture(w.lecture_mode, w.lecture, w.session_id, w.scrubber, w.views)
        _wire_settings(demo, w)
    learner_page(demo)  # /class: a learner's page in a class (ui/classroom.py)
    return demo


def _play_controls(w: SimpleNamespace) -> None:
    with gr.Column(elem_id="top-controls"):
        w.prompt = gr.Textbox(label="Prompt", value=EXAMPLES[0], lines=3, max_lines=8, elem_id="prompt-box")
        # one row of four, on a phone too (CSS), right under the prompt: Step must not need a scroll
        with gr.Row(elem_id="run-buttons"):
            w.step_btn = gr.Button("Step", variant="primary", elem_id="step-btn", min_width=60)
            w.run_btn = gr.Button("Run", variant="primary", elem_id="run-btn", min_width=60)
            w.stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn", min_width=60)
            w.reset_btn = gr.Button("Reset", variant="secondary", elem_id="reset-btn", min_width=60)
        with gr.Row(equal_height=True, elem_id="follow-up-row"):
            w.follow_up = gr.Textbox(label="Follow-up message (after a finished run)", lines=1, scale=3,
                                     elem_id="follow-up")
            w.follow_up_btn = gr.Button("Send follow-up", scale=1, elem_id="follow-up-btn")
        w.status = gr.Markdown(status_line("Press **Step** or **Run** to start."), elem_id="status", label="status")
        w.scrubber = gr.Slider(minimum=0, maximum=1, value=0, step=1, label="Step on show", interactive=False,
                               elem_id="scrubber")
        with gr.Row(equal_height=True, elem_id="step-link-row"):
            w.step_link_btn = gr.Button("Copy a link to this step", size="sm", scale=1, min_width=120,
                                        elem_id="step-link-btn")
            w.step_link = gr.Textbox(label="Link to this prompt, these settings and this step", buttons=["copy"],
                                     interactive=False, scale=3, visible=False, elem_id="step-link")
        gr.Markdown(STEP_KEYS_HELP, elem_id="step-keys", elem_classes="explain")
        w.play_predict = predict_ui.play_controls()  # hidden until predictions are on
        w.lecture = lecture_buttons()  # hidden until lecture mode
        gr.Examples(examples=[[e] for e in EXAMPLES], inputs=[w.prompt], label="Example prompts")


def _settings(w: SimpleNamespace, default_target: str, default_draft: str) -> None:
    controls = w.controls
    with gr.Column(elem_id="settings-column"):
        with gr.Accordion("Learning modes", open=True, elem_id="learning-modes"):
            w.predict_first, w.lecture_mode = predict_ui.play_toggle(), lecture_toggle()
        with gr.Accordion("Model and method", open=True):
            controls["pair"] = gr.Dropdown(pair_choices(), value=w.pair, label="Model pair (target + draft)",
                                           info="tiny-random: instant toy pair; presets need the Hugging Face hub")
            controls["target"] = gr.Textbox(label="Target model (hub id, folder or .gguf)", value=default_target,
                                            visible=w.pair == CUSTOM)
            controls["draft"] = gr.Textbox(label="Draft model (same tokenizer)", value=default_draft,
                                           visible=w.pair == CUSTOM)
            w.recipe = gr.Dropdown([CUSTOM_RECIPE, *RECIPES], value=CUSTOM_RECIPE, label="Recipe", elem_id="recipe",
                                   info="set the method controls to a paper's configuration or the fastest one "
                                        "measured on a CPU")
            for name in options_in("method"):
                controls[name] = option_control(OPTIONS[name], w.pair)
                if name == "method":
                    w.method_help = gr.Markdown(METHOD_HELP[OPTIONS["method"].default], elem_classes="explain")
        with gr.Accordion("Dynamic depth", open=False) as w.dynamic_section:
            _option_controls(w, "dynamic")
        with gr.Accordion("Sampling", open=False):
            _option_controls(w, "sampling")
            controls["max_new_tokens"] = checked_by_the_handler(gr.Slider(
                1, MAX_NEW_TOKENS_LIMIT, value=RUN_FIELDS["max_new_tokens"], step=1, label="Max new tokens",
                elem_id="max-new-tokens"))
        with gr.Accordion("Advanced", open=False):
            _option_controls(w, "advanced")


def _option_controls(w: SimpleNamespace, group: str) -> None:
    for name in options_in(group):
        w.controls[name] = option_control(OPTIONS[name], w.pair)


def _step_figures(w: SimpleNamespace) -> None:
    w.text = gr.HighlightedText(label="Generated text (colour = where each token came from)",
                                color_map=viz.text_color_map(), show_legend=True, show_inline_category=False,
                                combine_adjacent=False, elem_id="dynasd-text")
    w.story = gr.Markdown("", elem_id="story", label="story")
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=360):
            w.tree_plot = figure_view("Candidate tree", "tree-plot")
            with gr.Accordion("What am I seeing? (tree)", open=True):
                gr.Markdown(TREE_HELP, elem_classes="explain")
        with gr.Column(scale=1, min_width=360):
            w.mask_plot = figure_view("Verify mask", "mask-plot")
            with gr.Accordion("What am I seeing? (mask)", open=True):
                gr.Markdown(MASK_HELP, elem_classes="explain")


@contextlib.contextmanager
def _tab_with_help(name: str, help_text: str) -> Iterator[None]:
    """A tab of the step's views: its widgets in a column, its help beside them."""
    with gr.Tab(name), gr.Row(equal_height=False, elem_classes="figure-with-help"):
        with gr.Column(scale=3):
            yield
        gr.Markdown(help_text, elem_classes="explain")


def _figure_tabs(w: SimpleNamespace) -> None:
    with _tab_with_help("Decisions", DECISIONS_HELP):
        w.pq_plot = figure_view("p vs q per candidate", "pq-plot")
        w.stop_plot = figure_view("Early-stop scores", "stop-plot")
    with _tab_with_help("Summary", SUMMARY_HELP):
        w.summary = gr.Markdown("", elem_id="summary", label="summary")
        w.timeline_plot = figure_view("Run timeline", "timeline-plot")
    with _tab_with_help("Compare", COMPARE_HELP):
        w.compare_btn = gr.Button(f"Compare {', '.join(METHODS)} and transformers' assisted generation on this "
                                  "prompt", elem_id="compare-btn")
        w.compare_stop_btn = gr.Button("Stop Compare", variant="stop", elem_id="compare-stop-btn", size="sm")
        w.compare_status = gr.Markdown("", label="compare status", elem_id="compare-status")
        w.compare_table = gr.Dataframe(label="Methods side by side", interactive=False, elem_id="compare-table")
        w.compare_plot = gr.Plot(label="Speed", elem_id="compare-plot", show_label=False)
    with _tab_with_help("Trace", TRACE_HELP):
        w.save_btn = gr.Button("Save this run as a trace file", elem_id="save-btn")
        w.saved_file = gr.File(label="Trace file to download", interactive=False)
        w.load_file = gr.File(label="Load a trace file (.json) to replay", file_types=[".json"], type="filepath")
        export_controls(w.session_id, w.status)  # the run as one HTML file


def _wire_play(w: SimpleNamespace) -> None:
    """Step, Run, Stop, Reset, the follow-up and the step slider. No progress overlay on a Step, a Run's steps or
    a scrub: its animation kept a core of this 2-core machine busy while the model stepped (the step took ~25%
    longer); the status line says at once that work began, and its small runtime display the event's place in the
    queue while it waits (queue_place)."""
    views, session_id, prompt, controls = w.views.outputs(), w.session_id, w.prompt, w.controls
    working = WAITING_FOR_GPU_JS if on_zero_gpu() else WORKING_JS
    starting = WAITING_FOR_GPU_JS if on_zero_gpu() else READING_PROMPT_JS  # Step and Run may read a new prompt
    w.step_btn.click(None, [prompt], [w.status], js=starting, queue=False, api_visibility="private")
    w.step_btn.click(on_step, [session_id, prompt], views, inputs_kwargs=controls, api_name="step",
                     **queue_place(w.status))
    # Run in the page: one step per event, the next asked for (a tick State whose change is the request) once
    # the page has drawn the last, with whether Stop was pressed meanwhile (NEXT_STEP_JS), so the display
    # keeps pace and no step begins after a Stop the page has seen, however long the drawing takes.
    run_tick = gr.State(0)
    stop_pressed = gr.Checkbox(False, visible=False, label="Stop pressed during the Run")
    run_views = RunViews(**vars(w.views), tick=run_tick).outputs()
    w.run_btn.click(None, js=RUN_PRESSED_JS, queue=False, api_visibility="private")
    # on ZeroGPU the whole Run is one GPU call, which may first wait in ZeroGPU's queue
    w.run_btn.click(None, [prompt], [w.status], js=starting, queue=False, api_visibility="private")
    w.run_btn.click(on_run_begin, [session_id, prompt, run_tick], run_views, inputs_kwargs=controls,
                    api_visibility="private", **queue_place(w.status))
    run_tick.change(on_run_next, [session_id, run_tick, stop_pressed], run_views, js=NEXT_STEP_JS,
                    api_visibility="private", **queue_place(w.status))
    # Run for API clients: a stream of updates (there is no page to pace it)
    run_api = gr.Button("Run (API)", visible=False)
    run_api.click(on_run, [session_id, prompt], views, inputs_kwargs=controls, api_name="run", show_progress="hidden")
    w.follow_up_btn.click(None, None, [w.status], js=working, queue=False, api_visibility="private")
    w.follow_up_btn.click(on_follow_up, [session_id, w.follow_up], views, api_name="follow_up",
                          **queue_place(w.status))
    w.stop_btn.click(None, [w.status], [w.status], js=STOP_PRESSED_JS, queue=False, api_visibility="private")
    w.stop_btn.click(on_stop, [session_id], StopViews(w.status, session_id).outputs(), api_name="stop", queue=False,
                     show_progress="hidden")
    w.reset_btn.click(on_reset, [session_id], views, api_name="reset", show_progress="hidden")
    # input: dragging (always_last keeps only the latest position) or typing a step number
    w.scrubber.input(on_show_step, [session_id, w.scrubber], views, api_name="show_step", trigger_mode="always_last",
                     show_progress="hidden")


def shown_box() -> gr.Textbox:
    """A box hidden until it has something to show (the step's link)."""
    return gr.Textbox(visible=True)


def _wire_trace_and_compare(w: SimpleNamespace) -> None:
    session_id, shown = w.session_id, tuple(w.controls[name] for name in CONTROL_NAMES)
    w.compare_btn.click(None, None, [w.compare_status], js=saying("Comparing the methods on this prompt…"),
                        queue=False, api_visibility="private")
    comparing = w.compare_btn.click(on_compare, [session_id, w.prompt],
                                    CompareViews(w.compare_table, w.compare_plot, w.compare_status,
                                                 session_id).outputs(),
                                    inputs_kwargs=w.controls, api_name="compare", **queue_place(w.compare_status),
                                    **compare_lane())
    w.compare_stop_btn.click(on_compare_stopped, None, [w.compare_status], cancels=[comparing], queue=False,
                             api_visibility="private", show_progress="hidden")
    # a finished Compare is kept and quoted by the run's Summary: the step on show is drawn again (the figures the
    # page shows already are not sent again: only the Summary's speed-up changes)
    w.compare_table.change(on_show_step, [session_id, w.scrubber], w.views.outputs(), api_visibility="private",
                           trigger_mode="always_last", show_progress="hidden")
    # the link comes from the server (the prompt, the settings and the step on show), becomes whole in the page and
    # is copied where the browser allows it; the box shows it in any case
    w.step_link_btn.click(on_link, [session_id, w.prompt, w.scrubber],
                          LinkViews(w.step_link, w.status, session_id).outputs(), inputs_kwargs=w.controls,
                          api_visibility="private", show_progress="hidden").then(
        shown_box, None, [w.step_link], queue=False, api_visibility="private", show_progress="hidden").then(
        None, [w.step_link, w.status], [w.step_link, w.status], js=COPY_LINK_JS, api_visibility="private")
    w.save_btn.click(on_save, [session_id], SaveViews(w.saved_file, w.status, session_id).outputs(),
                     api_name="save_trace", show_progress="hidden")
    w.load_file.upload(on_load, [session_id, w.load_file],
                       LoadViews(**vars(w.views), prompt=w.prompt, controls=shown).outputs(), api_name="load_trace",
                       show_progress="hidden")


def _wire_settings(demo: gr.Blocks, w: SimpleNamespace) -> None:
    """Recipes, and the controls that follow the method and the pair."""
    controls, shown = w.controls, [w.controls[name] for name in CONTROL_NAMES]
    w.recipe.input(on_recipe, [w.recipe], [*shown, w.status, w.dynamic_section], api_visibility="private",
                   queue=False, show_progress="hidden")
    # the menu names this machine and shows what a kept Compare measured here (refreshed when a Compare's table
    # comes: once, at its end)
    for refresh in (demo.load, w.compare_table.change, controls["pair"].change):
        refresh(on_recipe_menu, [controls["pair"]], [w.recipe], api_visibility="private", queue=False,
                show_progress="hidden")
    for name in RECIPE_CONTROLS:
        controls[name].input(on_control_edited, None, w.recipe, api_visibility="private", queue=False)
    controls["method"].change(on_method_change, [controls["method"], controls["k_config"]],
                              [w.method_help, *(controls[name] for name in SHOWN_BY_METHOD)],
                              api_visibility="private")
    # a recipe's or a typed k-config: the help counts that tree's candidates, not the default's
    controls["k_config"].change(lambda method, k_config: on_method_change(method, k_config)[0],
                                [controls["method"], controls["k_config"]], [w.method_help],
                                api_visibility="private", queue=False, show_progress="hidden")
    controls["pair"].change(on_pair_change, [controls["pair"]],
                            [controls["target"], controls["draft"], controls["draft_kind"]], api_visibility="private")
