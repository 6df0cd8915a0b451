"""What a learner sees, in a real headless Chromium on the shared explorer (tiny-random): the phone page reads (no
help squeezed into a column of single letters, a bounded page), every status carries a glyph, the mask's hover
names a cell's row and column exactly as its axes do, the cost view measures this device by default and says so,
and every control shows a focus ring. One browser for the module; the screenshots (for a person, not the test) go
to pytest's temporary folder."""
import pytest
from test_browser import headless_chromium

from viz.style import STATUS_GLYPHS

pytestmark = pytest.mark.browser

WAIT_S = 90
PHONE = (412, 915)
READABLE_PX = 240  # a text column narrower than this reads as a few words a line at best
# the page with a run on show, at its longest tab (it was 15,000-32,000 px; 9,000 before the step's link row beside
# the step slider added ~90)
PHONE_PAGE_PX = 9200


@pytest.fixture(scope="module")
def browser():
    yield from headless_chromium("1440,900")


def _two_steps(browser, explorer_url, size):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    browser.set_window_size(*size)
    browser.get(explorer_url)
    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.1)
    status = lambda: browser.find_element(By.ID, "status").text  # noqa: E731
    for index in range(2):
        wait.until(ready.element_to_be_clickable((By.ID, "step-btn"))).click()
        wait.until(lambda _, index=index: f"Step {index} took" in status())
    wait.until(lambda d: "Step 1:" in d.find_element(By.ID, "tree-plot").text
               and "Step 1:" in d.find_element(By.ID, "mask-plot").text)
    return wait


def _tab(browser, label):
    from selenium.webdriver.common.by import By

    button = next(b for b in browser.find_elements(By.CSS_SELECTOR, "button[role=tab]") if b.text.strip() == label)
    browser.execute_script("arguments[0].scrollIntoView()", button)
    button.click()


@pytest.mark.slow(seconds=12)
def test_the_phone_page_reads_beside_every_figure(browser, explorer_url, tmp_path):
    """At 412 x 915, in every tab, no help text is narrower than a readable column, nothing is wider than the
    screen, and the page's height stays bounded."""
    import time

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _two_steps(browser, explorer_url, PHONE)
    narrowest_help = """
      const widths = [...document.querySelectorAll('.explain')].filter((e) => e.offsetParent !== null)
        .map((e) => e.getBoundingClientRect().width);
      return widths.length ? Math.min(...widths) : null;"""
    for label in ("Decisions", "Summary", "Compare", "Trace"):
        _tab(browser, label)
        time.sleep(0.5)  # the tab's layout settles
        width = browser.execute_script(narrowest_help)
        assert width is not None and width >= READABLE_PX, f"{label}: a help column {width} px wide"
        height = browser.execute_script("return document.body.scrollHeight")
        assert height <= PHONE_PAGE_PX, f"{label}: the page is {height} px long"
        overflow = browser.execute_script("return document.documentElement.scrollWidth")
        assert overflow <= PHONE[0] + 1, f"{label}: the page is {overflow} px wide on a {PHONE[0]} px screen"
        browser.save_screenshot(str(tmp_path / f"phone-{label}.png"))
    _tab(browser, "Compare")  # a filled table is wider than the screen: it scrolls, the page does not
    browser.find_element(By.ID, "compare-btn").click()
    WebDriverWait(browser, WAIT_S).until(
        lambda d: "all methods compared" in d.find_element(By.ID, "compare-status").text.lower())
    right = browser.execute_script("return document.getElementById('results-column').getBoundingClientRect().right")
    assert right <= PHONE[0] + 1, f"with Compare's table the results reach {right} px on a {PHONE[0]} px screen"
    print(f"phone screenshots: {tmp_path}")


