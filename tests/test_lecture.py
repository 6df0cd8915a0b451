"""Lecture mode: the page's keys step, reveal, go back and run; a new step's verdicts stay hidden until the
presenter reveals them (a reveal is kept with the run, never scored); the keys are written on the page."""
import pytest
from test_browser import WAIT_S, browser  # noqa: F401  (the browser fixture)

from dynasd.explorer.lessons import predict
from dynasd.explorer.sessions.share import load_example


def test_a_presenters_reveal_is_kept_and_not_scored():
    run = load_example("sd-sampled")
    predict.predict(run, 0, predict.COMMIT, len(run.steps[0].committed))
    predict.reveal(run, 1)
    predict.reveal(run, 1)  # once is enough
    assert predict.guessed(run, 1) is not None and len(run.predictions) == 2
    assert predict.score(run) == (1, 1)


@pytest.mark.browser
@pytest.mark.slow(seconds=13)
def test_lecture_keys_step_reveal_back_and_run(browser, explorer_url):  # noqa: F811
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.05)
    browser.get(explorer_url)
    text = lambda elem_id: browser.find_element(By.ID, elem_id).text  # noqa: E731
    keys = lambda *k: ActionChains(browser).send_keys(*k).perform()  # noqa: E731
    wait.until(ready.element_to_be_clickable((By.CSS_SELECTOR, "#lecture-mode input"))).click()
    wait.until(lambda _: "Lecture mode:" in text("status"))
    assert browser.execute_script("return document.body.classList.contains('dynasd-lecture')")
    assert "V reveal" in text("lecture-keys") or "reveal the step on show" in text("lecture-keys")
    assert not browser.find_element(By.ID, "settings-column").is_displayed()
    browser.find_element(By.TAG_NAME, "body").click()
    keys(Keys.ARROW_RIGHT)
    wait.until(lambda _: "predict first" in text("story") and "before the verify" in text("tree-plot"))
    keys("v")
    wait.until(lambda _: "Step 0 revealed" in text("status") and "Step 0." in text("story"))
    keys("n")
    wait.until(lambda _: "Step 1: predict first" in text("story"))
    keys("v")
    wait.until(lambda _: "Step 1." in text("story"))
    keys(Keys.ARROW_LEFT)
    wait.until(lambda _: "Back to step 0" in text("status") and "Step 0." in text("story"))
    keys("r")
    wait.until(lambda _: "Done after" in text("status"))
    keys(Keys.ESCAPE)
    wait.until(lambda _: not browser.execute_script("return document.body.classList.contains('dynasd-lecture')"))
    wait.until(lambda _: browser.find_element(By.ID, "settings-column").is_displayed())
