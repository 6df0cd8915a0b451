"""Every speed figure the page shows for one run agrees with that run's Compare, or is labelled a model: in a real
browser (headless Chromium, desktop width, the tiny-random pair), after a Compare and a Run of one prompt, every
speed-up (a number followed by ×) and every tokens / s on the status line, Summary, Compare, Learn → Cost model,
Rows and batches and Where would it pay? is collected from the page's text and its figures' text, and each is
either Compare's ratio for the run's method (said "measured by Compare", within its range), labelled expected (a
model), or the run's own rate "as it happened"; the one measured ratio is quoted by every view, and where the model
lies outside Compare's range the Cost model says why."""
from __future__ import annotations

import os
import re

import pytest
import torch

from tests.test_browser import WAIT_S, headless_chromium

pytestmark = pytest.mark.browser

METHOD = "mcsd"
# where each view writes its words, and its figure when it has one
VIEWS = {"status": ("status", None), "summary": ("summary", None), "compare": ("compare-status", "compare-plot"),
         "compare table": ("compare-table", None), "cost model": ("learn-cost-text", "learn-cost-plot"),
         "best trees": (None, "learn-budget-plot"), "rows and batches": ("batch-text", "batch-plot"),
         "where would it pay": ("where-text", "where-plot")}
RATIO = re.compile(r"(\d+\.\d+)×")
RATE = re.compile(r"(\d+\.\d+) tokens/s")
COLLECT_JS = """
const [words, figure] = arguments;
const text = words ? (document.getElementById(words) || {}).innerText || "" : "";
const svg = figure ? [...document.querySelectorAll(`#${figure} .main-svg text`)].map((t) => t.textContent) : [];
return [text, svg];
"""


@pytest.fixture
def browser():
    yield from headless_chromium("1600,1800")


def speed_figures(text: str) -> list[tuple[str, float, str, str]]:
    """(kind, value, its clause, what follows it in the clause) of every speed figure in `text`, ratios to ar and
    tokens / s: a clause ends at a ";" or a line's end and at the figures on either side, so that a label ("expected",
    "measured by Compare") is read with the figure it names, not with its neighbour's."""
    matches = sorted(((kind, m) for kind, pattern in (("ratio", RATIO), ("rate", RATE))
                      for m in pattern.finditer(text)), key=lambda found: found[1].start())
    found = []
    for i, (kind, match) in enumerate(matches):
        start = max(match.start() - 120, matches[i - 1][1].end() if i else 0,
                    *(text.rfind(stop, 0, match.start()) + 1 for stop in (";", "\n")))
        end = min(match.end() + 80, matches[i + 1][1].start() if i + 1 < len(matches) else len(text),
                  *(at for at in (text.find(stop, match.end()) for stop in (";", "\n")) if at >= 0))
        found.append((kind, float(match.group(1)), text[start:end], text[match.end():end]))
    return found


def plant_bigger_targets() -> None:
    """Kept costs for the bigger targets Where would it pay? carries a run to (the app reads them from the same
    temporary cache): measuring them takes minutes on a busy CPU, and what is checked here is how the page labels
    speed figures, not those costs."""
    from dynasd.explorer.costs.cost import Conditions, MeasuredCosts, keep_costs
    from dynasd.explorer.costs.targets import BIGGER_TARGETS, target_costs_file

    # kept per machine, its torch thread count included: the app's is its own (torch's default, or one under
    # `make test`), so the costs are planted for every count it may run with
    threads = torch.get_num_threads()
    try:
        for count in range(1, (os.cpu_count() or 1) + 1):
            torch.set_num_threads(count)
            for scale, shape in enumerate(BIGGER_TARGETS, start=2):
                keep_costs(target_costs_file(shape), MeasuredCosts(
                    {rows: scale * (0.010 + 0.001 * rows) for rows in (1, 2, 4, 8, 16, 32, 64)}, "2026-12-06 00:00",
                    "planted by the test", "here", conditions=Conditions(0.1, count, 1.0, 1.0)))
    finally:
        torch.set_num_threads(threads)


