"""A measurement of this device's costs from a Learn view's handler, part by part (dynasd/explorer/costs/
measuring.py): before the first part it says what it measures and how long that took here the last time, after
each part how far it got and the seconds so far, and the view's Stop measuring button cancels the event between two
parts (an unfinished calibration is never kept). Nothing is said where the kept costs stand: nothing is measured.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import gradio as gr

from dynasd.explorer.costs import cost as cost_model
from dynasd.explorer.costs.measuring import Measuring

from . import gpu
from .controls import settings_from
from .status import status_line
from .views import Views, step_on_show

STOPPED = ("Measuring stopped between two parts: a calibration cut short is not kept (a bigger target measured "
           "before the stop is). Press the button again to measure.")


def run_for_show(session, index, controls: dict, nothing_yet: str) -> tuple:
    """(run on show, its settings: the run's own, else the controls')."""
    run, _, _ = step_on_show(session, index, nothing_yet)
    return run, session.settings or settings_from(controls)


def measured_in_parts(run, settings, said: Callable[[str], Views], again: bool = False,
                      bigger_targets: bool = False) -> Iterator[Views]:
    """`yield from` it in a handler: it yields `said(line)` while measuring and returns the complete Measuring (a
    model call a part, ui/gpu.py, behind the run's own text: cost.calibration_context)."""
    started = time.monotonic()
    measuring: Measuring = gpu.call(gpu.gpu_start_measuring, settings, cost_model.calibration_context(run), again,
                                    bigger_targets)
    ahead = measuring.how_long()
    if ahead:
        yield said(status_line(f"{ahead} **Stop measuring** ends it between two parts.", "info"))
    while not measuring.complete:
        measuring = gpu.call(gpu.gpu_measure_part, settings, measuring)
        if not measuring.complete:
            yield said(status_line(f"{measuring.progress()} {time.monotonic() - started:.0f} s so far.", "info"))
    return measuring


def on_measuring_stopped():
    return status_line(STOPPED, "warn")


def stop_measuring_button(elem_id: str) -> gr.Button:
    return gr.Button("Stop measuring", variant="stop", size="sm", scale=0, min_width=150, elem_id=elem_id)


def measured_figure_panel(explain: str, button: str, elem: str, words: str, title: str,
                          **figure) -> tuple[gr.Button, gr.Button, gr.Markdown, gr.Plot]:
    """The widgets of a Learn view that measures this device and draws one figure (Rows and batches, Where would it
    pay?), in the order the page shows them: what it answers (`explain`), its button with Stop measuring beside it,
    its words (labelled `words`) and its figure (`title`, and `figure`'s other settings); their ids start with
    `elem`. The event is the view's own: `wire_stop` lets Stop cancel it."""
    gr.Markdown(explain, elem_classes="explain")
    with gr.Row():
        start = gr.Button(button, elem_id=f"{elem}-btn")
        stop = stop_measuring_button(f"{elem}-stop-btn")
    text = gr.Markdown("", elem_id=f"{elem}-text", label=words)
    plot = gr.Plot(label=title, elem_id=f"{elem}-plot", **figure)
    return start, stop, text, plot


def wire_stop(button: gr.Button, event, said_in) -> None:
    """`button` cancels `event` (between two parts of its measurement) and says so in `said_in`."""
    button.click(on_measuring_stopped, None, [said_in], cancels=[event], queue=False, api_visibility="private",
                 show_progress="hidden")
