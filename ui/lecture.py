"""Lecture mode: for a presenter in front of a class. Large type, the step's figures across the whole width, the
settings and help out of the way, keys for step / back / run / reveal, and each step's verdicts hidden until the
presenter reveals them (the class guesses first: the predict-then-reveal views of ui/predict.py). On a replayed run
(an example, a loaded trace) → shows the replay's next recorded step: a replay has no model to step, and a new run
would throw it away."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import gradio as gr

from .handler import handler
from .ledger import LEDGER_FOLLOWS_JS
from .play import controller
from .views import LectureViews, StepViews

KEYS = (("→ or N", "the next step (a new one, or a replay's next), its verdicts hidden"),
        ("V", "reveal the step on show"), ("←", "back one step"), ("R", "Run to the end"),
        ("Esc", "leave lecture mode"))
KEYS_HELP = "**Lecture keys:** " + " · ".join(f"**{key}** {what}" for key, what in KEYS)
# Outside lecture mode ← and → belong to the guided step's phases (ui/page_scripts.py LEARN_KEYS_JS): the main view
# says so, and how to step and go back there, so a ← that moves no step is not a silent one.
STEP_KEYS = (("Shift+→", "Step"), ("← →", "the guided step's phases (Learn)"),
             ("the slider", "back to an earlier step"), ("Lecture mode", "→ steps, ← goes back"))
STEP_KEYS_HELP = "Keys: " + " · ".join(f"**{key}** {what}" for key, what in STEP_KEYS)

LECTURE_CSS = """
body.dynasd-lecture .gradio-container { zoom: 1.2; }
body.dynasd-lecture #intro, body.dynasd-lecture #settings-column, body.dynasd-lecture #follow-up-row,
body.dynasd-lecture #prompt-box, body.dynasd-lecture #top-controls .gallery, body.dynasd-lecture .explain,
body.dynasd-lecture #predict-first, body.dynasd-lecture #predict-panel, body.dynasd-lecture #step-keys,
body.dynasd-lecture #top-controls .block:has(.gallery) { display: none !important; }
body.dynasd-lecture #main-row { flex-direction: column; }
body.dynasd-lecture #controls-column { max-width: none !important; width: 100%; }
body.dynasd-lecture #results-column > .row { flex-direction: column; align-items: stretch !important; }
body.dynasd-lecture #story { font-size: 1.35em; line-height: 1.5; }
body.dynasd-lecture #dynasd-text { font-size: 1.3em; }
"""

# Entering or leaving lecture mode: the page's class (and its CSS, added once). The keys act only in lecture mode
# and before the page's other keys (capture phase), so → steps instead of moving the guided phase.
LECTURE_TOGGLE_JS = """
(on) => {
  if (!document.getElementById('dynasd-lecture-css')) {
    const style = document.createElement('style');
    style.id = 'dynasd-lecture-css';
    style.textContent = %s;
    document.head.appendChild(style);
  }
  document.body.classList.toggle('dynasd-lecture', on === true);
  if (on === true) window.scrollTo(0, 0);
  if (!window.__dynasdLectureKeys) {
    window.__dynasdLectureKeys = true;
    document.addEventListener('keydown', (event) => {
      if (!document.body.classList.contains('dynasd-lecture')) return;
      const tag = event.target && event.target.tagName ? event.target.tagName.toLowerCase() : '';
      if (tag === 'input' || tag === 'textarea' || tag === 'select') return;
      if (event.target && event.target.id === 'tree-plot' && event.key.startsWith('Arrow')) return;  // it scrolls
      if (event.altKey || event.ctrlKey || event.metaKey || event.shiftKey) return;
      const ids = {ArrowRight: 'lecture-next', n: 'lecture-next', ArrowLeft: 'lecture-back', v: 'lecture-reveal',
                   r: 'run-btn', Escape: 'lecture-mode'};
      const id = ids[event.key.length === 1 ? event.key.toLowerCase() : event.key];
      if (!id) return;
      event.preventDefault();
      event.stopImmediatePropagation();
      const element = document.getElementById(id);
      const target = id === 'lecture-mode' ? element && element.querySelector('input') : element;
      if (target) target.click();
    }, true);
  }
  return on;
}
""" % json.dumps(LECTURE_CSS)


@handler(LectureViews)
def on_lecture(session, on, index):
    """Lecture mode on: the step on show hides its verdicts until revealed; off: shown as usual."""
    said = "Lecture mode: → steps, V reveals, ← goes back, R runs, Esc leaves." if on else "Lecture mode off."
    return LectureViews.of(session, controller(session).predict_first(on, index, said), box=gr.Column(visible=bool(on)))


@dataclass
class NextViews(StepViews, named=("press_step",)):
    """Lecture's →: a replayed run's next recorded step; on any other run no view but `press_step`, on which the
    page presses Step (which reads the page's prompt and controls, and says at once that it works)."""

    press_step: Any = False


# After → : the page presses Step when the server said so (the run on show is not a replay).
PRESS_STEP_JS = "(press) => { if (press === true) document.getElementById('step-btn').click(); }"


@handler(NextViews)
def on_next(session, index):
    if not session.replay:
        return NextViews(press_step=True)
    return NextViews.of(session, controller(session).next_recorded(index))


@handler(StepViews)
def on_back(session, index):
    return StepViews.of(session, controller(session).back(index))


@handler(StepViews)
def on_reveal(session, index):
    return StepViews.of(session, controller(session).reveal(index))


def lecture_toggle() -> gr.Checkbox:
    """Built with the settings ('Learning modes'), which lecture mode puts away (Esc leaves it)."""
    return gr.Checkbox(False, label="Lecture mode", elem_id="lecture-mode",
                       info="large type, figures across the screen, verdicts hidden until revealed; keys: → or N "
                            "step, V reveal, ← back, R run, Esc leave")


def lecture_buttons() -> tuple[gr.Column, gr.Button, gr.Button, gr.Button]:
    """The buttons the keys press (back, next, reveal) and the keys' help, under Play's buttons: shown (and so in
    the page for the keys to press) in lecture mode only."""
    with gr.Column(visible=False, elem_id="lecture-box") as box:
        with gr.Row(elem_id="lecture-buttons"):
            back = gr.Button("← Back", size="sm", elem_id="lecture-back", min_width=80)
            next_step = gr.Button("Next step →", size="sm", elem_id="lecture-next", min_width=80)
            reveal = gr.Button("Reveal (V)", size="sm", elem_id="lecture-reveal", min_width=80)
        gr.Markdown(KEYS_HELP, elem_id="lecture-keys")
    return box, back, reveal, next_step


def wire_lecture(toggle: gr.Checkbox, buttons: tuple, session_id, scrubber, views: StepViews) -> None:
    """Lecture mode's events; a reveal and the mode turned on or off redraw the KV cache tab when it is open (its
    ledger tells the verdict too)."""
    box, back, reveal, next_step = buttons
    toggle.change(None, [toggle], None, js=LECTURE_TOGGLE_JS, queue=False, api_visibility="private")
    toggle.change(on_lecture, [session_id, toggle, scrubber], LectureViews(**vars(views), box=box).outputs(),
                  api_visibility="private", show_progress="hidden").then(
        None, js=LEDGER_FOLLOWS_JS, queue=False, api_visibility="private")
    press = gr.Checkbox(False, visible=False, label="press Step")
    next_step.click(on_next, [session_id, scrubber], NextViews(**vars(views), press_step=press).outputs(),
                    api_visibility="private", show_progress="hidden").then(
        None, [press], None, js=PRESS_STEP_JS, queue=False, api_visibility="private")
    back.click(on_back, [session_id, scrubber], views.outputs(), api_visibility="private", show_progress="hidden")
    reveal.click(on_reveal, [session_id, scrubber], views.outputs(), api_name="reveal", show_progress="hidden").then(
        None, js=LEDGER_FOLLOWS_JS, queue=False, api_visibility="private")
