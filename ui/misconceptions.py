"""Learn → Losslessness → the misconception lab: the correct acceptance rule beside the wrong ones learners
propose, sampled at a rejection of the run on show (dynasd/explorer/lessons/misconceptions.py; viz/misconceptions.py);
the `misconceptions` API endpoint. No model: it reads p and q from the trace."""
from __future__ import annotations

import gradio as gr

from dynasd.explorer.lessons import misconceptions as lab
from dynasd.explorer.sessions.session import Session
from viz.misconceptions import lab_figure, lab_markdown

from .handler import handler
from .views import FigureViews


@handler(FigureViews)
def on_lab(session, index, samples):
    return lab_views(session, index, int(samples or lab.DEFAULT_SAMPLES))


def lab_views(session: Session, index, samples: int) -> FigureViews:
    """Every rule sampled at the rejection nearest the step on show, drawn against p, and in words."""
    position = lab.lab_position(session.run, index, samples)
    results = lab.run_lab(position, samples)
    return FigureViews(lab_figure(position, results, samples),
                       lab_markdown(position, results, samples, lab.clearest_step(session.run)), session.id)


def misconception_lab(session_id, scrubber) -> None:
    """The lab's widgets and event, built inside the Losslessness tab."""
    gr.Markdown("**Misconception lab: why not simply …?** Each rule below decides one token from the target's p and "
                "the draft's q at a rejection of the run on show (the nearest to the step on show where the wrong "
                "rules' biases show; a sampled run). Only the first keeps the output distributed as p; the others "
                "are the shortcuts learners propose. No model runs: p and q come from the trace.",
                elem_classes="explain")
    with gr.Row():
        samples = gr.Slider(500, lab.MAX_SAMPLES, value=lab.DEFAULT_SAMPLES, step=500, label="Decisions per rule",
                            elem_id="lab-samples")
        button = gr.Button("Sample the rules at the step on show", elem_id="lab-btn")
    text = gr.Markdown("", elem_id="lab-text", label="misconception lab result")
    figure = gr.Plot(label="Each rule's output against p", elem_id="lab-plot")
    button.click(on_lab, [session_id, scrubber, samples], [figure, text, session_id], api_name="misconceptions",
                 show_progress="hidden")
