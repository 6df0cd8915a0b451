"""A real browser: headless Chromium loads the explorer, clicks Step twice and Run, and sees the tree, the mask
and the coloured text. It saves a screenshot (looked at by a person, not by the test) to pytest's temporary folder,
or to docs/screenshots/ with DYNASD_SCREENSHOTS=1, so that a test run leaves the checkout as it was."""
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
DOCS_SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
WAIT_S = 90


def headless_chromium(window_size: str):
    """Debian's headless Chromium under ChromeDriver with a profile of its own, quit and removed afterwards (a
    generator for fixtures of any scope; skips where `make browser` has not installed them)."""
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("Debian chromium and chromium-driver are not installed (run `make browser`)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="dynasd-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", f"--user-data-dir={profile}", f"--window-size={window_size}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def browser():
    yield from headless_chromium("1600,1800")


def test_step_step_run_shows_tree_mask_and_text(browser, explorer_url, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT_S)
    browser.get(explorer_url)
    status = lambda: browser.find_element(By.ID, "status").text  # noqa: E731

    wait.until(ready.element_to_be_clickable((By.ID, "step-btn"))).click()
    wait.until(lambda _: "Step 0" in status())
    browser.find_element(By.ID, "step-btn").click()
    wait.until(lambda _: "Step 1" in status())
    browser.find_element(By.ID, "run-btn").click()
    wait.until(lambda _: "Done after" in status())

    # Plotly draws into .js-plotly-plot; the tree has node markers, the mask a heatmap image
    tree = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#tree-plot .js-plotly-plot .scatterlayer .point"))
    assert len(tree) > 10
    mask = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#mask-plot .js-plotly-plot .heatmaplayer image"))
    assert mask
    assert "verify mask" in browser.find_element(By.ID, "mask-plot").text
    tokens = browser.find_elements(By.CSS_SELECTOR, "#dynasd-text .textfield .token")
    assert len(tokens) >= 20, "every generated token is its own highlighted span"
    legend = browser.find_element(By.ID, "dynasd-text").text
    assert "accepted draft" in legend

    # the scrubber brings back an earlier step (step 1 has rejections and a bonus: a good picture for the docs)
    box = browser.find_element(By.CSS_SELECTOR, "#scrubber input[type=number]")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("1", Keys.ENTER)
    wait.until(lambda _: "Step 1:" in browser.find_element(By.ID, "tree-plot").text)
    assert "Step 1:" in browser.find_element(By.ID, "mask-plot").text

    # the run timeline sits in the Summary tab, which Gradio mounts when it is first shown: then it is drawn, to
    # the width of its box
    timeline = lambda: browser.find_elements(By.CSS_SELECTOR, "#timeline-plot .js-plotly-plot .main-svg")  # noqa: E731
    assert not timeline(), "nothing is drawn in a tab not yet shown"
    next(b for b in browser.find_elements(By.CSS_SELECTOR, "button[role=tab]") if b.text.strip() == "Summary").click()
    drawn = wait.until(lambda _: timeline())
    box = browser.find_element(By.CSS_SELECTOR, "#timeline-plot .dynasd-figure")
    assert abs(int(drawn[0].get_attribute("width")) - box.size["width"]) <= 2, "drawn at the box's width"
    assert "steps" in browser.find_element(By.ID, "timeline-plot").text

    screenshots = DOCS_SCREENSHOTS if os.environ.get("DYNASD_SCREENSHOTS") == "1" else tmp_path
    screenshots.mkdir(parents=True, exist_ok=True)
    height = browser.execute_script("return document.body.scrollHeight")
    browser.set_window_size(1600, min(max(height, 1200), 4000))
    browser.execute_script("window.scrollTo(0, 0)")
    browser.save_screenshot(str(screenshots / "explorer.png"))

    # a figure sent while its tab is hidden waits, and is drawn when the tab is shown: a Step pays for no figure
    # the learner cannot see
    tab = lambda name: next(b for b in browser.find_elements(By.CSS_SELECTOR, "button[role=tab]")  # noqa: E731
                            if b.text.strip() == name)
    title = ("const b = document.querySelector('#timeline-plot .dynasd-figure'); "
             "return b.layout ? b.layout.title.text : ''")
    tab("Decisions").click()
    browser.find_element(By.ID, "reset-btn").click()
    wait.until(lambda _: "Reset" in status())
    browser.find_element(By.ID, "step-btn").click()
    wait.until(lambda _: "Step 0" in browser.find_element(By.ID, "tree-plot").text)
    assert "1 steps" not in browser.execute_script(title), "not drawn while its tab is hidden"
    tab("Summary").click()
    wait.until(lambda _: "1 steps" in browser.execute_script(title))


def test_a_recipe_sets_the_method_controls(browser, explorer_url):
    """Choosing a recipe in the real page switches the method (and the controls it shows), then Step runs it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT_S)
    browser.get(explorer_url)
    status = lambda: browser.find_element(By.ID, "status").text  # noqa: E731
    menu = wait.until(ready.element_to_be_clickable((By.CSS_SELECTOR, "#recipe input")))
    menu.click()  # a recipe's label may lead with ★ where a Compare kept by another test found it the winner
    option = wait.until(lambda d: [o for o in d.find_elements(By.CSS_SELECTOR, "#recipe li, ul.options li")
                                   if o.text.removeprefix("★ ").startswith("Speculative sampling")])
    option[0].click()
    wait.until(lambda _: "Recipe set" in status())
    checked = browser.find_element(By.CSS_SELECTOR, "input[type=radio][value=sd]")
    assert checked.is_selected(), "the method radio follows the recipe"
    wait.until(lambda d: any("draft chain length" in e.text for e in d.find_elements(By.TAG_NAME, "label")))
    browser.find_element(By.ID, "step-btn").click()
    wait.until(lambda _: "Step 0" in status())
    # speculative sampling with gamma 4 drafts one chain: 4 candidates (mcsd 4,2,2,1, the default, would show 44)
    def drawn_tree_title(driver):
        text = driver.find_element(By.ID, "tree-plot").text
        return text if "Step 0" in text else False

    assert "Step 0: 4 candidates" in wait.until(drawn_tree_title)


def _open_accordion(browser, label: str, content_css: str) -> None:
    """Open the accordion titled `label` and wait until `content_css` inside it is on the page. A click that
    lands before the page answers clicks is lost, and an update arriving just after it may close the accordion
    again, so whenever the button lacks Gradio's `open` class it is clicked again, half a second apart; a click
    that took is never repeated, as that would close it."""
    import time

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    xpath = f"//button[contains(@class, 'label-wrap')][contains(., '{label}')]"

    def opened(driver):
        button = driver.find_element(By.XPATH, xpath)
        if "open" in (button.get_attribute("class") or "").split():
            return driver.find_elements(By.CSS_SELECTOR, content_css)
        button.click()
        time.sleep(0.5)
        return False

    WebDriverWait(browser, WAIT_S, poll_frequency=0.05).until(opened)


def _set_slider(browser, elem_id: str, value) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = browser.find_element(By.CSS_SELECTOR, f"#{elem_id} input[type=number]")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(str(value), Keys.TAB)


def _shown_step(browser) -> int | None:
    """The step on show, from the scrubber's label 'Step on show: k (steps 0 to n)'."""
    import re

    from selenium.webdriver.common.by import By

    match = re.search(r"Step on show: (\d+)", browser.find_element(By.ID, "scrubber").text)
    return int(match.group(1)) if match else None


def test_run_keeps_pace_with_the_page_and_stop_ends_it(browser, explorer_url):
    """Run draws step after step; Stop ends it within a step (at most the step the page had already asked for
    follows the one on show), the status says so and stays idle (no step is drawn after it), and a second Stop
    says nothing is running instead of waiting for ever. On the way: a temperature
    typed above the slider's range is announced where it is typed, not silently replaced."""
    import time

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.05)
    browser.get(explorer_url)
    status = lambda: browser.find_element(By.ID, "status").text  # noqa: E731
    wait.until(ready.element_to_be_clickable((By.ID, "run-btn")))
    _open_accordion(browser, "Sampling", "#max-new-tokens input[type=number]")  # the accordion holding the budget
    _set_slider(browser, "max-new-tokens", 512)
    _set_slider(browser, "temperature", 5)  # above the slider's range: it is clamped, and the page says so
    note = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#temperature .clamp-note"))
    assert "5 is outside" in note[0].text and "set to 2" in note[0].text
    browser.find_element(By.ID, "run-btn").click()
    wait.until(lambda _: (_shown_step(browser) or 0) >= 3)
    assert "Running" in status()
    # the step on show when Stop is clicked, read in the same script as the click: nothing can come in between
    shown_at_stop = browser.execute_script(
        "const shown = document.getElementById('scrubber').innerText.match(/Step on show: (\\d+)/);"
        "document.getElementById('stop-btn').click();"
        "return shown ? Number(shown[1]) : null;")
    wait.until(lambda _: "Stopped after" in status())
    stopped_at = _shown_step(browser)
    steps = int(status().split("Stopped after ")[1].split(" steps")[0])
    assert stopped_at == steps - 1, "the page shows the last step the server took"
    assert shown_at_stop is not None and stopped_at <= shown_at_stop + 1, \
        f"Stop at step {shown_at_stop}: only the step already asked for may follow, the run went on to {stopped_at}"
    time.sleep(2.0)
    assert _shown_step(browser) == stopped_at and "Stopped after" in status(), "nothing runs after Stop"
    browser.find_element(By.ID, "stop-btn").click()
    wait.until(lambda _: "Nothing is running" in status())
    browser.find_element(By.ID, "step-btn").click()  # the stopped run continues one step
    wait.until(lambda _: f"Step {stopped_at + 1} took" in status())


