"""The Learn tab's section of the page (learn_section, called once from build_app): its widgets, tab by tab, and
its events, each wired to a handler of ui/learn.py by api_name."""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from dynasd.explorer.lessons import losslessness
from dynasd.explorer.sessions import share
from dynasd.options import METHODS
from dynasd.sampling import ACCEPT_RULE

from . import predict as predict_ui
from .batching import batching_section
from .controls import CONTROL_NAMES
from .learn import (
    on_cost,
    on_example,
    on_goto_step,
    on_learn,
    on_link,
    on_linked_step,
    on_losslessness,
    on_open_link,
    on_phase,
    on_side_by_side,
)
from .learn_views import CostViews, LearnViews, LinkViews, LosslessViews, SideBySideViews
from .measuring import stop_measuring_button, wire_stop
from .misconceptions import misconception_lab
from .page_scripts import FULL_LINK_JS, LEARN_FOLLOWS_JS, LEARN_KEYS_JS, REPLAYING_LINK_JS, saying
from .quiz import quiz_section
from .texts import LEARN_HELP
from .views import LoadViews, PhaseViews, StepViews
from .where import where_section


def learn_section(demo: gr.Blocks, tabs: gr.Tabs, session_id, prompt, scrubber, controls: dict,
                  views: StepViews) -> None:
    """The Learn tab, added as the last of the page's `tabs`, and its events (each endpoint has an api_name)."""
    w = SimpleNamespace(session_id=session_id, prompt=prompt, scrubber=scrubber, controls=controls, views=views)
    with tabs, gr.Tab("Learn") as w.tab:
        gr.Markdown(LEARN_HELP, elem_classes="explain")
        with gr.Row(equal_height=True):
            w.status = gr.Markdown("", elem_id="learn-status", label="learn status")
            w.explain = gr.Button("Explain the step on show", elem_id="learn-explain", size="sm", scale=0,
                                  min_width=200)
        with gr.Tabs(overflow_behavior="wrap"):
            for tab in (_guided_tab, _residual_tabs, _cost_tab, _side_by_side_tab, _losslessness_tab, _share_tab,
                        _rows_and_quiz_tabs):
                tab(w)
    _wire_guided(w)
    _wire_cost_and_checks(w)
    _wire_share(demo, w)
    demo.load(None, js=LEARN_KEYS_JS)


def _guided_tab(w: SimpleNamespace) -> None:
    with gr.Tab("Guided step"):
        with gr.Row():
            w.prev = gr.Button("← previous phase", elem_id="learn-prev", size="sm")
            w.next = gr.Button("next phase →", elem_id="learn-next", size="sm", variant="primary")
        w.phase = gr.Slider(0, 1, value=0, step=1, label="Phase", elem_id="learn-phase")
        w.phase_text = gr.Markdown("", elem_id="learn-phase-text", label="phase explanation")
        w.guess_buttons = predict_ui.guided_controls()
        w.guided_plot = gr.Plot(label="The step, phase by phase", elem_id="learn-guided-plot")


def _residual_tabs(w: SimpleNamespace) -> None:
    with gr.Tab("Residual"):
        w.residual_text = gr.Markdown("", elem_classes="explain", elem_id="learn-residual-text",
                                      label="residual explanation")
        w.residual_plot = gr.Plot(label="p, q and the residual at the rejection", elem_id="learn-residual-plot")
    with gr.Tab("Acceptance test"):
        gr.Markdown("Each sampled test draws **u** uniformly in [0, 1) and keeps the candidate iff "
                    f"**{ACCEPT_RULE}**: a token the target likes at least as much as the draft is always "
                    "kept, one it likes less is kept in proportion p′/q′. p′ and q′ are p and q for the "
                    "first candidate under a node; after rejected siblings, the residual and q without "
                    "them.", elem_classes="explain")
        w.acceptance_plot = gr.Plot(label="min(1, p′/q′) and u per test", elem_id="learn-acceptance-plot")


