"""The Learn tab: teaching views of the step on show (guided phases, the residual, the acceptance test, the cost
model, two methods on one step, an empirical losslessness check, shareable links and example traces), and its
section of the page (learn_section, called once from build_app). The figures are viz/residual.py, guided.py,
cost.py and losslessness.py; the arithmetic and the sampling dynasd/explorer/cost.py, losslessness.py,
side_by_side.py and share.py."""
from __future__ import annotations

from dataclasses import replace

import gradio as gr

import viz
from dynasd.device_info import machine_line
from dynasd.explorer import cost as cost_model
from dynasd.explorer import losslessness, predict, share, side_by_side
from dynasd.explorer.best_trees import best_trees
from dynasd.explorer.both_sides import example_note
from dynasd.explorer.inputs import UserError, settings_of_trace
from dynasd.explorer.measured_here import read_compare
from dynasd.explorer.session import Session, SessionFailed
from dynasd.explorer.speed import compared_speedup, run_elsewhere, speed_here
from dynasd.options import METHODS, options_of_run
from dynasd.sampling import ACCEPT_RULE
from viz.cost import budget_figure, cost_figure, cost_markdown
from viz.guided import guided_figure, step_phases
from viz.losslessness import losslessness_figure, losslessness_markdown
from viz.residual import acceptance_figure, residual_explanation, residual_figure

from . import gpu, state
from . import predict as predict_ui
from .batching import batching_section
from .controls import CONTROL_NAMES, settings_from
from .misconceptions import misconception_lab
from .page_scripts import FULL_LINK_JS, LEARN_FOLLOWS_JS, LEARN_KEYS_JS, saying
from .play import busy_guard
from .quiz import quiz_section
from .status import status_line
from .texts import LEARN_HELP
from .views import control_updates, failed, render, step_on_show, unexpected
from .where import where_section


def _learn_step(session: Session, index) -> tuple:
    """(run, index, step) of the step on show, or a UserError saying what to do first."""
    return step_on_show(session, index, "nothing to explain yet")


def _greedy(run) -> bool:
    return options_of_run(run.method, run.config).temperature == 0.0


def _guided_views(run, index: int, phase) -> tuple:
    step = run.steps[index]
    phases = step_phases(step)
    at = max(0, min(int(phase or 0), len(phases) - 1))
    shown = phases[at]
    pending = predict.pending_test(run, index, shown.tests) if shown.kind == "test" else None
    if pending is not None:  # predict, then reveal (ui/predict.py): u and the verdict wait for the guess
        shown = replace(shown, tests=shown.tests - 1, text=predict.node_question(step, pending))
    figure = guided_figure(step, shown, viz.root_token(run, index), lossy=not run.lossless)
    text = f"**Phase {at + 1} of {len(phases)}: {shown.title}.** {shown.text}"
    slider = gr.Slider(minimum=0, maximum=max(len(phases) - 1, 1), value=at, step=1, interactive=len(phases) > 1,
                       label=f"Phase ({at + 1} of {len(phases)})")
    return figure, text, slider


def on_learn(session_id, index, phase=0):
    """Every Learn view of the step on show: the guided step at `phase`, the residual and the acceptance test."""
    session = state.SESSIONS.get(session_id)
    try:
        run, index, step = _learn_step(session, index)
        greedy = _greedy(run)
        return (*_guided_views(run, index, phase), residual_figure(step, greedy), residual_explanation(step, greedy),
                acceptance_figure(step, greedy), status_line(f"Explaining step {index}.", "ok"), session.id)
    except UserError as exc:
        return (None, "", gr.update(), None, "", None, status_line(str(exc), "warn"), session.id)
    except Exception as exc:
        return (None, "", gr.update(), None, "", None, status_line(str(unexpected(exc)), "error"), session.id)


def on_phase(session_id, index, phase):
    session = state.SESSIONS.get(session_id)
    try:
        run, index, _ = _learn_step(session, index)
        return (*_guided_views(run, index, phase), session.id)
    except UserError as exc:
        return (None, status_line(str(exc), "warn"), gr.update(), session.id)


def _learn_failure(exc: Exception, outputs: int, session_id) -> tuple:
    """`outputs` empty views, then the message in the Learn status line (and a toast)."""
    if not isinstance(exc, (UserError, SessionFailed)):
        exc = unexpected(exc)
    gr.Warning(str(exc))
    return (None,) * outputs + (status_line(str(exc), "warn"), session_id)


