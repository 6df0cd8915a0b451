"""A class in a real browser: the lecturer at desktop width starts a class (the app listens on the loopback only, so
the page says phones cannot open the link, and how to open the class to the room) and asks which candidate is
rejected first; two learners at phone width join by the link, one with the keyboard alone; each sees the lecturer's
step with its verdicts hidden, the whole tree in reach (it scrolls sideways); one answers by tapping a candidate on
the tree; the lecturer sees the answers come in; a learner who reloads comes back as themselves with their answer;
the lecturer opens a second vote, both answer again and the bars show both votes; the reveal reaches both phones;
the results download as CSV, without names when asked; and the class's end reaches both phones (the lecturer's
reload: tests/test_classroom_app.py). Screenshots (for a person to look at) go to pytest's temporary folder, or to
docs/screenshots/ with DYNASD_SCREENSHOTS=1."""
import csv
import io
import os

import pytest
from test_browser import DOCS_SCREENSHOTS, WAIT_S, browser, headless_chromium  # noqa: F401 (the browser fixture)

pytestmark = pytest.mark.browser


@pytest.fixture
def phones():
    first, second = headless_chromium("412,915"), headless_chromium("412,915")
    try:
        yield next(first), next(second)
    finally:
        first.close()
        second.close()


# Where each candidate of the learner's tree is on the screen (page pixels), from the figure plotly.js drew
NODE_POINTS_JS = """
const box = document.querySelector('#class-tree .dynasd-figure');
const layout = box._fullLayout, points = [];
box._fullData.forEach((trace) => (trace.customdata || []).forEach((node, i) => {
  if (node === null || node === undefined) return;
  const rect = box.getBoundingClientRect();
  points.push({node: Number(node), x: rect.left + layout.xaxis._offset + layout.xaxis.d2p(trace.x[i]),
               y: rect.top + layout.yaxis._offset + layout.yaxis.d2p(trace.y[i])});
}));
return points;
"""


