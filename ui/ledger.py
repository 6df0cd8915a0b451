"""The KV cache tab of the step's views: the ledger of the step on show (dynasd/explorer/lessons/ledger.py, drawn by
viz/ledger.py), the `kv_cache` API endpoint. While the tab is open it follows the step on show, as the Learn tab
does (not during a Run), and a reveal: what stayed and what was cropped tell a hidden step's verdict, so with 'Let
me predict first' on they wait for the reveal as the step's other views do."""
from __future__ import annotations

import json

import gradio as gr

from dynasd.explorer.lessons.ledger import ledger_markdown, run_ledger
from dynasd.explorer.lessons.predict import asks_first
from dynasd.explorer.sessions.session import Session
from viz.ledger import ledger_figure

from .handler import handler
from .status import RUNNING, status_line
from .views import FigureViews, step_on_show

LEDGER_HELP = ("**Where do the rejected branches' keys and values go?** Each model keeps a KV cache: one row per "
               "position it has read. A verify forward writes a row for every tree node after the committed text; "
               "after the walk, the accepted path's rows are moved down to follow the text and every other tree row "
               "is cropped. The bonus or correction token is committed but not yet cached: the next step's forward "
               "reads it first. The draft reads its tree's upper levels (the deepest is drawn, never read) and keeps "
               "the accepted part it read.")

# Click the tab's button when the step on show changes and the tab is open (offsetParent: shown), not during a Run.
LEDGER_FOLLOWS_JS = """
() => {
  const button = document.getElementById('ledger-btn');
  const status = document.getElementById('status');
  const running = status && status.innerText.startsWith(%s);
  if (button && button.offsetParent !== null && !running) button.click();
}
""" % json.dumps(status_line(RUNNING))


@handler(FigureViews)
def on_ledger(session, index):
    """The ledger figure and its words for the step on show."""
    return ledger_views(session, index)


def ledger_views(session: Session, index) -> FigureViews:
    run, index, _ = step_on_show(session, index, "no step to show yet")
    ledger, verdict = run_ledger(run), not asks_first(session, index)
    return FigureViews(ledger_figure(run, ledger, index, verdict), ledger_markdown(ledger[index], verdict), session.id)


def ledger_section(tabs: gr.Tabs, session_id, scrubber) -> None:
    """The KV cache tab, added to the step's view tabs, and its events."""
    with tabs, gr.Tab("KV cache") as tab:
        button = gr.Button("Show the KV cache of the step on show", elem_id="ledger-btn", size="sm")
        figure = gr.Plot(label="KV cache ledger", elem_id="ledger-plot")
        text = gr.Markdown("", elem_id="ledger-text", label="KV cache ledger in words")
        gr.Markdown(LEDGER_HELP, elem_classes="explain")
    outputs = [figure, text, session_id]
    button.click(on_ledger, [session_id, scrubber], outputs, api_name="kv_cache", show_progress="hidden")
    tab.select(on_ledger, [session_id, scrubber], outputs, api_visibility="private", show_progress="hidden")
    scrubber.change(None, js=LEDGER_FOLLOWS_JS, queue=False, api_visibility="private")