def on_cost(session_id, index, measure_again, **controls):
    """The cost model of the run on show, from this device's measured costs: kept from an earlier measurement of
    this device and pair, or measured now (runs the target; again when asked). Only when no measurement can be
    made here (the pair cannot load) does it fall back to the run's own verify times, and says they are modelled.
    Every number is the run's speed figures (dynasd/explorer/speed.py)."""
    session = state.SESSIONS.get(session_id)
    try:
        run, index, _ = _learn_step(session, index)
        settings = session.settings or settings_from(controls)
        measured, why_not = None, ""
        try:
            measured = gpu.call(gpu.gpu_calibrate, settings, cost_model.calibration_context(run), bool(measure_again))
        except Exception as exc:  # noqa: BLE001 - said in the text: the view still explains the run
            why_not = str(exc).splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        speed = speed_here(run, measured, settings.controls(), settings.pair_key)
        text = cost_markdown(speed)
        if measured is None:
            text = f"Could not measure this device ({why_not}).\n\n" + text
            if len(set(speed.shape.verify_rows)) == 1:
                text = ("**Every step of this run verified the same number of rows**, so its own times cannot "
                        "tell the cost of a row from the cost of a forward: the numbers below treat rows as free "
                        "(ar = one verify).\n\n" + text)
        where = ("costs kept from an earlier measurement of this device" if measured and measured.kept
                 else "costs measured now on this device" if measured else "costs modelled, not measured")
        return (cost_figure(speed), budget_figure(best_trees(run, speed.costs, speed.scale)),
                text, status_line(f"Cost model of this {run.method} run ({where}).", "ok" if measured else "warn"),
                session.id)
    except ValueError as exc:  # UserError included: a run too short, a bad setting
        return _learn_failure(exc if isinstance(exc, UserError) else UserError(str(exc)), 3, session.id)
    except Exception as exc:
        return _learn_failure(exc, 3, session.id)


def _compared_here(settings, method: str):
    """What the last Compare on this machine measured for this method against ar, with these settings (or None):
    the speed owner reads it (dynasd/explorer/speed.py)."""
    return compared_speedup(read_compare(machine_line(), settings.pair_key), method, settings.controls())


def _run_elsewhere(run, measured) -> str:
    """The machine a run's own times were taken on, when a trace says it was not the one measured here."""
    return run_elsewhere(run, measured)


def on_side_by_side(session_id, index, method_a, method_b, **controls):
    """Two methods from the prefix of the step on show (or from the prompt when there is no run)."""
    session = state.SESSIONS.get(session_id)
    try:
        settings = session.settings if session.run is not None and not session.replay else None
        settings = settings or settings_from(controls)
        run, index, _ = _learn_step(session, index)
        prefix = side_by_side.prefix_before(run, index)
        runs = gpu.call(gpu.gpu_side_by_side, settings, (method_a, method_b), prefix, run.prompt)
        views = []
        for method, one in runs.items():
            one.steps[0].index = index  # the one step is the run on show's step `index`, taken another way
            story = viz.step_story(one, 0).replace("**Step 0.**", f"**Step {index}.**", 1)
            if not one.lossless:
                story = "**LOSSY** (ti-mcsd, width > 1). " + story
            views += [viz.tree_figure(one.steps[0], viz.root_token(one, 0), lossy=not one.lossless),
                      f"**{method}** · {len(one.steps[0].committed)} token(s) for one target forward. {story}"]
        return (*views, status_line(f"{method_a} and {method_b} from the prefix of step {index}.", "ok"), session.id)
    except Exception as exc:
        return _learn_failure(exc, 4, session.id)


def on_losslessness(session_id, prompt, lossless_method, samples, **controls):
    """The first token after the prompt, sampled `samples` times by a lossless method and by ti-mcsd, against p."""
    session = state.SESSIONS.get(session_id)
    try:
        settings = settings_from(controls)
        methods = list(dict.fromkeys([lossless_method, "ti-mcsd"]))
        result = gpu.check_losslessness(settings, prompt, methods, samples)
        return (losslessness_figure(result.checks, result.labels),
                losslessness_markdown(result.checks, result.lossless),
                status_line(f"{result.samples} samples per method.", "ok"), session.id)
    except Exception as exc:
        return _learn_failure(exc, 2, session.id)


def on_link(session_id, prompt, index, **controls):
    """A link to this prompt, these settings and the step on show ('?query'; the browser completes it)."""
    session = state.SESSIONS.get(session_id)
    try:
        run = session.run
        step = int(index) if run is not None and run.steps else None
        return "?" + share.link_query(prompt, controls, step), status_line("Link ready: copy it.", "ok"), session.id
    except Exception as exc:
        if not isinstance(exc, UserError):
            exc = unexpected(exc)
        return "", status_line(str(exc), "warn"), session.id