def test_every_speed_figure_of_a_run_is_its_compare_or_labelled_a_model(browser, explorer_url, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    from dynasd.device_info import machine_line
    from dynasd.explorer.measure.measured_here import read_compares

    plant_bigger_targets()
    browser.get(explorer_url)
    text = lambda elem_id: browser.find_element(By.ID, elem_id).text  # noqa: E731

    def until(condition, what: str, seconds: float = 4 * WAIT_S):
        """Wait, polling slowly (the page and the server share the cores), failing with what was on show."""
        try:
            return WebDriverWait(browser, seconds, poll_frequency=0.5).until(condition)
        except Exception as exc:
            shown = {e: text(e)[:300] for e in ("status", "compare-status", "learn-status")}
            raise AssertionError(f"waiting for {what}: {shown}") from exc

    def tab(name: str) -> None:
        button = until(lambda d: next((b for b in d.find_elements(By.CSS_SELECTOR, "button[role=tab]")
                                       if b.get_attribute("textContent").strip() == name), None), f"tab {name}")
        browser.execute_script("arguments[0].scrollIntoView(); arguments[0].click()", button)

    until(ready.element_to_be_clickable((By.ID, "step-btn")), "the page")
    assert browser.find_element(By.CSS_SELECTOR, f"input[type=radio][value={METHOD}]").is_selected()
    tab("Compare")
    until(ready.element_to_be_clickable((By.ID, "compare-btn")), "Compare's button").click()
    until(lambda _: "all methods compared" in text("compare-status").lower(), "the Compare", 10 * WAIT_S)
    prompt = browser.execute_script("return document.querySelector('#prompt-box textarea').value")
    kept = next(k for k in read_compares(machine_line(), "tiny-random") if k.prompt == prompt[:400])
    measured = kept.row(METHOD)
    ratio, low, high = measured.ratio, measured.ratio_low, measured.ratio_high
    assert f"{ratio:.2f}× ({low:.2f}–{high:.2f})" in text("compare-table"), "the table shows what was kept"

    browser.find_element(By.ID, "step-btn").click()
    until(lambda _: "Step 0" in text("status"), "the first step")
    statuses = [text("status")]
    browser.find_element(By.ID, "run-btn").click()
    until(lambda _: "Done after" in text("status"), "the Run's end")
    statuses.append(text("status"))
    tab("Summary")
    until(lambda _: "speed-up over ar" in text("summary"), "the Summary")
    tab("Learn")
    for inner, button, words in (("Cost model", "learn-cost-btn", "learn-cost-text"),
                                 ("Rows and batches", "batch-btn", "batch-text"),
                                 ("Where would it pay?", "where-btn", "where-text")):
        tab(inner)
        until(ready.element_to_be_clickable((By.ID, button)), inner).click()
        until(lambda _, words=words: "×" in text(words), inner)

    seen, unlabelled, listed = {}, [], []
    for view, (words, figure) in VIEWS.items():
        said, svg = browser.execute_script(COLLECT_JS, words, figure)
        if view == "status":
            said = "\n".join(statuses)
        seen[view] = said + "\n" + "\n".join(svg)
        for kind, value, around, after in speed_figures(said) + [f for t in svg for f in speed_figures(t)]:
            if view.startswith("compare"):
                listed.append((view, kind, value, "Compare's own measurement"))
                continue
            if "measured by Compare" in after:
                assert abs(value - ratio) <= 0.006, f"{view}: {value}× said measured, Compare: {ratio:.2f}×: {around}"
                listed.append((view, kind, value, "Compare's paired ratio, quoted"))
            elif kind == "rate" and "as it happened" in around:
                listed.append((view, kind, value, "this run's own rate, as it happened"))
            elif "expected" not in around.lower() and "model" not in around.lower():
                unlabelled.append(f"{view}: …{around}…")
            else:
                listed.append((view, kind, value, "a model, labelled expected"))
    print("\nevery speed figure of the run (view, kind, value, where it comes from):")
    for view, kind, value, source in listed:
        print(f"  {view:20} {kind:5} {value:8.2f}  {source}")
    assert not unlabelled, "speed figures neither measured by Compare nor labelled a model:\n" + "\n".join(unlabelled)
    quoted = f"{ratio:.2f}× ar"
    for view in ("summary", "cost model", "rows and batches", "where would it pay"):
        assert quoted in seen[view], f"{view} does not quote Compare's {quoted}"
    cost_text = seen["cost model"]  # its tab hidden now: read as collected
    model = re.search(r"(\d+\.\d+)× \(expected\)", cost_text)
    assert model, f"the Cost model's expected speed-up: {cost_text}"
    expected = float(model.group(1))
    # one method and settings, one expected ratio: Rows and batches' one sequence and Where would it pay?'s row
    # for this CPU are the Cost model's figure, to its rounding
    one_sequence = re.search(r"the model expects \*?\*?(\d+\.\d+)× \(expected\)\*?\*? for one sequence",
                             seen["rows and batches"])
    this_cpu = re.search(r"On this CPU this tree \(.*?\) is expected at (\d+\.\d+)× ar", seen["where would it pay"])
    assert one_sequence and this_cpu, (seen["rows and batches"][:400], seen["where would it pay"][:400])
    assert float(one_sequence.group(1)) == expected == float(this_cpu.group(1)), \
        f"one run, one expected ratio: cost model {expected}, rows and batches {one_sequence.group(1)}, " \
        f"where would it pay {this_cpu.group(1)}"
    if not low <= expected <= high:
        assert "Compare's range: the model counts a step" in cost_text, "why the two differ"
    assert "measured again because" not in cost_text.lower()
    browser.save_screenshot(str(tmp_path / "speed-figures.png"))