def test_the_phone_layout_puts_step_and_the_results_in_reach(browser, explorer_url, tmp_path):
    """At 412 x 915 (a phone): Step is above the fold, the results start right below the status, every tab is a
    visible button, and the figures fit the screen's width. The screenshot is for a person to look at."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    browser.set_window_size(412, 915)
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(explorer_url)
    step = wait.until(ready.element_to_be_clickable((By.ID, "step-btn")))
    rect = lambda elem_id: browser.execute_script(  # noqa: E731
        "const r = document.getElementById(arguments[0]).getBoundingClientRect();"
        "return {top: r.top + window.scrollY, bottom: r.bottom + window.scrollY, right: r.right};", elem_id)
    viewport = browser.execute_script("return window.innerHeight")
    assert rect("step-btn")["bottom"] <= viewport, "Step is above the fold"
    concept = browser.find_element(By.CSS_SELECTOR, "#intro p")
    assert concept.is_displayed() and "Speculative decoding in one picture" in concept.text, "collapsed, not gone"
    closed = concept.size["height"]
    concept.click()
    assert concept.size["height"] > closed, "a tap opens the concept paragraph"
    concept.click()
    step.click()
    wait.until(lambda _: "Step 0:" in browser.find_element(By.ID, "tree-plot").text)
    assert rect("dynasd-text")["top"] - rect("status")["bottom"] < 200, "the results follow the status"
    assert rect("tree-plot")["right"] <= 412 + 1, "the tree fits the screen's width"
    reach = browser.execute_script("""
      const box = document.getElementById('tree-plot'), plot = box.querySelector('.js-plotly-plot');
      box.scrollLeft = box.scrollWidth;
      return {overflow: getComputedStyle(box).overflowX, scrolled: box.scrollLeft,
              plot: plot.getBoundingClientRect().right, box: box.getBoundingClientRect().right,
              cue: getComputedStyle(box, '::before').content};""")
    if reach["scrolled"] > 0:  # wider than the screen: every level is reached by scrolling sideways, as it says
        assert reach["overflow"] == "auto" and "Scroll sideways" in reach["cue"], reach
    assert reach["plot"] <= reach["box"] + 1, f"the tree's last level comes into view: {reach}"
    browser.execute_script("document.getElementById('tree-plot').scrollLeft = 0")
    tabs = [b.text for b in browser.find_elements(By.CSS_SELECTOR, "button[role=tab]") if b.is_displayed()]
    assert {"Decisions", "Summary", "Compare", "Trace"} <= set(tabs), tabs
    browser.execute_script("window.scrollTo(0, 0)")
    browser.save_screenshot(str(tmp_path / "phone-top.png"))
    browser.execute_script("document.getElementById('tree-plot').scrollIntoView()")
    browser.save_screenshot(str(tmp_path / "phone-tree.png"))
    browser.execute_script("document.getElementById('mask-plot').scrollIntoView()")
    browser.save_screenshot(str(tmp_path / "phone-mask.png"))
    print(f"phone screenshots: {tmp_path}")


def test_the_learn_tab_guides_a_step_phase_by_phase_and_shows_the_residual(browser, explorer_url, tmp_path):
    """At T = 1 on tiny-random, on a step that ended with a correction, the Learn tab explains the step on show.
    The guided step starts at phase 1 and moves with its buttons and the arrow keys (Shift+→ takes a step); the
    Learn views follow the step on show (a Step, a scrub, the end of a Run); the residual panel draws p, q and the
    residual at the rejection, and the acceptance test draws min(1, p/q) against u. The screenshots are for a
    person to look at."""
    import re

    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.05)
    browser.get(explorer_url)
    wait.until(ready.element_to_be_clickable((By.ID, "step-btn")))
    _open_accordion(browser, "Sampling", "#temperature input[type=number]")
    _set_slider(browser, "temperature", 1)
    text = lambda elem_id: browser.find_element(By.ID, elem_id).text  # noqa: E731
    for index in range(12):  # step until a step ends with a correction (about every other step here)
        browser.find_element(By.ID, "step-btn").click()
        wait.until(lambda _, index=index: f"Step {index} took" in text("status"))
        if "supplied a correction token" in text("story"):
            break
    else:
        pytest.fail("no step of 12 ended with a correction at T = 1")
    tab = next(b for b in browser.find_elements(By.CSS_SELECTOR, "button[role=tab]") if b.text.strip() == "Learn")
    tab.click()
    wait.until(lambda _: "Phase 1 of" in text("learn-phase-text"))
    phases = int(re.search(r"Phase 1 of (\d+)", text("learn-phase-text")).group(1))
    assert phases >= 4, "draft level(s), verify, at least one test, commit"
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#learn-guided-plot .js-plotly-plot"))
    assert f"Explaining step {index}" in text("learn-status")
    browser.execute_script("document.getElementById('learn-guided-plot').scrollIntoView()")
    browser.save_screenshot(str(tmp_path / "learn-phase-1.png"))

    browser.find_element(By.ID, "learn-next").click()
    wait.until(lambda _: "Phase 2 of" in text("learn-phase-text"))
    # the keys act when no input has the focus; a tree that fits the screen (no sideways scroll) leaves them to Learn
    focused = browser.execute_script("const tree = document.getElementById('tree-plot'); tree.focus();"
                                     "return document.activeElement === tree && tree.scrollWidth <= tree.clientWidth")
    assert focused, "the desktop tree takes the focus and does not scroll sideways"
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT).perform()
    wait.until(lambda _: "Phase 3 of" in text("learn-phase-text"))
    ActionChains(browser).send_keys(Keys.ARROW_LEFT).perform()
    wait.until(lambda _: "Phase 2 of" in text("learn-phase-text"))
    browser.find_element(By.ID, "learn-prev").click()
    wait.until(lambda _: "Phase 1 of" in text("learn-phase-text"))
    ActionChains(browser).key_down(Keys.SHIFT).send_keys(Keys.ARROW_RIGHT).key_up(Keys.SHIFT).perform()
    wait.until(lambda _: f"Step {index + 1} took" in text("status"))
    wait.until(lambda _: f"Explaining step {index + 1}" in text("learn-status"))  # the Learn views follow
    wait.until(lambda _: "Phase 1 of" in text("learn-phase-text"))
    _set_slider(browser, "scrubber", index)  # back to the step that ended with a correction
    wait.until(lambda _: f"Explaining step {index}" in text("learn-status"))

    inner = lambda label: next(b for b in browser.find_elements(By.CSS_SELECTOR, "button[role=tab]")  # noqa: E731
                               if b.text.strip() == label)
    inner("Residual").click()
    explained = wait.until(lambda _: text("learn-residual-text"))
    plot = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#learn-residual-plot .js-plotly-plot"))
    assert plot
    assert "walk rejected" in explained and "The correction was" in explained, explained
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#learn-residual-plot .bars .point"))
    legend = text("learn-residual-plot")
    assert "residual" in legend and "p" in legend and "q" in legend
    browser.execute_script("document.getElementById('learn-residual-plot').scrollIntoView()")
    browser.save_screenshot(str(tmp_path / "learn-residual.png"))
    inner("Acceptance test").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#learn-acceptance-plot .js-plotly-plot"))
    wait.until(lambda _: "u" in text("learn-acceptance-plot"))
    browser.execute_script("document.getElementById('learn-acceptance-plot').scrollIntoView()")
    browser.save_screenshot(str(tmp_path / "learn-acceptance.png"))
    browser.find_element(By.ID, "run-btn").click()  # a Run is followed once it ends (not at every step)
    wait.until(lambda _: "Done after" in text("status"))
    last = int(text("status").split("Done after ")[1].split(" steps")[0]) - 1
    wait.until(lambda _: f"Explaining step {last}." in text("learn-status"))
    print(f"learn screenshots: {tmp_path}")


def test_a_waiting_learner_sees_its_place_in_the_queue(browser, explorer_url, tmp_path):
    """Compares run one at a time (ui/layout.py COMPARE_CONCURRENCY): with other learners' Compares ahead of it, a
    learner's Compare says on its status line where it waits ("queue: 2/2"), the status text beside it legible,
    and then runs to the end. Without the display a waiting learner saw a status that looked frozen."""
    from gradio_client import Client
    from gradio_client.utils import Status
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(explorer_url)
    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.05)
    wait.until(lambda d: d.find_elements(By.ID, "step-btn"))
    tab = wait.until(lambda d: next((b for b in d.find_elements(By.CSS_SELECTOR, "button[role=tab]")
                                     if b.get_attribute("textContent").strip() == "Compare"), None))
    browser.execute_script("arguments[0].scrollIntoView(); arguments[0].click()", tab)
    button = wait.until(lambda d: d.find_elements(By.ID, "compare-btn"))[0]
    # Two other learners' Compares hold the lane (the first running) when this one is asked for; they are
    # cancelled once the place has been seen, so the test does not wait for them.
    ahead = [Client(explorer_url, verbose=False).submit(prompt="hello " * 8, pair="tiny-random", max_new_tokens=64,
                                                        api_name="/compare") for _ in range(2)]
    try:
        running = (Status.PROCESSING, Status.ITERATING, Status.PROGRESS)
        WebDriverWait(None, WAIT_S, poll_frequency=0.05).until(lambda _: ahead[0].status().code in running)
        button.click()
        status = lambda: browser.find_element(By.ID, "compare-status").text  # noqa: E731
        waiting = wait.until(lambda _: next((line for line in status().splitlines() if line.startswith("queue:")),
                                            None))
        assert re.fullmatch(r"queue: \d+/\d+( \| .*)?", waiting), waiting
        browser.save_screenshot(str(tmp_path / "compare-waiting.png"))
        assert "Comparing the methods" in status(), status()  # the status text stays on show beside the place
        opacity = browser.execute_script(
            "return getComputedStyle(document.querySelector('#compare-status .prose, #compare-status')).opacity")
        assert float(opacity) == 1.0, opacity
        for job in ahead:
            job.cancel()
        WebDriverWait(browser, 4 * WAIT_S).until(lambda _: "all methods compared" in status().lower())
        assert "queue:" not in status()
        print(f"screenshot: {tmp_path}")
    finally:
        for job in ahead:
            job.cancel()


def test_a_shared_link_opens_on_its_step(browser, explorer_url):
    """A link made by Learn → Share opens the page with its prompt and settings and shows its step, with no click."""
    from dataclasses import replace

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from dynasd.explorer.inputs import Settings
    from dynasd.explorer.sessions.share import link_query
    from ui.page_scripts import REPLAYING_LINK_JS

    settings = replace(Settings(), pair="tiny-random", max_new_tokens=12).normalised()
    browser.get(f"{explorer_url}?{link_query('hello', settings.controls(), 2)}")
    # what the status says the moment the page has loaded, before the server has replayed anything
    assert browser.execute_script(f"return ({REPLAYING_LINK_JS})('→ before');") == "→ Replaying to step 2…"
    wait = WebDriverWait(browser, WAIT_S)
    wait.until(lambda d: "Showing step 2" in d.find_element(By.ID, "status").text)
    wait.until(lambda d: "Step 2" in d.find_element(By.ID, "tree-plot").text)
    assert _shown_step(browser) == 2
    # the link beside the step slider: this prompt, these settings and the step on show
    browser.find_element(By.CSS_SELECTOR, "#step-link-btn").click()
    box = lambda d: d.find_element(By.CSS_SELECTOR, "#step-link textarea, #step-link input")  # noqa: E731
    wait.until(lambda d: "step=2" in (box(d).get_attribute("value") or ""))
    assert box(browser).get_attribute("value").startswith(explorer_url.rstrip("/"))
    assert "Link to this step" in browser.find_element(By.ID, "status").text


def test_a_long_new_prompt_is_announced_as_read_before_the_first_step(browser, explorer_url):
    """The page's script at Step/Run (READING_PROMPT_JS), run in the browser: a new prompt over the threshold gets
    "Reading the prompt (N characters)…", the same prompt again (the next Step) and a short one "Working…"."""
    import json

    from ui.page_scripts import LONG_PROMPT_CHARS, READING_PROMPT_JS

    browser.get(explorer_url)
    said = lambda prompt: browser.execute_script(f"return ({READING_PROMPT_JS})({json.dumps(prompt)});")  # noqa: E731
    long_prompt = "word " * (LONG_PROMPT_CHARS // 4)
    assert f"Reading the prompt ({len(long_prompt):,} characters)" in said(long_prompt)
    assert "Working on the next step" in said(long_prompt)
    assert "Working on the next step" in said("a short prompt")


# Every element that shows text of its own, with the ratio of its colour's luminance to its background's (WCAG 2.2
# contrast, the background found by walking up to the first opaque one, translucent layers blended on the way);
# text in a figure's SVG (Plotly's own colours), over an image or gradient (no single background) and colour swatches
# (a symbol whose label beside it is the text) are left out.
CONTRAST_JS = """
const parse = (c) => { const m = c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
  const v = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number); return [v[0], v[1], v[2], v.length > 3 ? v[3] : 1]; };
