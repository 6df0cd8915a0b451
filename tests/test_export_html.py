"""The run as one HTML file: self-contained (plotly.js inlined, nothing fetched), every step's figures and words in
it, hostile text escaped; Chromium opens it from disk with no server, draws the figures and moves with the slider
and the keys; the app's export_html endpoint hands the file out."""
import json
from pathlib import Path

import pytest
from test_browser import WAIT_S, browser  # noqa: F401  (the browser fixture)

from dynasd.explorer.sessions.share import load_example
from viz.export_html import run_html, write_run_html


def test_the_file_holds_every_step_and_fetches_nothing():
    run = load_example("sd-sampled")
    page = run_html(run)
    assert "Plotly" in page and "<script src" not in page and "<link" not in page  # plotly.js is inlined
    data = json.loads(page.split('<script type="application/json" id="steps">')[1].split("</script>")[0])
    assert len(data) == len(run.steps)
    assert all(set(step["figures"]) == {"tree", "mask", "pq"} for step in data)
    assert data[3]["figures"]["tree"]["layout"]["title"]["text"].startswith("Step 3")


def test_text_from_the_trace_is_escaped():
    run = load_example("mcsd-greedy")
    run.prompt = "</script><script>alert(1)</script>"
    run.steps[0].committed_tokens[0] = "<img src=x onerror=alert(1)>"
    page = run_html(run)
    assert "<script>alert(1)" not in page and "<img src=x" not in page
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in page


@pytest.mark.browser
def test_chromium_opens_the_file_from_disk_and_steps_through_it(browser, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    run = load_example("sd-sampled")
    path = write_run_html(run, tmp_path / "run.html")
    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.05)
    browser.get(Path(path).as_uri())
    wait.until(lambda d: "Step 0: 4 candidates" in d.find_element(By.ID, "tree").text)
    assert browser.find_elements(By.CSS_SELECTOR, "#mask .heatmaplayer image")
    assert "Step 0." in browser.find_element(By.ID, "story").text
    browser.find_element(By.ID, "next").click()
    wait.until(lambda d: "Step 1" in d.find_element(By.ID, "tree").text)
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ARROW_RIGHT)
    wait.until(lambda d: "step 2 of" in d.find_element(By.ID, "label").text)
    assert "Step 2." in browser.find_element(By.ID, "story").text
    tokens = browser.find_elements(By.CSS_SELECTOR, "#text .tok")
    assert len(tokens) == sum(len(s.committed) for s in run.steps[:3])
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0


def test_the_export_endpoint_hands_out_the_file(explorer_url):
    from gradio_client import Client

    client = Client(explorer_url, verbose=False)
    assert "Nothing to export yet" in client.predict(api_name="/export_html")[1]
    client.predict("mcsd-greedy", api_name="/replay_example")
    path, status = client.predict(api_name="/export_html")
    assert "Exported 14 steps" in status
    assert Path(path).read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
