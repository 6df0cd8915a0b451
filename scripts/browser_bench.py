"""How the explorer feels in a real browser: headless Chromium against the app served in this process.

    python scripts/browser_bench.py                       # embedded pair, this checkout's app
    python scripts/browser_bench.py --repo ../main        # the same measurements of another checkout's app
    python scripts/browser_bench.py --pair tiny-random --clicks 3

Measures, on the page a user sees:
- Step click -> figures drawn: from the click until the step's figures on show (tree, mask, p vs q) all carry the
  new step's title and the page has painted a frame after that (median over --clicks clicks after the first,
  which also starts the run and is reported apart), split into the server's part (click -> the update queued
  for the page) and the page's (transfer, then drawing). The page waits for the figures itself (a
  MutationObserver): polling it from here would load the 2 cores the server and the page share;
- payload per update: the bytes the server queues for the page per Step, per scrub and per step of a Run (every
  message of the event as Gradio serialises it: what travels, with figures left out or sent twice);
- scrubbing: typing a step number in the step slider until the tree shows that step (median);
- Run pacing: during a Run, how many steps the server is ahead of the step on show (the largest lag seen), and
  when the server and the page finish;
- Stop: the step on show is read and Stop clicked in one script; then the steps the run took after the one on
  show (the one the page had already asked for may follow), and the time until the status says it stopped.
The app is imported from --repo and served in this process, so the server's own step count and the messages it
queues can be read beside the page. Targets: click -> figures median <= 0.5 s, payload <= 60 kB, scrubbing
<= 0.3 s, lag <= 1 step, at most one step after the step on show at Stop.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

WAIT_S = 120
MESSAGES: list[tuple[float, str, str, int]] = []  # (time, handler, message type, bytes) of every queued message


def record_messages() -> None:
    """Every message Gradio queues for a page, with its time and serialised size (the server is in-process)."""
    from gradio import queueing

    original = queueing.Queue.send_message

    def recorded(self, event, message):
        name = getattr(event.fn.fn, "__name__", str(event.fn.api_name))
        MESSAGES.append((time.perf_counter(), name, type(message).__name__, len(message.model_dump_json())))
        return original(self, event, message)

    queueing.Queue.send_message = recorded


def update_bytes(handler: str, since: float, until: float | None = None) -> list[int]:
    """Bytes of each finished event of `handler` queued in [since, until]: its data messages summed."""
    sizes, current = [], 0
    for at, name, kind, size in MESSAGES:
        if name != handler or at < since or (until is not None and at > until):
            continue
        if kind in ("ProcessGeneratingMessage", "ProcessCompletedMessage"):
            current += size
        if kind == "ProcessCompletedMessage":
            sizes.append(current)
            current = 0
    return sizes


def queued_at(handler: str, since: float) -> float | None:
    """When the first event of `handler` after `since` finished (its last message was queued)."""
    return next((at for at, name, kind, _ in MESSAGES
                 if name == handler and at >= since and kind == "ProcessCompletedMessage"), None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(repo: Path, pair: str):
    """The app of `repo`, served in this process on a free port, with `pair` loaded before any click: its
    server-side state (sessions and pairs), its address and the load time."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(repo))
    os.chdir(repo)
    import app
    from dynasd.explorer.inputs import Settings

    # the checkout's server-side state: ui/state.py, or app.py itself in a checkout from before the ui package
    state = importlib.import_module("ui.state") if (repo / "ui" / "state.py").is_file() else app
    # loaded where the app loads it: on the thread that runs its model calls (model_thread.py), where it has one
    homes = ("dynasd/explorer/model_thread.py", "ui/model_thread.py")
    home = next((path for path in homes if (repo / path).is_file()), None)
    model_thread = importlib.import_module(home[:-3].replace("/", ".")) if home else None
    started = time.perf_counter()
    if model_thread is not None:
        model_thread.on_the_model_thread(state.PAIRS.get, Settings(pair=pair))
    else:
        state.PAIRS.get(Settings(pair=pair))
    load_s = time.perf_counter() - started
    record_messages()
    port = free_port()
    app.serve(app.build_app(pair), "127.0.0.1", port, block=False)
    return state, f"http://127.0.0.1:{port}/", load_s