const lum = (c) => {
  const f = (x) => { x /= 255; return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4); };
  return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
const over = (top, below) => { const a = top[3];
  return [0, 1, 2].map((i) => top[i] * a + below[i] * (1 - a)).concat([1]); };
function background(el) {
  const layers = [];
  for (let e = el; e; e = e.parentElement) {
    const s = getComputedStyle(e);
    if (s.backgroundImage !== "none") return null;
    const c = parse(s.backgroundColor);
    if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
  }
  let colour = [255, 255, 255, 1];
  for (const layer of layers.reverse()) colour = over(layer, colour);
  return colour;
}
const failures = [];
for (const el of document.querySelectorAll("body *")) {
  if (el.closest("svg, script, style, noscript, option")) continue;
  const own = [...el.childNodes].filter((n) => n.nodeType === 3 && n.textContent.trim())
    .map((n) => n.textContent.trim());
  // a swatch (a coloured ● or ■ with no letter or digit) shows the colour that the label beside it names
  if (!own.length || !/[\\p{L}\\p{N}]/u.test(own.join(""))) continue;
  const r = el.getBoundingClientRect(), s = getComputedStyle(el);
  if (r.width === 0 || r.height === 0 || s.visibility === "hidden" || el.closest("[hidden]")) continue;
  let opacity = 1;
  for (let e = el; e; e = e.parentElement) opacity *= Number(getComputedStyle(e).opacity);
  if (opacity === 0 || el.closest("button:disabled, input:disabled, [aria-disabled=true]")) continue;
  const bg = background(el); if (!bg) continue;
  const fg = over(parse(s.color), bg);
  const a = lum(fg), b = lum(bg), ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  if (ratio < 4.5) failures.push(`${ratio.toFixed(2)}:1 ${s.color} on rgb(${bg.slice(0, 3).join(",")}) ` +
    `<${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""} class="${el.className}"> "${own.join(" ").slice(0, 60)}"`);
}
return failures;
"""


@pytest.mark.parametrize("width, height", [(1600, 1800), (412, 915)], ids=["desktop", "phone"])
def test_every_text_on_the_page_is_readable_against_its_background(browser, explorer_url, width, height):
    """WCAG 2.2 AA: every text at least 4.5:1 against what is behind it, on the page as it opens and after a Step
    (the Play tab's results and every control's help), at a desktop's width and a phone's."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    browser.set_window_size(width, height)
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(explorer_url)
    wait.until(ready.element_to_be_clickable((By.ID, "step-btn"))).click()
    wait.until(lambda _: "Step 0:" in browser.find_element(By.ID, "tree-plot").text)
    failures = browser.execute_script(CONTRAST_JS)
    assert not failures, f"{len(failures)} texts under 4.5:1:\n" + "\n".join(sorted(set(failures))[:40])

    # a slider's help spans its control (the prompt-lookup help was squeezed beside the slider's number box)
    browser.execute_script("[...document.querySelectorAll('button')].find((b) => b.textContent.trim()"
                           "  .startsWith('Advanced')).click()")
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#lookup .info-text").is_displayed())
    help_width, head_width = browser.execute_script(
        "const block = document.getElementById('lookup');"
        "return [block.querySelector('.info-text').getBoundingClientRect().width,"
        "        block.querySelector('.head').getBoundingClientRect().width];")
    assert help_width >= 0.95 * head_width, (help_width, head_width)


