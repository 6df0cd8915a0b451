"""How the explorer feels in a real browser: headless Chromium against the app served in this process.

    python scripts/browser_bench.py                       # embedded pair, this checkout's app
    python scripts/browser_bench.py --repo ../main        # the same measurements of another checkout's app
    python scripts/browser_bench.py --pair tiny-random --clicks 3

Measures, on the page a user sees:
- Step click -> figures drawn: from the click until the tree and the mask both show the new step's title
  (median over --clicks clicks after the first, which also starts the run and is reported apart);
- payload per update: the bytes of figure JSON one Step sends (the five figures' Plotly JSON, through the API);
- scrubbing: typing a step number in the step slider until the tree shows that step (median);
- Run pacing: during a Run, how many steps the server is ahead of the step on show (the largest lag seen), and
  when the server and the page finish;
- Stop latency: from the Stop click until the status says the run stopped, and the steps taken after the click.
The app is imported from --repo and served in this process, so the server's own step count can be read beside
the page's. Targets: click -> figures median <= 0.5 s, payload <= 60 kB, scrubbing <= 0.3 s, lag <= 1 step.
"""
from __future__ import annotations

import argparse
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
FIGURES = ("tree", "mask", "pq", "stop", "timeline")
OUT = dict(text=0, tree=1, mask=2, pq=3, stop=4, timeline=5, summary=6, status=7, story=8, scrubber=9)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(repo: Path, pair: str):
    """The app of `repo`, served in this process on a free port, with `pair` loaded before any click."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(repo))
    os.chdir(repo)
    import app
    from dynasd.explorer.inputs import Settings

    started = time.perf_counter()
    app.PAIRS.get(Settings(pair=pair))
    load_s = time.perf_counter() - started
    port = free_port()
    app.serve(app.build_app(pair), "127.0.0.1", port, block=False)
    return app, f"http://127.0.0.1:{port}/", load_s


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
        return mark in self.text("tree-plot") and mark in self.text("mask-plot")

    def shown_step(self) -> int | None:
        match = re.search(r"\((\d+) of (\d+)\)", self.text("scrubber"))
        return int(match.group(1)) if match else None

    def type_step(self, index: int) -> float:
        from selenium.webdriver.common.keys import Keys

        box = self.driver.find_element(self.by.CSS_SELECTOR, "#scrubber input[type=number]")
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(str(index))
        started = time.perf_counter()
        box.send_keys(Keys.ENTER)
        return started


def the_browser_session(app, before: set[str]):
    """The session the page created (the registry's newest one)."""
    with app.SESSIONS._guard:
        fresh = [s for key, s in app.SESSIONS._sessions.items() if key not in before]
    return fresh[-1] if fresh else None


def session_ids(app) -> set[str]:
    with app.SESSIONS._guard:
        return set(app.SESSIONS._sessions)


def measure_steps(page: Page, clicks: int) -> dict:
    times = []
    for index in range(clicks + 1):
        started = page.click("step-btn")
        page.wait.until(lambda _, index=index: page.shows_step(index))
        times.append(time.perf_counter() - started)
    scrub = []
    for index in [0, clicks, 1, clicks - 1][: max(2, min(4, clicks + 1))]:
        if page.shows_step(index):
            continue
        started = page.type_step(index)
        page.wait.until(lambda _, index=index: page.shows_step(index))
        scrub.append(time.perf_counter() - started)
    return dict(first_click_s=times[0], click_to_figures_median_s=statistics.median(times[1:]),
                click_to_figures_s=[round(t, 3) for t in times[1:]],
                scrub_median_s=statistics.median(scrub) if scrub else None, scrub_s=[round(t, 3) for t in scrub])


def measure_payload(url: str, pair: str, steps: int) -> dict:
    from gradio_client import Client

    client = Client(url, verbose=False)
    sizes = []
    for _ in range(steps):
        out = client.predict(prompt="Explain why the sky is blue in two sentences.", pair=pair, api_name="/step")
        sizes.append({name: len(out[OUT[name]]["plot"]) if isinstance(out[OUT[name]], dict)
                      and "plot" in out[OUT[name]] else 0 for name in FIGURES})
    totals = [sum(s.values()) for s in sizes]
    return dict(payload_per_update_bytes=max(totals), payload_mean_bytes=round(statistics.mean(totals)),
                payload_by_figure_last=sizes[-1])


def measure_run(page: Page, app, before: set[str], stop_after_s: float | None) -> dict:
    """Run to the end (stop_after_s None) or Stop after that long; the page's and the server's progress."""
    page.click("reset-btn")
    page.wait.until(lambda _: "Reset" in page.text("status"))
    session = the_browser_session(app, before)
    started = page.click("run-btn")
    lag, server_done, stop_clicked, steps_at_stop = 0, None, None, None
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
            steps_at_stop = server_steps
            stop_clicked = page.click("stop-btn")
        if ("Done after" in status) or (stop_clicked is not None and "Stopped after" in status):
            break
        time.sleep(0.02)
    ended = time.perf_counter()
    result = dict(max_lag_steps=lag, page_unresponsive_reads=page.unresponsive,
                  server_steps=len(session.run.steps) if session.run else 0,
                  server_done_s=server_done, page_done_s=ended - started, final_status=page.text("status")[:120])
    if stop_clicked is not None:
        result.update(stop_latency_s=ended - stop_clicked if "Stopped" in page.text("status") else None,
                      steps_after_stop=result["server_steps"] - steps_at_stop)
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
    app, url, load_s = serve(Path(args.repo).resolve(), args.pair)
    numbers: dict = dict(repo=args.repo, pair=args.pair, load_s=round(load_s, 1))
    driver = chromium(1600, 1800)
    try:
        before = session_ids(app)
        driver.get(url)
        page = Page(driver)
        page.wait.until(lambda d: d.find_elements(page.by.ID, "step-btn"))
        numbers.update(measure_steps(page, args.clicks))
        print(f"steps: {numbers}", file=sys.stderr, flush=True)
        numbers["run"] = measure_run(page, app, before, None)
        print(f"run: {numbers['run']}", file=sys.stderr, flush=True)
        numbers["run_stopped"] = measure_run(page, app, before, args.stop_after)
    finally:
        driver.quit()
    numbers.update(measure_payload(url, args.pair, 2))
    print(json.dumps(numbers, indent=2, default=lambda v: round(v, 3) if isinstance(v, float) else str(v)))
    if args.json:
        Path(args.json).write_text(json.dumps(numbers, indent=2))
    threading.Timer(0.1, lambda: os._exit(0)).start()  # the in-process server's threads would keep us alive


if __name__ == "__main__":
    main()