def chromium(width: int, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 f"--user-data-dir={tempfile.mkdtemp(prefix='dynasd-bench-')}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


class Page:
    def __init__(self, driver):
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver, self.by = driver, By
        driver.set_script_timeout(WAIT_S)
        self.wait = WebDriverWait(driver, WAIT_S, poll_frequency=0.01)
        self.unresponsive = 0  # reads the page did not answer within the script timeout (busy drawing)

    def text(self, elem_id: str) -> str:
        from selenium.common.exceptions import TimeoutException

        try:
            return self.driver.execute_script(
                "const e = document.getElementById(arguments[0]); return e ? e.innerText : ''", elem_id)
        except TimeoutException:
            self.unresponsive += 1
            return ""

    def click(self, elem_id: str) -> float:
        self.driver.execute_script("document.getElementById(arguments[0]).click()", elem_id)
        return time.perf_counter()

    def shows_step(self, index: int) -> bool:
        mark = f"Step {index}:"
        return all(mark in self.text(figure) for figure in STEP_FIGURES)

    def until_step(self, index: int, click: str | None = None) -> None:
        """Clicks `click` (if given) in the page and waits there until it shows step `index` and has painted it."""
        self.driver.execute_async_script(WAIT_FOR_STEP_JS, f"Step {index}:", list(STEP_FIGURES), click)

    def shown_step(self) -> int | None:
        match = re.search(r"Step on show: (\d+)", self.text("scrubber"))
        return int(match.group(1)) if match else None

    def type_step(self, index: int) -> float:
        from selenium.webdriver.common.keys import Keys

        box = self.driver.find_element(self.by.CSS_SELECTOR, "#scrubber input[type=number]")
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(str(index))
        started = time.perf_counter()
        box.send_keys(Keys.ENTER)
        return started


STEP_FIGURES = ("tree-plot", "mask-plot", "pq-plot")  # the step's figures on show in the default layout
WAIT_FOR_STEP_JS = """
const [mark, figures, click, done] = arguments;
const shows = () => figures.every((id) => (document.getElementById(id).textContent || "").includes(mark));
const painted = () => requestAnimationFrame(() => setTimeout(done, 0));
if (click) document.getElementById(click).click();
if (shows()) { painted(); return; }
const watcher = new MutationObserver(() => { if (shows()) { watcher.disconnect(); painted(); } });
watcher.observe(document.body, {subtree: true, childList: true, characterData: true});
"""


def the_browser_session(state, before: set[str]):
    """The session the page uses: of those made since `before`, the one used last (the page's load events may
    make others it never steps)."""
    with state.SESSIONS._guard:
        fresh = [s for key, s in state.SESSIONS._sessions.items() if key not in before]
    return max(fresh, key=lambda s: s.last_used) if fresh else None


def session_ids(state) -> set[str]:
    with state.SESSIONS._guard:
        return set(state.SESSIONS._sessions)


def measure_steps(page: Page, clicks: int) -> dict:
    times, server, starts = [], [], []
    for index in range(clicks + 1):
        started = time.perf_counter()
        page.until_step(index, click="step-btn")
        times.append(time.perf_counter() - started)
        queued = queued_at("on_step", started)
        server.append(queued - started if queued is not None else float("nan"))
        starts.append(started)
    step_bytes = update_bytes("on_step", starts[1])
    scrub, scrub_started = [], time.perf_counter()
    for index in [0, clicks, 1, clicks - 1][: max(2, min(4, clicks + 1))]:
        if page.shows_step(index):
            continue
        started = page.type_step(index)
        page.until_step(index)
        scrub.append(time.perf_counter() - started)
    return dict(first_click_s=times[0], click_to_figures_median_s=statistics.median(times[1:]),
                click_to_figures_s=[round(t, 3) for t in times[1:]],
                click_server_median_s=statistics.median(server[1:]),
                click_page_median_s=statistics.median(t - q for t, q in zip(times[1:], server[1:])),
                step_update_bytes=step_bytes,
                scrub_median_s=statistics.median(scrub) if scrub else None, scrub_s=[round(t, 3) for t in scrub],
                scrub_update_bytes=update_bytes("on_show_step", scrub_started))


STOP_AND_READ_JS = """
const shown = document.getElementById('scrubber').innerText.match(/\\((\\d+) of \\d+\\)/);
document.getElementById('stop-btn').click();
return shown ? Number(shown[1]) : null;
"""


def measure_run(page: Page, state, before: set[str], stop_after_s: float | None) -> dict:
    """Run to the end (stop_after_s None) or Stop after that long; the page's and the server's progress."""
    page.click("reset-btn")
    page.wait.until(lambda _: "Reset" in page.text("status"))
    session = the_browser_session(state, before)
    started = page.click("run-btn")
    lag, server_done, stop_clicked, shown_at_stop = 0, None, None, None
    deadline = started + WAIT_S
    while time.perf_counter() < deadline:
        run = session.run
        server_steps = len(run.steps) if run is not None else 0
        shown = page.shown_step()
        if shown is not None and run is not None:
            lag = max(lag, server_steps - 1 - shown)
        if run is not None and run.finished and server_done is None:
            server_done = time.perf_counter() - started
        status = page.text("status")
        if stop_after_s is not None and stop_clicked is None and time.perf_counter() - started >= stop_after_s:
            shown_at_stop = page.driver.execute_script(STOP_AND_READ_JS)
            stop_clicked = time.perf_counter()
        if ("Done after" in status) or (stop_clicked is not None and "Stopped after" in status):
            break
        time.sleep(0.02)
    ended = time.perf_counter()
    steps = len(session.run.steps) if session.run else 0
    result = dict(max_lag_steps=lag, page_unresponsive_reads=page.unresponsive, server_steps=steps,
                  server_done_s=server_done, page_done_s=ended - started, final_status=page.text("status")[:120],
                  run_step_update_bytes=max(update_bytes("on_run_next", started, ended), default=None))
    if stop_clicked is not None:
        stopped = "Stopped" in page.text("status")
        result.update(stop_latency_s=ended - stop_clicked if stopped else None, step_on_show_at_stop=shown_at_stop,
                      steps_after_the_step_on_show=steps - 1 - shown_at_stop if shown_at_stop is not None else None)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=str(Path(__file__).resolve().parent.parent),
                        help="the checkout whose app.py to measure (default: this one)")
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--clicks", type=int, default=5, help="Step clicks to take the median over")
    parser.add_argument("--stop-after", type=float, default=3.0, help="seconds into a Run to press Stop")
    parser.add_argument("--json", default="", help="also write the numbers to this file")
    args = parser.parse_args(argv)
    if not (shutil.which("chromium") or shutil.which("chromium-browser")) or not shutil.which("chromedriver"):
        parser.error("needs Debian chromium and chromium-driver")
    state, url, load_s = serve(Path(args.repo).resolve(), args.pair)
    numbers: dict = dict(repo=args.repo, pair=args.pair, load_s=round(load_s, 1))
    driver = chromium(1600, 1800)
    try:
        before = session_ids(state)
        driver.get(url)
        page = Page(driver)
        page.wait.until(lambda d: d.find_elements(page.by.ID, "step-btn"))
        numbers.update(measure_steps(page, args.clicks))
        print(f"steps: {numbers}", file=sys.stderr, flush=True)
        numbers["run"] = measure_run(page, state, before, None)
        print(f"run: {numbers['run']}", file=sys.stderr, flush=True)
        numbers["run_stopped"] = measure_run(page, state, before, args.stop_after)
    finally:
        driver.quit()
    print(json.dumps(numbers, indent=2, default=lambda v: round(v, 3) if isinstance(v, float) else str(v)))
    if args.json:
        Path(args.json).write_text(json.dumps(numbers, indent=2))
    threading.Timer(0.1, lambda: os._exit(0)).start()  # the in-process server's threads would keep us alive


if __name__ == "__main__":
    main()