def on_open_link(request: gr.Request):
    """On page load: a link's prompt and settings go to the controls, its step to the 'linked step' box; the last
    output says whether a link was opened, so that the page goes on to show its step (show_linked_step)."""
    try:
        prompt, settings, step = share.settings_of_query(dict(request.query_params) if request else {})
    except UserError as exc:
        return control_updates() + (gr.update(), status_line(str(exc), "warn"), False)
    if prompt is None and settings is None:
        return control_updates() + (gr.update(), gr.update(), False)
    return (control_updates(prompt, settings) + (gr.update(value=step or 0),
            status_line(f"Opened a shared link: running to its step {step or 0}…", "ok"), True))


def on_goto_step(session_id, prompt, target_step, **controls):
    """Start (or continue) the run of these settings until it has the linked step, then show that step."""
    session = state.SESSIONS.get(session_id)
    try:
        busy_guard(session)
        target_step = int(target_step or 0)
        if not 0 <= target_step <= share.MAX_LINK_STEP:
            raise UserError(f"the step must lie in [0, {share.MAX_LINK_STEP}]")
        with session.lock:
            settings = settings_from(controls)
            compute = gpu.compute()
            if session.replay or not session.matches(settings, prompt):
                session.start(compute, settings, prompt, steps=target_step + 1)
            while len(session.run.steps) <= target_step and not session.done:  # one model call at most
                session.step(compute, target_step + 1 - len(session.run.steps))
        shown = min(target_step, len(session.run.steps) - 1)
        note = "" if shown == target_step else f" (the run finished after step {shown})"
        return render(session, shown, status=status_line(f"Showing step {shown}{note}.", "ok"))
    except Exception as exc:
        return failed(session, exc)