@pytest.mark.slow(seconds=40)
def test_a_class_reaches_two_phones_and_counts_their_answers(browser, phones, explorer_url, tmp_path):  # noqa: F811
    from selenium.common.exceptions import ElementClickInterceptedException, StaleElementReferenceException
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    screenshots = DOCS_SCREENSHOTS if os.environ.get("DYNASD_SCREENSHOTS") == "1" else tmp_path
    screenshots.mkdir(parents=True, exist_ok=True)
    text = lambda driver, elem_id: driver.find_element(By.ID, elem_id).text  # noqa: E731
    # an element the page redraws between finding and reading it is looked for again
    wait = lambda driver, until: WebDriverWait(driver, WAIT_S, poll_frequency=0.05,  # noqa: E731
                                               ignored_exceptions=[StaleElementReferenceException]).until(until)
    lecturer, (ana, ben) = browser, phones

    # a person's click, tried again while the page still lays itself out (a text drawn over a button for a moment)
    click = lambda driver, element: WebDriverWait(  # noqa: E731
        driver, WAIT_S, poll_frequency=0.1, ignored_exceptions=[ElementClickInterceptedException]).until(
        lambda _: element.click() or True)
    lecturer.get(explorer_url)
    click(lecturer, wait(lecturer, lambda d: next((t for t in d.find_elements(By.CSS_SELECTOR, "button[role=tab]")
                                                   if t.text.strip() == "Class"), None)))
    click(lecturer, wait(lecturer, ready.element_to_be_clickable((By.ID, "class-start"))))
    code = wait(lecturer, lambda d: text(d, "class-code-big").strip())
    link = lecturer.find_element(By.CSS_SELECTOR, "#class-link a").get_attribute("href")
    assert link == f"{explorer_url}class?code={code}", "the app listens on 127.0.0.1: the page's own address"
    warning = text(lecturer, "class-address-warning")
    assert "Phones cannot open this link" in warning and "--host 0.0.0.0" in warning
    lecturer.execute_script("document.getElementById('class-tab').scrollIntoView()")
    lecturer.save_screenshot(str(screenshots / "class-lecturer-address-warning.png"))
    assert lecturer.find_element(By.CSS_SELECTOR, "#class-qr svg title").get_attribute("textContent").endswith(link)
    navbar = lambda driver: [e for e in driver.find_elements(By.CSS_SELECTOR, ".nav-holder") if e.is_displayed()]  # noqa: E731
    assert not navbar(lecturer), "the learner's route adds no navbar to the lecturer's page"

    for phone in (ana, ben):
        phone.get(link)
        wait(phone, lambda d: d.find_element(By.CSS_SELECTOR, "#class-code-box input, #class-code-box textarea")
             .get_attribute("value") == code)
    # Ana joins with the keyboard alone: Tab to the name box, type, Enter
    ana.find_element(By.CSS_SELECTOR, "#class-code-box input, #class-code-box textarea").send_keys(Keys.TAB, "Ana",
                                                                                                  Keys.ENTER)
    ben.find_element(By.CSS_SELECTOR, "#class-name-box input, #class-name-box textarea").send_keys("Ben")
    ben.find_element(By.ID, "class-join-btn").click()
    for phone in (ana, ben):
        wait(phone, lambda d: "waiting for the lecturer" in text(d, "class-learner-status"))
    assert "Ana" not in text(ben, "class-page") and "Ben" not in text(ana, "class-page"), "no one else's name"
    assert not navbar(ana), "a learner has no way to the lecturer's page"

    tree_shape = lecturer.find_element(By.CSS_SELECTOR, "#k-config input, #k-config textarea")
    tree_shape.clear()
    tree_shape.send_keys("2,2,1")  # a tree with levels off a phone's width
    next(e for e in lecturer.find_elements(By.CSS_SELECTOR, "#class-ask label")
         if "rejected first" in e.text).click()
    wait(lecturer, lambda d: "asks: Which candidate is rejected first?" in text(d, "class-status"))
    lecturer.find_element(By.ID, "class-step").click()
    for phone in (ana, ben):
        wait(phone, lambda d: "Step 0" in text(d, "class-question") and "before the verify" in text(d, "class-tree"))
        assert text(phone, "class-outcome") == "" and "committed" not in text(phone, "class-story").lower()
        labels = [e.text for e in phone.find_elements(By.CSS_SELECTOR, "#class-choice label")]
        assert 2 <= len(labels) <= 6 and labels[-1].startswith("none"), "a short list, not every candidate"
    tree = ana.find_element(By.ID, "class-tree")
    wide = ana.execute_script("const t = arguments[0]; return [t.scrollWidth, t.clientWidth, "
                              "getComputedStyle(t).overflowX, getComputedStyle(t, '::before').content]", tree)
    assert wide[0] > wide[1] and wide[2] == "auto" and "Scroll sideways" in wide[3], wide
    ana.execute_script("arguments[0].scrollIntoView({block: 'center'})", tree)
    ana.execute_script("arguments[0].scrollLeft = arguments[0].scrollWidth", tree)
    assert ana.execute_script("return arguments[0].scrollLeft", tree) > 0, "every level is in reach"
    ana.save_screenshot(str(screenshots / "class-phone-tree-scrolled.png"))
    ana.execute_script("arguments[0].scrollLeft = 0", tree)
    ana.save_screenshot(str(screenshots / "class-phone-tree.png"))
    ana.execute_script("window.scrollTo(0, 0)")
    ana.save_screenshot(str(screenshots / "class-phone-before.png"))
    # Ana taps the first candidate on the tree (a real pointer event at its marker), then answers with the
    # keyboard: Tab goes on (past the other choices) to Answer
    listed = {int(e.text.split()[1]) for e in ana.find_elements(By.CSS_SELECTOR, "#class-choice label")
              if e.text.startswith("node ")}
    ana.execute_script("arguments[0].scrollIntoView({block: 'center'})", tree)
    point = next(p for p in ana.execute_script(NODE_POINTS_JS) if p["node"] in listed)
    tap = ActionBuilder(ana)
    tap.pointer_action.move_to_location(int(point["x"]), int(point["y"]))
    tap.pointer_action.click()
    tap.perform()
    wait(ana, lambda d: f"You chose node {point['node']}" in text(d, "class-tap-hint"))
    chosen = ana.find_element(By.CSS_SELECTOR, "#class-choice input:checked")
    assert chosen.find_element(By.XPATH, "..").text.startswith(f"node {point['node']} ")
    answer = ana.find_element(By.ID, "class-answer-btn")
    chosen.send_keys(Keys.TAB)
    for _ in range(12):
        if ana.switch_to.active_element == answer:
            break
        ana.switch_to.active_element.send_keys(Keys.TAB)
    ana.switch_to.active_element.send_keys(Keys.ENTER)
    ben.find_elements(By.CSS_SELECTOR, "#class-choice label")[-1].click()
    ben.find_element(By.ID, "class-answer-btn").click()
    for phone in (ana, ben):
        wait(phone, lambda d: "is in" in text(d, "class-learner-status"))
    assert f"node {point['node']}" in text(ana, "class-learner-status"), "the tapped candidate was the answer"
    wait(lecturer, lambda d: "2 of 2 answered" in text(d, "class-status") and "2 of 2 answered" in
         text(d, "class-answers"))
    lecturer.execute_script("document.getElementById('class-tab').scrollIntoView()")
    lecturer.save_screenshot(str(screenshots / "class-lecturer-answers.png"))

    ben.refresh()  # a reload mid-round: the browser's rejoin token brings Ben back, with the answer given
    wait(ben, lambda d: "your answer to step 0 is in" in text(d, "class-learner-status"))
    assert not [e for e in ben.find_elements(By.ID, "class-join-btn") if e.is_displayed()], "joined: no join box"
    assert "another tab" in text(ben, "class-you")
    first_tab = ben.current_window_handle
    ben.switch_to.new_window("tab")  # a second tab of Ben's browser is Ben, with his answer: one vote each
    ben.get(link)
    wait(ben, lambda d: "your answer to step 0 is in" in text(d, "class-learner-status") and "Ben" in
         text(d, "class-you"))
    ben.close()
    ben.switch_to.window(first_tab)

    lecturer.find_element(By.ID, "class-second-vote").click()  # peer instruction: discuss, then vote again
    for phone in (ana, ben):
        wait(phone, lambda d: "Second vote" in text(d, "class-question") and d.find_element(
            By.ID, "class-answer-btn").is_enabled())
        phone.find_elements(By.CSS_SELECTOR, "#class-choice label")[0].click()
        phone.find_element(By.ID, "class-answer-btn").click()
        wait(phone, lambda d: "in the second vote is in" in text(d, "class-learner-status"))
    wait(lecturer, lambda d: "2 of 2 answered, 2 in the second vote" in text(d, "class-answers") and "2nd vote" in
         text(d, "class-answers") and "2 of 2 in the second vote" in text(d, "class-status"))
    lecturer.execute_script("document.getElementById('class-answers').scrollIntoView()")
    lecturer.save_screenshot(str(screenshots / "class-lecturer-two-votes.png"))

    lecturer.find_element(By.ID, "class-reveal").click()
    for phone in (ana, ben):
        wait(phone, lambda d: "revealed" in text(d, "class-learner-status") and "Your score" in
             text(d, "class-learner-status"))
        assert ("Right" in text(phone, "class-outcome")) != ("Not quite" in text(phone, "class-outcome"))
        assert "committed" in text(phone, "class-story").lower()
        assert not phone.find_element(By.ID, "class-answer-btn").is_enabled(), "answers closed at the reveal"
    ana.save_screenshot(str(screenshots / "class-phone-after.png"))
    wait(lecturer, lambda d: "right answer is" in text(d, "class-answers"))

    for without_names in (False, True):
        if without_names:
            lecturer.find_element(By.CSS_SELECTOR, "#class-no-names input").click()
        lecturer.find_element(By.ID, "class-export").click()
        wanted = "no-names.csv" if without_names else f"{code}-results.csv"
        href = wait(lecturer, lambda d: next((a.get_attribute("href") for a in d.find_elements(
            By.CSS_SELECTOR, "#class-results a") if (a.get_attribute("href") or "").endswith(wanted)), None))
        body = lecturer.execute_script("return await (await fetch(arguments[0])).text()", href)
        rows = list(csv.DictReader(io.StringIO(body)))
        answers = [r for r in rows if r["kind"] == "answer"]
        assert len(answers) == 2 and all(r["first_vote"] and r["second_vote"] and r["right_answer"]
                                         for r in answers), body
        learners = {r["learner"] for r in rows}
        assert learners == ({"learner 1", "learner 2"} if without_names else {"Ana", "Ben"}), learners

    lecturer.find_element(By.ID, "class-end").click()
    for phone in (ana, ben):
        wait(phone, lambda d: "the class has ended" in text(d, "class-learner-status"))
