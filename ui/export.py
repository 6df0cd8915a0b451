"""Trace tab → export the run on show as one self-contained HTML file (viz/export_html.py): opens offline in any
browser with no server or model; the `export_html` API endpoint."""
from __future__ import annotations

import tempfile
from pathlib import Path

import gradio as gr

from dynasd.explorer.inputs import UserError
from dynasd.explorer.sessions.session import Session
from viz.export_html import MAX_EXPORT_STEPS, write_run_html

from .handler import handler
from .status import status_line
from .views import SaveViews


@handler(SaveViews)
def on_export(session):
    return export_views(session)


def export_views(session: Session) -> SaveViews:
    """The run on show as one HTML file in a folder of its own."""
    run = session.run
    if run is None or not run.steps:
        raise UserError("Nothing to export yet: press Step or Run (or replay an example) first.")
    with session.lock:
        folder = Path(tempfile.mkdtemp(prefix="dynasd-html-"))
        path = write_run_html(run, folder / f"dynasd-{run.method}-{len(run.steps)}steps.html")
        steps = len(run.steps)
    cut = f" (the first {MAX_EXPORT_STEPS})" if steps > MAX_EXPORT_STEPS else ""
    return SaveViews(str(path), status_line(f"Exported {steps} steps{cut} to {path.name}: one file that opens "
                                            "offline in any browser.", "ok"), session.id)


def export_controls(session_id, status) -> None:
    """The export button and its file, built inside the Trace tab."""
    button = gr.Button("Export this run as one HTML file (opens offline, no server)", elem_id="export-btn")
    exported = gr.File(label="HTML file to download", interactive=False, elem_id="export-file")
    button.click(on_export, [session_id], SaveViews(exported, status, session_id).outputs(), api_name="export_html",
                 show_progress="hidden")
