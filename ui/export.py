"""Trace tab → export the run on show as one self-contained HTML file (viz/export_html.py): opens offline in any
browser with no server or model; the `export_html` API endpoint."""
from __future__ import annotations

import tempfile
from pathlib import Path

import gradio as gr

from viz.export_html import MAX_EXPORT_STEPS, write_run_html

from . import state
from .status import status_line
from .views import unexpected


def on_export(session_id):
    session = state.SESSIONS.get(session_id)
    run = session.run
    if run is None or not run.steps:
        return None, status_line("Nothing to export yet: press **Step** or **Run** (or replay an example) first.",
                                 "warn"), session.id
    try:
        with session.lock:
            folder = Path(tempfile.mkdtemp(prefix="dynasd-html-"))
            path = write_run_html(run, folder / f"dynasd-{run.method}-{len(run.steps)}steps.html")
            steps = len(run.steps)
    except Exception as exc:
        return None, status_line(str(unexpected(exc)), "error"), session.id
    cut = f" (the first {MAX_EXPORT_STEPS})" if steps > MAX_EXPORT_STEPS else ""
    return str(path), status_line(f"Exported {steps} steps{cut} to {path.name}: one file that opens offline in any "
                                  "browser.", "ok"), session.id


def export_controls(session_id, status) -> None:
    """The export button and its file, built inside the Trace tab."""
    button = gr.Button("Export this run as one HTML file (opens offline, no server)", elem_id="export-btn")
    exported = gr.File(label="HTML file to download", interactive=False, elem_id="export-file")
    button.click(on_export, [session_id], [exported, status, session_id], api_name="export_html",
                 show_progress="hidden")
