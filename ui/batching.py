"""Learn → Rows and batches: the verify cost against its rows on this device (the cost model's calibration: the
target and the draft in rounds, part by part: ui/measuring.py) in one sentence, and a model of the speed-up against
batch size (dynasd/explorer/measure/batching.py, viz/batching.py); the `rows_and_batches` API endpoint."""
from __future__ import annotations

from dynasd.explorer.measure import batching
from dynasd.explorer.measure.speed import compared_here
from viz.batching import batching_figure

from .handler import handler
from .measuring import measured_figure_panel, measured_in_parts, run_for_show, wire_stop
from .views import FigureViews


@handler(FigureViews)
def on_rows_and_batches(session, index, **controls):
    """Measures this device's target forward over 1 to 64 rows (kept costs are re-used; a measurement says how far
    it got: ui/measuring.py) and models batch sizes, beside what Compare measured for the run's method, settings
    and prompt."""
    run, settings = run_for_show(session, index, controls, "nothing to measure against yet")
    measured = yield from measured_in_parts(run, settings, lambda line: FigureViews(text=line, session_id=session.id))
    view = batching.rows_and_batches(run, measured.device, compared_here(run, settings.controls(),
                                                                         settings.pair_key))
    yield FigureViews(batching_figure(view.cost, view.points), view.text, session.id)


def batching_section(session_id, scrubber, controls: dict) -> None:
    """The tab's widgets and event, built inside the Learn tab's inner tabs."""
    button, stop, text, figure = measured_figure_panel(
        "**Why can a tree of many tokens be verified for about the price of one, and where does that stop?** "
        "Measures one target forward over 1 to 64 rows on this device (the page says how long it took here the "
        "last time), then models a server that decodes many sequences at once.",
        "Measure the rows here and model the batch sizes", "batch", "rows and batches", "Rows and batches")
    measuring = button.click(on_rows_and_batches, [session_id, scrubber],
                             FigureViews(figure, text, session_id).outputs(), inputs_kwargs=controls,
                             api_name="rows_and_batches", show_progress="hidden")
    wire_stop(stop, measuring, text)
