"""Predict, then reveal: a guess is scored against the recorded step (the right answer and why from the trace's
own numbers), kept in the run, saved and restored with its trace, answered through the `predict` API on a replayed
example with no model, and played in a real browser (toggle, Step, guess, Reveal, score)."""
import json

import pytest
from test_browser import WAIT_S, browser  # noqa: F401  (the browser fixture)

from dynasd.explorer.inputs import UserError
from dynasd.explorer.lessons import predict
from dynasd.explorer.sessions.share import load_example
from dynasd.trace import TraceError, load_run, run_from_dict, run_to_dict, save_run

OUT = dict(reveal=10, score=11)  # after the 10 views (the session state is not sent)


def test_a_commit_guess_is_scored_against_the_tokens_the_step_committed():
    run = load_example("mcsd-greedy")
    answer = len(run.steps[0].committed)
    wrong = predict.predict(run, 0, predict.COMMIT, answer + 1)
    assert not wrong.correct and f"committed {answer} token(s)" in wrong.answer and "+ 1 =" in wrong.why
    right = predict.predict(run, 1, predict.COMMIT, len(run.steps[1].committed))
    assert right.correct and (right.right, right.asked) == (1, 2)
    again = predict.predict(run, 0, predict.COMMIT, answer)  # a second guess does not replace the first
    assert again.repeated and not again.correct and predict.score(run) == (1, 2)


def test_a_node_guess_names_u_and_the_threshold_from_the_trace():
    run = load_example("sd-sampled")
    step = run.steps[1]
    for node in predict.tested_nodes(step):
        n = step.nodes[node]
        question = predict.node_question(step, node)
        assert f"{n.p_test:.3f}" in question and f"{n.q_test:.3f}" in question and f"{n.u:.3f}" not in question
        reveal = predict.predict(run, 1, node, 1)
        assert reveal.correct == (n.status in ("accepted", "unchosen")) and f"u = {n.u:.3f}" in reveal.why
    with pytest.raises(UserError, match="was not tested"):
        untested = next(i for i in range(len(step.nodes)) if i not in predict.tested_nodes(step))
        predict.predict(run, 1, untested, 1)
    with pytest.raises(UserError, match="no step"):
        predict.predict(run, len(run.steps), predict.COMMIT, 1)


def test_guesses_travel_with_the_saved_trace_and_bad_ones_are_refused(tmp_path):
    run = load_example("sd-sampled")
    predict.predict(run, 2, predict.COMMIT, 1)
    predict.predict(run, 1, predict.tested_nodes(run.steps[1])[0], 0)
    save_run(run, tmp_path / "run.json")
    loaded = load_run(tmp_path / "run.json")
    assert loaded.predictions == run.predictions and predict.score(loaded) == predict.score(run)
    assert predict.guessed(loaded, 2) is not None
    data = run_to_dict(run)
    data["predictions"][0]["step"] = len(run.steps)
    with pytest.raises(TraceError, match="prediction names step"):
        run_from_dict(json.loads(json.dumps(data)))


def test_the_predict_api_reveals_a_replayed_example_with_no_model(explorer_url):
    from gradio_client import Client

    client = Client(explorer_url, verbose=False)
    client.predict("sd-sampled", api_name="/replay_example")
    views = client.predict(3, -1, 1, api_name="/predict")
    run = load_example("sd-sampled")
    assert f"step 3 committed {len(run.steps[3].committed)} token(s)" in views[OUT["reveal"]]
    assert "of 1" in views[OUT["score"]]
    bad = client.predict(3, -1, None, api_name="/predict")
    assert "type your guess first" in bad[OUT["reveal"]]


@pytest.mark.browser
def test_play_hides_the_verdicts_until_the_guess_is_revealed(browser, explorer_url):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.05)
    browser.get(explorer_url)
    text = lambda elem_id: browser.find_element(By.ID, elem_id).text  # noqa: E731
    wait.until(ready.element_to_be_clickable((By.CSS_SELECTOR, "#predict-first input"))).click()
    wait.until(lambda _: "Predict first" in text("status"))
    browser.find_element(By.ID, "step-btn").click()
    wait.until(lambda _: "predict first" in text("story"))
    wait.until(lambda _: "before the verify" in text("tree-plot"))
    box = browser.find_element(By.CSS_SELECTOR, "#predict-guess input")
    box.send_keys("2")
    browser.find_element(By.ID, "predict-reveal").click()
    wait.until(lambda _: "committed" in text("predict-reveal-text"))
    assert text("predict-reveal-text")[0] in "✓✗"
    assert "1 of 1" in text("predict-score") or "0 of 1" in text("predict-score")
    wait.until(lambda _: "Step 0" in text("story") and "predict first" not in text("story"))
