"""Learn → Rows and batches: the verify cost against its rows on this device (the cost model's calibration: runs
the target for a second or two) in one sentence, and a model of the speed-up against batch size
(dynasd/explorer/batching.py, viz/batching.py); the `rows_and_batches` API endpoint."""
from __future__ import annotations

import gradio as gr

from dynasd.explorer import batching
from dynasd.explorer import cost as cost_model
from dynasd.explorer.speed import run_speed
from viz.batching import batching_figure

from . import gpu, state
from .controls import settings_from
from .handler import unexpected
from .views import step_on_show


def on_rows_and_batches(session_id, index, **controls):
    session = state.SESSIONS.get(session_id)
    try:
        run, _, _ = step_on_show(session, index, "nothing to measure against yet")
        settings = session.settings or settings_from(controls)
        measured = gpu.call(gpu.gpu_calibrate, settings, cost_model.calibration_context(run))
        speed = run_speed(run, measured)  # the run's speed figures: one owner (dynasd/explorer/speed.py)
        cost = batching.row_cost(measured.timings)
        points = batching.batch_speedups(cost, speed.shape)
        text = (batching.rows_sentence(measured.timings) + f" (Forward times {speed.costs_said}.)\n\n"
                + batching.batch_sentence(points, speed.shape))
        return batching_figure(cost, points), text, session.id
    except ValueError as exc:  # UserError included
        return None, f"⚠ {exc}", session.id
    except Exception as exc:
        return None, f"✗ {unexpected(exc)}", session.id


def batching_section(session_id, scrubber, controls: dict) -> None:
    """The tab's widgets and event, built inside the Learn tab's inner tabs."""
    gr.Markdown("**Why can a tree of many tokens be verified for about the price of one, and where does that stop?** "
                "Measures one target forward over 1 to 64 rows on this device (a second or two), then models a "
                "server that decodes many sequences at once.", elem_classes="explain")
    button = gr.Button("Measure the rows here and model the batch sizes", elem_id="batch-btn")
    text = gr.Markdown("", elem_id="batch-text", label="rows and batches")
    figure = gr.Plot(label="Rows and batches", elem_id="batch-plot")
    button.click(on_rows_and_batches, [session_id, scrubber], [figure, text, session_id], inputs_kwargs=controls,
                 api_name="rows_and_batches", show_progress="hidden")
