"""Learn → Where would it pay?: the run on show's acceptance carried to this device, to targets of larger real shapes
measured here, and to a GPU (dynasd/explorer/measure/where.py; drawn by viz/where.py); the `where_would_it_pay` API
endpoint. The first use measures the bigger targets on this device (tens of seconds on a CPU) and keeps them."""
from __future__ import annotations

import gradio as gr

from dynasd.explorer.measure import where
from dynasd.explorer.measure.speed import compared_here
from viz.where import where_figure, where_markdown

from .handler import handler
from .measuring import measured_figure_panel, measured_in_parts, run_for_show, wire_stop
from .page_scripts import saying
from .views import FigureViews

# the first use measures the bigger targets on this device: without a word the panel stayed blank for tens of seconds
WHERE_FIRST = ("Carrying this run to bigger targets and a GPU… The first time measures the bigger targets on this "
               "device (tens of seconds on a CPU, then kept).")


@handler(FigureViews)
def on_where(session, index, **controls):
    """The run on show's acceptance carried to this device, to bigger targets measured here and to a GPU (what is
    not kept yet is measured part by part, saying how far it got: ui/measuring.py)."""
    run, settings = run_for_show(session, index, controls, "nothing to carry yet")
    measured = yield from measured_in_parts(run, settings, lambda line: FigureViews(text=line, session_id=session.id),
                                            bigger_targets=True)
    view = where.where_of_run(run, where.where_costs_of(measured), compared_here(run, settings.controls(),
                                                                                 settings.pair_key))
    yield FigureViews(where_figure(view), where_markdown(view, where.tree_verdict(view)), session.id)


def where_section(session_id, scrubber, controls: dict) -> None:
    """The tab, its widgets and its event, built inside the Learn tab's inner tabs (one call from learn_section)."""
    with gr.Tab("Where would it pay?"):
        button, stop, text, figure = measured_figure_panel(
            "**Would this run pay with a bigger target, or on a GPU?** Two numbers decide it: what a draft forward "
            "costs as a share of a target forward, and the acceptance a step of this tree needs to break even. This "
            "carries the run on show's acceptance to this device (its measured costs), to targets of larger real "
            "shapes measured here (the first time: tens of seconds, then kept) and to a GPU.",
            "Carry this run to other targets and a GPU", "where", "where would it pay", "Where would it pay?",
            show_label=False)
    # its words say at once what the click began, then the handler's replace them (in that order: .then)
    measuring = button.click(None, None, [text], js=saying(WHERE_FIRST), queue=False,
                             api_visibility="private").then(
        on_where, [session_id, scrubber], FigureViews(figure, text, session_id).outputs(), inputs_kwargs=controls,
        api_name="where_would_it_pay", show_progress="hidden")
    wire_stop(stop, measuring, text)