def _cost_tab(w: SimpleNamespace) -> None:
    with gr.Tab("Cost model"):
        with gr.Row():
            w.calibrate = gr.Checkbox(value=False, label="measure this device again",
                                      info="the costs are measured once per device and pair (the target "
                                           "and the draft over 1..64 rows, in 5 rounds; the page says how long the "
                                           "last measurement here took) and kept; tick to measure them again")
            w.cost_btn = gr.Button("Explain the speed-up of this run", elem_id="learn-cost-btn")
            w.cost_stop_btn = stop_measuring_button("learn-cost-stop-btn")
        w.cost_text = gr.Markdown("", elem_classes="explain", elem_id="learn-cost-text",
                                  label="cost model explanation")
        w.cost_plot = gr.Plot(label="Expected speed-up over ar", elem_id="learn-cost-plot")
        gr.Markdown("**The best static tree for this draft here**: from this run's acceptance by sibling "
                    "rank (p_r: the r-th candidate's chance once the earlier ones were rejected) and the "
                    "costs above, the expected speed-up of the best k-config within each node budget: a model "
                    "(it leaves out a verify's own work beyond its forward, so it runs a little high for small "
                    "trees). To measure one, set Tree shape to its k-config and press Compare; "
                    "`dynasd best-tree` measures the same over a prompt set and checks its choice.",
                    elem_classes="explain")
        w.budget_plot = gr.Plot(label="Best static tree by node budget", elem_id="learn-budget-plot",
                                show_label=False)
    where_section(w.session_id, w.scrubber, w.controls)  # a run's acceptance on bigger targets and a GPU


def _side_by_side_tab(w: SimpleNamespace) -> None:
    with gr.Tab("Side by side"):
        with gr.Row():
            w.method_a = gr.Dropdown(list(METHODS), value="sd", label="Method A", elem_id="learn-method-a")
            w.method_b = gr.Dropdown(list(METHODS), value="mcsd", label="Method B", elem_id="learn-method-b")
            w.pair_btn = gr.Button("Both from the prefix of the step on show", elem_id="learn-pair-btn")
        with gr.Row(equal_height=False):
            with gr.Column(min_width=320):
                w.tree_a = gr.Plot(label="Method A", elem_id="learn-tree-a")
                w.story_a = gr.Markdown("", label="story of method A")
            with gr.Column(min_width=320):
                w.tree_b = gr.Plot(label="Method B", elem_id="learn-tree-b")
                w.story_b = gr.Markdown("", label="story of method B")


def _losslessness_tab(w: SimpleNamespace) -> None:
    with gr.Tab("Losslessness"):
        gr.Markdown("Samples the **first token after the prompt** many times, one speculative step each "
                    "with a different seed, and compares the counts with the target's own p (temperature "
                    "and top-k/top-p from *Sampling*; set the temperature above 0).", elem_classes="explain")
        with gr.Row():
            w.lossless_method = gr.Dropdown([m for m in METHODS if m not in ("ar", "ti-mcsd")], value="sd",
                                            label="Lossless method (checked next to ti-mcsd)")
            w.samples = gr.Slider(50, losslessness.MAX_SAMPLES, value=100, step=50, label="Samples per method",
                                  info="each sample is one prefill and one step; raise it to see ti-mcsd's "
                                       "skew (a few hundred on tiny-random)")
            w.check_btn = gr.Button("Check", elem_id="learn-check-btn")
        w.check_text = gr.Markdown("", elem_id="learn-check-text", label="losslessness check result")
        w.check_plot = gr.Plot(label="First token: observed vs p", elem_id="learn-check-plot")
        misconception_lab(w.session_id, w.scrubber)  # the wrong rules beside the right one


def _share_tab(w: SimpleNamespace) -> None:
    examples = list(share.example_traces())
    with gr.Tab("Share and examples"):
        with gr.Row():
            w.link_btn = gr.Button("Make a link to this prompt, these settings and this step",
                                   elem_id="learn-link-btn")
            w.link = gr.Textbox(label="Link (copy it)", buttons=["copy"], elem_id="learn-link", interactive=False)
        with gr.Row():
            w.linked_step = gr.Number(0, precision=0, label="Linked step", minimum=0)
            w.goto_btn = gr.Button("Run to the linked step", elem_id="learn-goto-btn")
        with gr.Row():
            w.example = gr.Dropdown(examples, value=examples[0] if examples else None,
                                    label="Example traces (replay at once, no model needed)")
            w.example_btn = gr.Button("Replay the example", elem_id="learn-example-btn")


def _rows_and_quiz_tabs(w: SimpleNamespace) -> None:
    with gr.Tab("Rows and batches"):
        batching_section(w.session_id, w.scrubber, w.controls)  # verify cost by rows; a batch-size model
    with gr.Tab("Quiz"):
        quiz_section(w.session_id)  # a checkpoint quiz on the run on show (ui/quiz.py)


