"""The Learn tab's handlers: the guided step and the residual, the cost model, two methods on one step, the
losslessness check, shareable links, a linked step and the example traces. Each is one line behind ui/handler.py's
decorator and returns the named views of ui/learn_views.py; the tab's widgets and events are ui/learn_layout.py's."""
from __future__ import annotations

import gradio as gr

from dynasd.explorer.lessons import side_by_side

from . import gpu
from .controls import settings_from
from .handler import handler
from .learn_views import (
    CostViews,
    LearnViews,
    LinkViews,
    LosslessViews,
    SideBySideViews,
    learn_step,
    link_of,
    opened_link,
    side_by_side_settings,
)
from .measuring import measured_in_parts, run_for_show
from .play import controller
from .views import LoadViews, PhaseViews, StepViews


@handler(LearnViews)
def on_learn(session, index, phase=0):
    return LearnViews.of(session, index, phase)


@handler(PhaseViews)
def on_phase(session, index, phase):
    return PhaseViews.of(session, index, phase)


@handler(CostViews)
def on_cost(session, index, measure_again, **controls):
    """The cost model of the run on show from this device's costs: kept, or measured now part by part (again when
    asked, ui/measuring.py); where no measurement can be made here, from the run's own verify times, said to be
    modelled."""
    run, settings = run_for_show(session, index, controls, "nothing to explain yet")
    try:
        measured = yield from measured_in_parts(run, settings, lambda line: CostViews(status=line,
                                                                                      session_id=session.id),
                                                again=bool(measure_again))
        device, why_not = measured.device, ""
    except gpu.DONE_WITHOUT as exc:  # the view does without: the run's own verify times, and says why
        device, why_not = None, gpu.why_without(exc)
    yield CostViews.of(session, run, settings, device, why_not)


@handler(SideBySideViews)
def on_side_by_side(session, index, method_a, method_b, **controls):
    """Two methods from the prefix of the step on show (one model call, ui/gpu.py)."""
    run, index, _ = learn_step(session, index)
    methods = (method_a, method_b)
    prefix = side_by_side.prefix_before(run, index)
    ran = gpu.call(gpu.gpu_side_by_side, side_by_side_settings(session, controls), methods, prefix, run.prompt)
    return SideBySideViews.of(session, index, methods, side_by_side.standing_for(ran, index))


@handler(LosslessViews)
def on_losslessness(session, prompt, lossless_method, samples, **controls):
    """The first token sampled by a lossless method and by ti-mcsd against the target's p (model calls that each
    fit a GPU call: ui/gpu.py check_losslessness)."""
    methods = list(dict.fromkeys([lossless_method, "ti-mcsd"]))
    return LosslessViews.of(session, gpu.check_losslessness(settings_from(controls), prompt, methods, samples))


@handler(LinkViews)
def on_link(session, prompt, index, **controls):
    return link_of(session, prompt, index, controls)


def on_open_link(request: gr.Request):
    """On page load: a link's prompt and settings go to the controls, its step to the 'linked step' box; the last
    output says whether a link was opened, so that the page goes on to show its step (show_linked_step)."""
    return opened_link(dict(request.query_params) if request else {})


@handler(StepViews)
def on_goto_step(session, prompt, target_step, **controls):
    """Start (or continue) the run of these settings until it has the linked step, then show that step."""
    settings = settings_from(controls)
    return StepViews.of(session, controller(session, settings).goto_step(settings, prompt, target_step))


@handler(StepViews)
def on_linked_step(session, prompt, step, opened, **controls):
    """A shared link's step, once the page has set the link's controls (`opened`); nothing otherwise."""
    if not opened:
        return StepViews()
    settings = settings_from(controls)
    return StepViews.of(session, controller(session, settings).goto_step(settings, prompt, step))


@handler(LoadViews)
def on_example(session, name):
    """Replay a shipped example trace: no model is needed; its prompt and settings go to the controls."""
    return LoadViews.of(session, controller(session).example(name))