def on_example(session_id, name):
    """Replay a shipped example trace: no model is needed; its prompt and settings go to the controls."""
    session = state.SESSIONS.get(session_id)
    try:
        busy_guard(session)
        run = share.load_example(name)
        with session.lock:
            session.load(run)
            views = render(session, 0, status=status_line(
                f"Replaying the example '{name}': {len(run.steps)} steps of {run.method} on {run.pair}; no model "
                "needed. Drag the step slider." + (" " + example_note(name) if example_note(name) else ""), "ok"))
        return views + control_updates(run.prompt, settings_of_trace(run))
    except Exception as exc:
        return failed(session, exc) + control_updates()


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
                guess_buttons = predict_ui.guided_controls()
                guided_plot = gr.Plot(label="The step, phase by phase", elem_id="learn-guided-plot")
            with gr.Tab("Residual"):
                residual_text = gr.Markdown("", elem_classes="explain", elem_id="learn-residual-text",
                                            label="residual explanation")
                residual_plot = gr.Plot(label="p, q and the residual at the rejection", elem_id="learn-residual-plot")
            with gr.Tab("Acceptance test"):
                gr.Markdown("Each sampled test draws **u** uniformly in [0, 1) and keeps the candidate iff "
                            f"**{ACCEPT_RULE}**: a token the target likes at least as much as the draft is always "
                            "kept, one it likes less is kept in proportion p′/q′. p′ and q′ are p and q for the "
                            "first candidate under a node; after rejected siblings, the residual and q without "
                            "them.", elem_classes="explain")
                acceptance_plot = gr.Plot(label="min(1, p′/q′) and u per test", elem_id="learn-acceptance-plot")
            with gr.Tab("Cost model"):
                with gr.Row():
                    calibrate = gr.Checkbox(value=False, label="measure this device again",
                                            info="the costs are measured once per device and pair (the target "
                                                 "over 1..64 rows, a second or two) and kept; tick to measure "
                                                 "them again")
                    cost_btn = gr.Button("Explain the speed-up of this run", elem_id="learn-cost-btn")
                cost_text = gr.Markdown("", elem_classes="explain", elem_id="learn-cost-text",
                                        label="cost model explanation")
                cost_plot = gr.Plot(label="Expected speed-up over ar", elem_id="learn-cost-plot")
                gr.Markdown("**The best static tree for this draft here**: from this run's acceptance by sibling "
                            "rank (p_r: the r-th candidate's chance once the earlier ones were rejected) and the "
                            "costs above, the expected speed-up of the best k-config within each node budget; "
                            "`dynasd best-tree` measures the same over a prompt set and checks its choice.",
                            elem_classes="explain")
                budget_plot = gr.Plot(label="Best static tree by node budget", elem_id="learn-budget-plot",
                                      show_label=False)
            where_section(session_id, scrubber, controls)  # a run's acceptance on bigger targets and a GPU
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
                misconception_lab(session_id, scrubber)  # the wrong rules beside the right one
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
            with gr.Tab("Rows and batches"):
                batching_section(session_id, scrubber, controls)  # verify cost by rows; a batch-size model
            with gr.Tab("Quiz"):
                quiz_section(session_id)  # a checkpoint quiz on the run on show (ui/quiz.py)

    learn_views = [guided_plot, phase_text, phase, residual_plot, residual_text, acceptance_plot, learn_status,
                   session_id]
    # No progress overlays where the status lines speak: Gradio's would grey the guided figure at every phase
    # change and write "processing | 0.1s" over the status.
    explain_btn.click(on_learn, [session_id, scrubber], learn_views, api_name="learn_step", show_progress="hidden")
    # While the Learn tab is open its views follow the step on show (a Step, Shift+→, a scrub); not during a Run,
    # where they would add a server event to every step.
    scrubber.change(None, js=LEARN_FOLLOWS_JS, queue=False, api_visibility="private")
    tab.select(on_learn, [session_id, scrubber], learn_views, api_visibility="private", show_progress="hidden")
    phase_views = [guided_plot, phase_text, phase, session_id]
    predict_ui.wire_guided(guess_buttons, session_id, scrubber, phase, phase_views, _guided_views)
    phase.input(on_phase, [session_id, scrubber, phase], phase_views, api_name="learn_phase",
                trigger_mode="always_last", show_progress="hidden")
    next_btn.click(lambda sid, i, p: on_phase(sid, i, int(p or 0) + 1), [session_id, scrubber, phase], phase_views,
                   api_visibility="private", show_progress="hidden")
    prev_btn.click(lambda sid, i, p: on_phase(sid, i, int(p or 0) - 1), [session_id, scrubber, phase], phase_views,
                   api_visibility="private", show_progress="hidden")
    cost_btn.click(None, None, [learn_status], js=saying("Measuring this pair's costs…"), queue=False,
                   api_visibility="private")
    cost_btn.click(on_cost, [session_id, scrubber, calibrate],
                   [cost_plot, budget_plot, cost_text, learn_status, session_id],
                   inputs_kwargs=controls, api_name="cost_model", show_progress="hidden")
    pair_btn.click(None, None, [learn_status], js=saying("Running both methods one step…"), queue=False,
                   api_visibility="private")
    pair_btn.click(on_side_by_side, [session_id, scrubber, method_a, method_b],
                   [tree_a, story_a, tree_b, story_b, learn_status, session_id], inputs_kwargs=controls,
                   api_name="side_by_side", show_progress="hidden")
    check_btn.click(None, None, [learn_status], js=saying("Sampling both methods many times…"), queue=False,
                    api_visibility="private")
    check_btn.click(on_losslessness, [session_id, prompt, lossless_method, samples],
                    [check_plot, check_text, learn_status, session_id], inputs_kwargs=controls,
                    api_name="losslessness", show_progress="hidden")
    link_btn.click(on_link, [session_id, prompt, scrubber], [link, learn_status, session_id], inputs_kwargs=controls,
                   api_name="share_link", show_progress="hidden")
    link.change(None, [link], [link], js=FULL_LINK_JS, api_visibility="private")
    goto_btn.click(on_goto_step, [session_id, prompt, linked_step], views, inputs_kwargs=controls,
                   api_name="goto_step", show_progress="hidden")
    example_btn.click(on_example, [session_id, example], views + [prompt, *shown], api_name="replay_example",
                      show_progress="hidden")
    # A shared link opens on its step: the controls are set first, then the run goes to the step like the
    # "Run to the linked step" button (which stays, to go there again after a change).
    link_opened = gr.State(False)

    def show_linked_step(session_id, prompt, step, opened, **controls):
        if not opened:
            return tuple(gr.skip() for _ in views)
        return on_goto_step(session_id, prompt, step, **controls)

    demo.load(on_open_link, None, [prompt, *shown, linked_step, learn_status, link_opened],
              api_visibility="private", show_progress="hidden").then(
        show_linked_step, [session_id, prompt, linked_step, link_opened], views, inputs_kwargs=controls,
        api_visibility="private", show_progress="hidden")
    demo.load(None, js=LEARN_KEYS_JS)
