"""DynaSD Explorer: run multi-candidate speculative decoding one step at a time and watch what happens.

    python app.py                                       # embedded SmolLM2 pair, http://127.0.0.1:7860
    python app.py --pair tiny-random --port 7861        # seeded tiny pair: instant, offline, for tests

This file builds the page and launches it: arguments, preloading the start-up pair, the server's settings. The
page's widgets and handlers live in ui/, decoding and the explorer's session logic in dynasd/, figures in viz/.
Set DYNASD_PUBLIC=1 on a public server: custom model ids and paths are then refused, unless DYNASD_MODEL_DIR names
a folder: custom models are then the folders and .gguf files inside it (never hub ids, never paths outside it); and
only the decision models shipped in assets may be chosen, never a folder path.
Without DYNASD_PUBLIC, DYNASD_MODEL_DIR confines local paths to that folder and hub ids still work.
Every control of a decoder option is built from its entry in dynasd/options.py (label, range, help).
Through the API, the step's five figures (tree, mask, p vs q, stop scores, timeline) are Plotly JSON strings; a
figure left out of an update (gr.skip(): an update without a value) is the one the session already received.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import gradio as gr

from dynasd.explorer.inputs import CUSTOM, Settings, known_pairs
from dynasd.explorer.model_thread import start_on_the_model_thread
from dynasd.explorer.sessions.memory import start_heap_trimmer
from ui import state
from ui.class_address import listening
from ui.classroom import CLASS_CSS
from ui.controls import pair_choices
from ui.gpu import on_zero_gpu
from ui.layout import QUEUE_PLACE_CSS, build_app
from ui.page_scripts import CLAMP_NOTE_JS, CSS, INTRO_JS, PLOTLY_JS

MODEL_DIR = os.environ.get("DYNASD_MODEL_DIR", "") or None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="DynaSD Explorer (Gradio app)")
    parser.add_argument("--pair", default="embedded", help=f"model pair on start ({', '.join(known_pairs())})")
    parser.add_argument("--target", default="", help="custom target model (not in public mode)")
    parser.add_argument("--draft", default="", help="custom draft model (not in public mode)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    parser.add_argument("--model-dir", default=MODEL_DIR,
                        help="custom local models must lie in this folder (default: $DYNASD_MODEL_DIR)")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    args = parser.parse_args(argv)
    if args.model_dir:
        if not Path(args.model_dir).is_dir():
            parser.error(f"--model-dir '{args.model_dir}' is not a folder")
        state.PAIRS.model_dir, state.PAIRS.allow_custom = Path(args.model_dir).expanduser().resolve(), True
    pair = CUSTOM if (args.target or args.draft) else args.pair
    if pair not in pair_choices():
        parser.error(f"unknown pair '{pair}' (use {', '.join(pair_choices())})")
    state.PAIRS.device = args.device
    warm = Settings(pair=pair, target=args.target, draft=args.draft)
    if on_zero_gpu():
        # ZeroGPU's documented pattern: load at start-up and place the models on "cuda" outside any handler (its
        # emulation keeps them on the host until a spaces.GPU call attaches a GPU). In this thread, before
        # serving: the GPU process is forked from this one, and a fork while another thread holds the pair's
        # loading lock would leave the lock held in the child.
        state.PAIRS.device = "cuda" if args.device == "auto" else args.device
        _preload(warm)
    else:
        # Load the start-up pair in the background so the first Step does not wait for it, on the thread that runs
        # every model call (dynasd/explorer/model_thread.py says why one thread).
        start_on_the_model_thread(_preload, warm)
    serve(build_app(pair, args.target, args.draft), args.host, args.port)


def serve(demo: gr.Blocks, host: str = "127.0.0.1", port: int = 7860, block: bool = True) -> gr.Blocks:
    """Launch with the server settings the app relies on (the tests launch in-process with block=False)."""
    gr.set_static_paths([PLOTLY_JS])  # the page's figures are drawn by it (figure_view)
    listening(host, port)  # the class's link carries an address learners can reach (ui/class_address.py)
    start_heap_trimmer()  # abandoned sessions' freed memory goes back to the OS (flat RSS in the soak)
    demo.queue(default_concurrency_limit=QUEUE_CONCURRENCY)
    _poll_the_idle_queue_less(demo)
    demo.launch(
        server_name=host, server_port=port, css=CSS + QUEUE_PLACE_CSS + CLASS_CSS, head=CLAMP_NOTE_JS + INTRO_JS,
        max_file_size="20mb",
        footer_links=["api"],
        prevent_thread_lock=not block, quiet=not block,
        # Gradio keeps each browser session's component values (our figures among them) for its 10,000 most
        # recent sessions: ~0.5 MB each, so abandoned tabs would grow memory for hours. Keep it in line with
        # the session registry, whose sessions are the only ones that can still be stepped anyway.
        state_session_capacity=2 * state.SESSIONS.max_sessions,
        # Gradio's run history copies every event's inputs and outputs into the browser's storage (the last 100),
        # read, parsed and written whole at each event: with a Step's figures that slows every Step as the history
        # grows (docs/benchmarks.md, "The explorer in a real browser"), and it keeps a copy of every prompt in the
        # browser. The trace file is this app's way to keep a run.
        run_history=False,
        show_error=True)  # every handler error is already one readable line; gradio's own input checks too
    return demo


# How many events the queue hands to handlers at once; the others wait in the queue. The model steps one at a time
# anyway (the pair's lock), so more handlers only wait on that lock and hold a session's memory meanwhile; a few
# let a step's figures be built beside the next step's model work. 4 served a classroom best of the values measured
# (scripts/classroom.py; docs/benchmarks.md, "A classroom at once").
QUEUE_CONCURRENCY = 4


# How often an idle queue looks for new events. Gradio's own 1 ms poll keeps an idle app busy on a CPU core, on a
# Space and beside every test that runs while the app waits; 5 ms adds 2.5 ms on average before a click is
# handled, against steps of 50 ms and more (the idle cost by poll: docs/benchmarks.md, "The explorer in a real
# browser").
QUEUE_IDLE_POLL_S = 0.005


def _poll_the_idle_queue_less(demo: gr.Blocks) -> None:
    """Set the idle poll on gradio's queue (no public setting exists; tests/test_app.py fails if the attribute
    moves, rather than the setting silently doing nothing)."""
    queue = getattr(demo, "_queue", None)
    if queue is not None and hasattr(queue, "sleep_when_free"):
        queue.sleep_when_free = QUEUE_IDLE_POLL_S


def _preload(settings: Settings) -> None:
    try:
        state.PAIRS.get(settings)
    except Exception as exc:  # reported again, clearly, on first use
        print(f"could not preload model pair '{settings.pair}': {exc}")


if __name__ == "__main__":
    main()