def _wire_guided(w: SimpleNamespace) -> None:
    learn_views = LearnViews(w.guided_plot, w.phase_text, w.phase, w.residual_plot, w.residual_text,
                             w.acceptance_plot, w.status, w.session_id).outputs()
    # No progress overlays where the status lines speak: Gradio's would grey the guided figure at every phase
    # change and write "processing | 0.1s" over the status.
    w.explain.click(on_learn, [w.session_id, w.scrubber], learn_views, api_name="learn_step", show_progress="hidden")
    # While the Learn tab is open its views follow the step on show (a Step, Shift+→, a scrub); not during a Run,
    # where they would add a server event to every step.
    w.scrubber.change(None, js=LEARN_FOLLOWS_JS, queue=False, api_visibility="private")
    w.tab.select(on_learn, [w.session_id, w.scrubber], learn_views, api_visibility="private", show_progress="hidden")
    phase_views = list(PhaseViews(w.guided_plot, w.phase_text, w.phase, w.session_id).outputs())
    predict_ui.wire_guided(w.guess_buttons, w.session_id, w.scrubber, w.phase, phase_views)
    inputs = [w.session_id, w.scrubber, w.phase]
    w.phase.input(on_phase, inputs, phase_views, api_name="learn_phase", trigger_mode="always_last",
                  show_progress="hidden")
    w.next.click(lambda sid, i, p: on_phase(sid, i, int(p or 0) + 1), inputs, phase_views, api_visibility="private",
                 show_progress="hidden")
    w.prev.click(lambda sid, i, p: on_phase(sid, i, int(p or 0) - 1), inputs, phase_views, api_visibility="private",
                 show_progress="hidden")


def _saying_first(button: gr.Button, status, words: str) -> None:
    """The Learn status says at once what a long event is doing."""
    button.click(None, None, [status], js=saying(words), queue=False, api_visibility="private")


def _wire_cost_and_checks(w: SimpleNamespace) -> None:
    _saying_first(w.cost_btn, w.status, "Explaining the speed-up of this run…")
    costing = w.cost_btn.click(on_cost, [w.session_id, w.scrubber, w.calibrate],
                               CostViews(w.cost_plot, w.budget_plot, w.cost_text, w.status, w.session_id).outputs(),
                               inputs_kwargs=w.controls, api_name="cost_model", show_progress="hidden")
    wire_stop(w.cost_stop_btn, costing, w.status)
    _saying_first(w.pair_btn, w.status, "Running both methods one step…")
    w.pair_btn.click(on_side_by_side, [w.session_id, w.scrubber, w.method_a, w.method_b],
                     SideBySideViews(w.tree_a, w.story_a, w.tree_b, w.story_b, w.status, w.session_id).outputs(),
                     inputs_kwargs=w.controls, api_name="side_by_side", show_progress="hidden")
    _saying_first(w.check_btn, w.status, "Sampling both methods many times…")
    w.check_btn.click(on_losslessness, [w.session_id, w.prompt, w.lossless_method, w.samples],
                      LosslessViews(w.check_plot, w.check_text, w.status, w.session_id).outputs(),
                      inputs_kwargs=w.controls, api_name="losslessness", show_progress="hidden")


def _wire_share(demo: gr.Blocks, w: SimpleNamespace) -> None:
    views, shown = w.views.outputs(), [w.controls[name] for name in CONTROL_NAMES]
    w.link_btn.click(on_link, [w.session_id, w.prompt, w.scrubber], LinkViews(w.link, w.status, w.session_id).outputs(),
                     inputs_kwargs=w.controls, api_name="share_link", show_progress="hidden")
    w.link.change(None, [w.link], [w.link], js=FULL_LINK_JS, api_visibility="private")
    w.goto_btn.click(on_goto_step, [w.session_id, w.prompt, w.linked_step], views, inputs_kwargs=w.controls,
                     api_name="goto_step", show_progress="hidden")
    w.example_btn.click(on_example, [w.session_id, w.example], LoadViews(**vars(w.views), prompt=w.prompt,
                                                                          controls=tuple(shown)).outputs(),
                        api_name="replay_example", show_progress="hidden")
    # A shared link opens on its step: the controls are set first, then the run goes to the step like the
    # "Run to the linked step" button (which stays, to go there again after a change).
    link_opened = gr.State(False)
    demo.load(None, [w.status], [w.status], js=REPLAYING_LINK_JS, queue=False, api_visibility="private")
    demo.load(on_open_link, None, [w.prompt, *shown, w.linked_step, w.status, link_opened],
              api_visibility="private", show_progress="hidden").then(
        on_linked_step, [w.session_id, w.prompt, w.linked_step, link_opened], views, inputs_kwargs=w.controls,
        api_visibility="private", show_progress="hidden")