def test_compare_says_how_long_it_takes_counts_its_seconds_and_stops_between_rounds(browser, explorer_url):
    """Compare says up front how long it takes here (its last run's time; the first one here says it has none),
    shows the seconds spent with its rounds, and Stop Compare ends it between two rounds, keeping nothing."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(explorer_url)
    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.05)
    wait.until(lambda d: d.find_elements(By.ID, "step-btn"))
    box = browser.find_element(By.CSS_SELECTOR, "#prompt-box textarea")
    box.clear()
    box.send_keys("A prompt that only this test compares, to be stopped.")
    tab = wait.until(lambda d: next((b for b in d.find_elements(By.CSS_SELECTOR, "button[role=tab]")
                                     if b.get_attribute("textContent").strip() == "Compare"), None))
    browser.execute_script("arguments[0].scrollIntoView(); arguments[0].click()", tab)
    status = lambda: browser.find_element(By.ID, "compare-status").text  # noqa: E731
    wait.until(lambda d: d.find_elements(By.ID, "compare-btn"))[0].click()
    said = wait.until(lambda _: next((s for s in [status()] if "Stop Compare" in s and "Comparing" in s), None))
    assert "the first Compare here" in said or re.search(r"about \d+ s \(the last Compare here", said), said
    wait.until(lambda _: re.search(r"Round \d+: .* \d+ s so far", status()))
    browser.find_element(By.ID, "compare-stop-btn").click()
    wait.until(lambda _: "Compare stopped: nothing was kept" in status())
    time.sleep(3)  # a Compare that went on would say its next round by now
    assert "Compare stopped" in status() and "all methods compared" not in status().lower()
    assert not browser.find_elements(By.CSS_SELECTOR, "#compare-table tbody tr td"), "no table: nothing measured"


def test_where_would_it_pay_says_what_it_measures_how_far_it_got_and_stops_between_two_parts(
        browser, explorer_inprocess, monkeypatch, tmp_path):
    """Where would it pay? with no bigger target kept: it says up front what it measures (the first time here, no
    earlier one to time it by), then each part done with the seconds so far, and Stop measuring ends it between
    two parts: the page says so and draws nothing. The costs are kept in a cache folder of this test's own (the
    shared one is another worker's to write), the device's measured after the run's last step (a step on a busy
    machine may contradict them, and a calibration would then run first), and the bigger targets by a stand-in
    that holds each part until the page has been read: what is checked is the page, not those costs, nor how fast
    a browser polls a busy machine."""
    import threading

    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from dynasd.explorer.costs import measuring
    from dynasd.explorer.costs.cost import Conditions, MeasuredCosts
    from dynasd.explorer.costs.targets import BIGGER_TARGETS, target_costs_file
    from dynasd.explorer.inputs import Settings

    # the first part ends once the up-front line was read, the second once Stop was pressed (a part under way)
    read_ahead, stop_pressed = threading.Event(), threading.Event()
    holds = iter([read_ahead, stop_pressed])
    started = []

    def stand_in(shapes):
        started.extend(s.name for s in shapes)
        hold = next(holds, None)
        assert hold is None or hold.wait(WAIT_S), "the page was never read"
        return {s.name: MeasuredCosts({1: 0.02, 64: 0.2}, "2026-12-07 00:00", "the test's stand-in", "here",
                                      conditions=Conditions(0.1, 2, 1.0, 1.0)) for s in shapes}

    monkeypatch.setenv("DYNASD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(measuring, "measure_targets", stand_in)
    browser.get(explorer_inprocess.url)
    # a Markdown redrawn between finding it and reading it is read again at the next poll
    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.05, ignored_exceptions=(StaleElementReferenceException,))
    wait.until(lambda d: d.find_elements(By.ID, "step-btn"))[0].click()
    wait.until(lambda d: "Step 0" in d.find_element(By.ID, "status").text, "the first step")
    measuring.calibrate_context(explorer_inprocess.state.PAIRS, Settings(pair="tiny-random"), list(range(5, 40)))

    def tab(name: str) -> None:
        button = wait.until(lambda d: next((b for b in d.find_elements(By.CSS_SELECTOR, "button[role=tab]")
                                            if b.get_attribute("textContent").strip() == name), None))
        browser.execute_script("arguments[0].scrollIntoView(); arguments[0].click()", button)

    tab("Learn")
    tab("Where would it pay?")
    text = lambda: browser.find_element(By.ID, "where-text").text  # noqa: E731

    def until(condition, what: str):
        try:
            return wait.until(condition)
        except Exception as exc:
            raise AssertionError(f"waiting for {what}; the view says: {text()[:400]}") from exc

    wait.until(lambda d: d.find_elements(By.ID, "where-btn"))[0].click()
    said = until(lambda _: next((t for t in [text()] if "Stop measuring" in t), None), "the up-front line")
    read_ahead.set()
    assert said.startswith(f"→ Measuring {len(BIGGER_TARGETS)} bigger targets (SmolLM2-360M"), said
    assert "no earlier one to time it by" in said, said
    done = rf"Measuring the bigger targets: 1 of {len(BIGGER_TARGETS)} done, next \S+\. \d+ s so far"
    until(lambda _: re.search(done, text()), "the first part done")
    browser.find_element(By.ID, "where-stop-btn").click()
    until(lambda _: "Measuring stopped between two parts" in text(), "the stop said")
    stop_pressed.set()
    # the part under way when Stop was pressed finishes and is kept, in this test's cache before the test ends;
    # none after it starts
    kept = [target_costs_file(shape) for shape in BIGGER_TARGETS]
    deadline = time.monotonic() + WAIT_S
    while not kept[1].exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert kept[1].exists(), "the part under way at the stop was kept"
    time.sleep(3)  # a measurement that went on would have started its next part and drawn its figure by now
    assert "Measuring stopped" in text() and not browser.find_elements(By.CSS_SELECTOR, "#where-plot .main-svg")
    assert started == [shape.name for shape in BIGGER_TARGETS[:2]], "no part after the stop"
    browser.save_screenshot(str(tmp_path / "where-stopped.png"))
