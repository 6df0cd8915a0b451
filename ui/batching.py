"""Learn → Rows and batches: the verify cost against its rows on this device (the cost model's calibration: runs
the target for a second or two) in one sentence, and a model of the speed-up against batch size
(dynasd/explorer/measure/batching.py, viz/batching.py); the `rows_and_batches` API endpoint."""
from __future__ import annotations

import gradio as gr

from dynasd.explorer.measure import batching
from dynasd.explorer.measure.speed import compared_here
from viz.batching import batching_figure

from . import gpu
from .handler import handler
from .views import MeasuredViews, measured_for_show


@handler(MeasuredViews)
def on_rows_and_batches(session, index, **controls):
    """Measures this device's target forward over 1 to 64 rows (kept costs are re-used) and models batch sizes,
    beside what Compare measured for the run's method, settings and prompt."""
    run, settings, measured = measured_for_show(session, index, controls, "nothing to measure against yet",
                                                gpu.gpu_calibrate)
    view = batching.rows_and_batches(run, measured, compared_here(run, settings.controls(), settings.pair_key))
    return MeasuredViews(batching_figure(view.cost, view.points), view.text, session.id)


def batching_section(session_id, scrubber, controls: dict) -> None:
    """The tab's widgets and event, built inside the Learn tab's inner tabs."""
    gr.Markdown("**Why can a tree of many tokens be verified for about the price of one, and where does that stop?** "
                "Measures one target forward over 1 to 64 rows on this device (a second or two), then models a "
                "server that decodes many sequences at once.", elem_classes="explain")
    button = gr.Button("Measure the rows here and model the batch sizes", elem_id="batch-btn")
    text = gr.Markdown("", elem_id="batch-text", label="rows and batches")
    figure = gr.Plot(label="Rows and batches", elem_id="batch-plot")
    button.click(on_rows_and_batches, [session_id, scrubber], MeasuredViews(figure, text, session_id).outputs(),
                 inputs_kwargs=controls,
                 api_name="rows_and_batches", show_progress="hidden")