def test_every_status_has_a_glyph_and_the_mask_hover_names_the_axes(browser, explorer_url):
    """The page names its machine. The tree's legend names every
    status with its glyph and every drawn node carries one; hovering a mask cell names its row as the row label
    reads and its column by the node's id and token, in words, not codes."""
    from selenium.webdriver.common.by import By

    from dynasd.device_info import cpu_model

    _two_steps(browser, explorer_url, (1440, 900))
    assert cpu_model() in browser.find_element(By.ID, "device-line").text, "the page names its machine"
    legend = browser.execute_script(
        "return [...document.querySelectorAll('#tree-plot .legendtext')].map((e) => e.textContent);")
    statuses = [text for text in legend if text not in ("committed path",)]
    assert statuses and all(text[0] in STATUS_GLYPHS.values() for text in statuses), legend
    glyphs = browser.execute_script(
        "const box = document.querySelector('#tree-plot .dynasd-figure');"
        "const trace = box.data.find((t) => t.name === 'status glyphs');"
        "const nodes = box.data.filter((t) => t.customdata).reduce((n, t) => n + t.x.length, 0);"
        "return [trace ? trace.text : [], nodes];")
    assert glyphs[1] > 0 and len(glyphs[0]) >= glyphs[1], "every node carries its status glyph"

    hovered = browser.execute_script("""
      const box = document.querySelector('#mask-plot .dynasd-figure');
      const heat = box.data[0];
      const drawn = [...box.querySelectorAll('.scatterlayer .trace')].map((t) => t.querySelectorAll('.textpoint text'))
        .find((texts) => texts.length === heat.y.length);  // the row labels, as the page drew them
      const row = heat.y.length - 2, column = heat.x.length - 3;
      window.dynasdPlotly.Fx.hover(box, {xval: column, yval: row}, 'xy');  // category axes: by index
      const text = [...box.querySelectorAll('.hoverlayer .hovertext')].map((e) => e.textContent).join(' ');
      const tick = box.layout.xaxis.ticktext[box.layout.xaxis.tickvals.indexOf(heat.x[column])];
      return {text, rowLabel: drawn[row].textContent, column: heat.x[column], tick};""")
    text = hovered["text"]
    assert text.startswith(_plain(hovered["rowLabel"])), hovered
    assert _plain(hovered["column"]) in text, hovered
    assert "may attend: " in text and not any(code in text for code in ("0 blocked", "1 attends")), hovered
    assert hovered["tick"] is None or _plain(hovered["column"]).lstrip("✓ ").startswith(hovered["tick"] + "·")


def _plain(label: str) -> str:
    import html

    return html.unescape(label)


def test_every_control_shows_a_focus_ring(browser, explorer_url):
    """Keyboard focus on the step slider, the buttons, the tabs and the text boxes draws a visible outline."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    _two_steps(browser, explorer_url, (1440, 900))
    ActionChains(browser).send_keys(Keys.SHIFT).perform()  # the last interaction is the keyboard's
    missing = browser.execute_script("""
      const controls = [...document.querySelectorAll(
          '#scrubber input[type=range], button, input, textarea, [role=tab]')]
        .filter((e) => e.offsetParent !== null && !e.disabled).slice(0, 60);
      const without = [];
      for (const control of controls) {
        control.focus();
        if (document.activeElement !== control) continue;
        const style = getComputedStyle(control);
        if (style.outlineStyle === 'none' || parseFloat(style.outlineWidth) < 2)
          without.push(control.id || control.getAttribute('aria-label') || control.outerHTML.slice(0, 80));
      }
      return [controls.length, without];""")
    checked, without = missing
    assert checked >= 10 and without == [], without


def test_the_cost_view_measures_this_device_by_default(browser, explorer_url):
    """Learn → Cost model with the default settings: the costs are this device's, measured (now or kept from an
    earlier measurement), said with when and how; nothing is called measured that is modelled."""
    from selenium.webdriver.common.by import By

    wait = _two_steps(browser, explorer_url, (1440, 900))
    _tab(browser, "Learn")
    _tab(browser, "Cost model")
    again = browser.find_element(By.XPATH, "//label[contains(., 'measure this device again')]//input")
    assert not again.is_selected(), "measuring is the default; the box only asks to measure again"
    browser.find_element(By.ID, "learn-cost-btn").click()
    text = wait.until(lambda d: d.find_element(By.ID, "learn-cost-text").text or False)
    assert "costs measured on this device" in text.lower(), text
    assert " UTC: the median of 5 interleaved rounds of target and draft forwards" in text, text
    assert "modelled" not in text.lower(), "nothing modelled is said measured"
    # the one speed-up called measured is Compare's, when a Compare of this prompt and settings is kept here
    assert "× ar, measured by Compare" in text or "Not measured yet" in text, text
    status = browser.find_element(By.ID, "learn-status").text
    assert "measured now on this device" in status or "kept from an earlier measurement" in status, status
