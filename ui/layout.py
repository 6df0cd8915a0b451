"""The page: every widget, and every event wired to its handler (ui/play.py, and the Learn tab's section from
ui/learn.py). Each decoder option's control is built from its entry in dynasd/options.py."""
from __future__ import annotations

import gradio as gr

import viz
from dynasd.explorer.inputs import CUSTOM, MAX_NEW_TOKENS_LIMIT, RUN_FIELDS
from dynasd.models import has_feature_draft
from dynasd.options import METHODS, OPTIONS, Choice, Option
from dynasd.recipes import RECIPES
from dynasd.stopping import DEFAULT_DECISION_MODEL, shipped_decision_models

from . import predict as predict_ui
from . import state
from .controls import CONTROL_NAMES, CUSTOM_RECIPE, RECIPE_CONTROLS, SHOWN_BY_METHOD, pair_choices
from .export import export_controls
from .gpu import on_zero_gpu
from .learn import learn_section
from .lecture import lecture_buttons, lecture_toggle, wire_lecture
from .ledger import ledger_section
from .page_scripts import (
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
        session_id = gr.State(None)
        gr.Markdown(INTRO, elem_id="intro")
        gr.Markdown(device_note(on_zero_gpu()), elem_id="device-line")
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
                    status = gr.Markdown(status_line("Press **Step** or **Run** to start."), elem_id="status",
                                         label="status")
                    scrubber = gr.Slider(minimum=0, maximum=1, value=0, step=1, label="Step on show",
                                         interactive=False, elem_id="scrubber")
                    play_predict = predict_ui.play_controls()  # hidden until predictions are on
                    lecture = lecture_buttons()  # hidden until lecture mode
                    gr.Examples(examples=[[e] for e in EXAMPLES], inputs=[prompt], label="Example prompts")
                with gr.Column(elem_id="settings-column"):
                    with gr.Accordion("Learning modes", open=True, elem_id="learning-modes"):
                        predict_first, lecture_mode = predict_ui.play_toggle(), lecture_toggle()
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
                        controls["max_new_tokens"] = checked_by_the_handler(gr.Slider(
                            1, MAX_NEW_TOKENS_LIMIT, value=RUN_FIELDS["max_new_tokens"], step=1,
                            label="Max new tokens", elem_id="max-new-tokens"))
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
                        with gr.Row(equal_height=False, elem_classes="figure-with-help"):
                            with gr.Column(scale=3):
                                pq_plot = figure_view("p vs q per candidate", "pq-plot")
                                stop_plot = figure_view("Early-stop scores", "stop-plot")
                            gr.Markdown(DECISIONS_HELP, elem_classes="explain")
                    with gr.Tab("Summary"):
                        with gr.Row(equal_height=False, elem_classes="figure-with-help"):
                            with gr.Column(scale=3):
                                summary = gr.Markdown("", elem_id="summary", label="summary")
                                timeline_plot = figure_view("Run timeline", "timeline-plot")
                            gr.Markdown(SUMMARY_HELP, elem_classes="explain")
                    with gr.Tab("Compare"):
                        with gr.Row(equal_height=False, elem_classes="figure-with-help"):
                            with gr.Column(scale=3):
                                compare_btn = gr.Button(f"Compare {', '.join(METHODS)} and transformers' "
                                                        "assisted generation on this prompt", elem_id="compare-btn")
                                compare_status = gr.Markdown("", label="compare status", elem_id="compare-status")
                                compare_table = gr.Dataframe(label="Methods side by side", interactive=False)
                                compare_plot = gr.Plot(label="Speed", elem_id="compare-plot", show_label=False)
                            gr.Markdown(COMPARE_HELP, elem_classes="explain")
                    with gr.Tab("Trace"):
                        with gr.Row(equal_height=False, elem_classes="figure-with-help"):
                            with gr.Column(scale=3):
                                save_btn = gr.Button("Save this run as a trace file", elem_id="save-btn")
                                saved_file = gr.File(label="Trace file to download", interactive=False)
                                load_file = gr.File(label="Load a trace file (.json) to replay",
                                                    file_types=[".json"], type="filepath")
                                export_controls(session_id, status)  # the run as one HTML file
                            gr.Markdown(TRACE_HELP, elem_classes="explain")

        shown = [controls[name] for name in CONTROL_NAMES]
        views = [text, tree_plot, mask_plot, pq_plot, stop_plot, timeline_plot, summary, status, story, scrubber,
                 session_id]
        # No progress overlay on a Step, a Run's steps or a scrub: its animation kept a core of this 2-core machine
        # busy while the model stepped (the step took ~25% longer); the status line says at once that work began,
        # and its small runtime display the event's place in the queue while it waits (queue_place).
        working = WAITING_FOR_GPU_JS if on_zero_gpu() else WORKING_JS
        starting = WAITING_FOR_GPU_JS if on_zero_gpu() else READING_PROMPT_JS  # Step and Run may read a new prompt
        step_btn.click(None, [prompt], [status], js=starting, queue=False, api_visibility="private")
        step_btn.click(on_step, [session_id, prompt], views, inputs_kwargs=controls, api_name="step",
                       **queue_place(status))
        # Run in the page: one step per event, the next asked for (a tick State whose change is the request) once
        # the page has drawn the last, with whether Stop was pressed meanwhile (NEXT_STEP_JS), so the display
        # keeps pace and no step begins after a Stop the page has seen, however long the drawing takes.
        run_tick = gr.State(0)
        stop_pressed = gr.Checkbox(False, visible=False, label="Stop pressed during the Run")
        run_btn.click(None, js=RUN_PRESSED_JS, queue=False, api_visibility="private")
        # on ZeroGPU the whole Run is one GPU call, which may first wait in ZeroGPU's queue
        run_btn.click(None, [prompt], [status], js=starting, queue=False, api_visibility="private")
        run_btn.click(on_run_begin, [session_id, prompt, run_tick], views + [run_tick], inputs_kwargs=controls,
                      api_visibility="private", **queue_place(status))
        run_tick.change(on_run_next, [session_id, run_tick, stop_pressed], views + [run_tick], js=NEXT_STEP_JS,
                        api_visibility="private", **queue_place(status))
        # Run for API clients: a stream of updates (there is no page to pace it)
        run_api = gr.Button("Run (API)", visible=False)
        run_api.click(on_run, [session_id, prompt], views, inputs_kwargs=controls, api_name="run",
                      show_progress="hidden")
        follow_up_btn.click(None, None, [status], js=working, queue=False, api_visibility="private")
        follow_up_btn.click(on_follow_up, [session_id, follow_up], views, api_name="follow_up", **queue_place(status))
        stop_btn.click(None, [status], [status], js=STOP_PRESSED_JS, queue=False, api_visibility="private")
        stop_btn.click(on_stop, [session_id], [status, session_id], api_name="stop", queue=False,
                       show_progress="hidden")
        reset_btn.click(on_reset, [session_id], views, api_name="reset", show_progress="hidden")
        # input: dragging (always_last keeps only the latest position) or typing a step number
        scrubber.input(on_show_step, [session_id, scrubber], views, api_name="show_step", trigger_mode="always_last",
                       show_progress="hidden")
        compare_btn.click(None, None, [compare_status], js=saying("Comparing the methods on this prompt…"),
                          queue=False, api_visibility="private")
        compare_btn.click(on_compare, [session_id, prompt], [compare_table, compare_plot, compare_status, session_id],
                          inputs_kwargs=controls, api_name="compare", **queue_place(compare_status),
                          **compare_lane())
        save_btn.click(on_save, [session_id], [saved_file, status, session_id], api_name="save_trace",
                       show_progress="hidden")
        load_file.upload(on_load, [session_id, load_file], views + [prompt, *shown], api_name="load_trace",
                         show_progress="hidden")
        ledger_section(tabs, session_id, scrubber)
        learn_section(demo, tabs, session_id, prompt, scrubber, controls, views)
        predict_ui.wire_play(predict_first, play_predict, session_id, scrubber, views)
        wire_lecture(lecture_mode, lecture, session_id, scrubber, views)
        recipe.input(on_recipe, [recipe], [*shown, status, dynamic_section], api_visibility="private", queue=False,
                     show_progress="hidden")
        # the menu names this machine and marks the recipe measured fastest here (a kept Compare), if any
        for refresh in (demo.load, compare_status.change, controls["pair"].change):
            refresh(on_recipe_menu, [controls["pair"]], [recipe], api_visibility="private", queue=False,
                    show_progress="hidden")
        for name in RECIPE_CONTROLS:
            controls[name].input(on_control_edited, None, recipe, api_visibility="private", queue=False)
        controls["method"].change(on_method_change, [controls["method"], controls["k_config"]],
                                  [method_help, *(controls[name] for name in SHOWN_BY_METHOD)],
                                  api_visibility="private")
        # a recipe's or a typed k-config: the help counts that tree's candidates, not the default's
        controls["k_config"].change(lambda method, k_config: on_method_change(method, k_config)[0],
                                    [controls["method"], controls["k_config"]], [method_help],
                                    api_visibility="private", queue=False, show_progress="hidden")
        controls["pair"].change(on_pair_change, [controls["pair"]],
                                [controls["target"], controls["draft"], controls["draft_kind"]],
                                api_visibility="private")
    return demo
