"""A class in a real browser: the lecturer at desktop width starts a class and steps; two learners at phone width
join by the link, one with the keyboard alone; each sees the lecturer's step with its verdicts hidden and answers;
the lecturer sees the answers come in; a learner who reloads rejoins by name with their answer; the reveal reaches
both phones, and so does the class's end (the lecturer's reload: tests/test_classroom_app.py). Screenshots (for a
person to look at) go to pytest's temporary folder, or to docs/screenshots/ with DYNASD_SCREENSHOTS=1."""
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


@pytest.mark.slow(seconds=26)
def test_a_class_reaches_two_phones_and_counts_their_answers(browser, phones, explorer_url, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    screenshots = DOCS_SCREENSHOTS if os.environ.get("DYNASD_SCREENSHOTS") == "1" else tmp_path
    screenshots.mkdir(parents=True, exist_ok=True)
    text = lambda driver, elem_id: driver.find_element(By.ID, elem_id).text  # noqa: E731
    wait = lambda driver, until: WebDriverWait(driver, WAIT_S, poll_frequency=0.05).until(until)  # noqa: E731
    lecturer, (ana, ben) = browser, phones

    lecturer.get(explorer_url)
    wait(lecturer, lambda d: next((t for t in d.find_elements(By.CSS_SELECTOR, "button[role=tab]")
                                   if t.text.strip() == "Class"), None)).click()
    wait(lecturer, ready.element_to_be_clickable((By.ID, "class-start"))).click()
    code = wait(lecturer, lambda d: text(d, "class-code-big").strip())
    link = lecturer.find_element(By.CSS_SELECTOR, "#class-link a").get_attribute("href")
    assert link == f"{explorer_url}class?code={code}"
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
    tree_shape.send_keys("2,1")  # a small tree: four phones' worth of figures drawn on two cores stay quick
    lecturer.find_element(By.ID, "class-step").click()
    for phone in (ana, ben):
        wait(phone, lambda d: "Step 0" in text(d, "class-question") and "before the verify" in text(d, "class-tree"))
        assert text(phone, "class-outcome") == "" and "committed" not in text(phone, "class-story").lower()
    ana.save_screenshot(str(screenshots / "class-phone-before.png"))
    # Ana answers with the keyboard: Space picks the first choice, Tab goes on (past the other choices) to Answer
    ana.find_element(By.CSS_SELECTOR, "#class-choice input").send_keys(Keys.SPACE)
    answer = ana.find_element(By.ID, "class-answer-btn")
    for _ in range(12):
        if ana.switch_to.active_element == answer:
            break
        ana.switch_to.active_element.send_keys(Keys.TAB)
    ana.switch_to.active_element.send_keys(Keys.ENTER)
    ben.find_elements(By.CSS_SELECTOR, "#class-choice label")[-1].click()
    ben.find_element(By.ID, "class-answer-btn").click()
    for phone in (ana, ben):
        wait(phone, lambda d: "is in" in text(d, "class-learner-status"))
    wait(lecturer, lambda d: "2 of 2 answered" in text(d, "class-status") and "2 of 2 answered" in
         text(d, "class-answers"))
    lecturer.execute_script("document.getElementById('class-tab').scrollIntoView()")
    lecturer.save_screenshot(str(screenshots / "class-lecturer-answers.png"))

    ben.refresh()  # a reload rejoins by the name the browser kept, with the answer given
    wait(ben, lambda d: "your answer to step 0 is in" in text(d, "class-learner-status"))
    assert not [e for e in ben.find_elements(By.ID, "class-join-btn") if e.is_displayed()], "joined: no join box"

    lecturer.find_element(By.ID, "class-reveal").click()
    for phone in (ana, ben):
        wait(phone, lambda d: "revealed" in text(d, "class-learner-status") and "Your score" in
             text(d, "class-learner-status"))
        assert ("Right" in text(phone, "class-outcome")) != ("Not quite" in text(phone, "class-outcome"))
        assert "committed" in text(phone, "class-story").lower()
        assert not phone.find_element(By.ID, "class-answer-btn").is_enabled(), "answers closed at the reveal"
    ana.save_screenshot(str(screenshots / "class-phone-after.png"))
    wait(lecturer, lambda d: "right answer is" in text(d, "class-answers"))

    lecturer.find_element(By.ID, "class-end").click()
    for phone in (ana, ben):
        wait(phone, lambda d: "the class has ended" in text(d, "class-learner-status"))
