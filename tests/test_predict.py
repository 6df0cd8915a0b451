"""Predict, then reveal: a guess is scored against the recorded step (the right answer and why from the trace's
own numbers), kept in the run, saved and restored with its trace, answered through the `predict` API on a replayed
example with no model, and played in a real browser (toggle, Step, guess, Reveal, score). Before the reveal no view
of the step tells its answer (the step's views, its text, story, Summary and figure titles, the KV cache tab), and
a step once seen stays seen."""
import json
import re
from dataclasses import replace

import pytest
from test_browser import WAIT_S, browser  # noqa: F401  (the browser fixture)

from dynasd.explorer.inputs import Settings, UserError
from dynasd.explorer.lessons import predict
from dynasd.explorer.lessons.ledger import run_ledger
from dynasd.explorer.lessons.phases import draft_stages
from dynasd.explorer.pairs import PairCache
from dynasd.explorer.sessions.calls import in_process
from dynasd.explorer.sessions.controller import Controller
from dynasd.explorer.sessions.session import Mode, Session
from dynasd.explorer.sessions.share import example_traces, load_example
from dynasd.trace import TraceError, load_run, run_from_dict, run_to_dict, save_run
from ui.learn_views import LearnViews
from ui.ledger import ledger_views
from ui.views import FIGURES, step_on_page
from viz.style import STATUS_NAMES
from viz.text import step_story

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


# -- before the reveal, no view tells the answer ---------------------------------------------------------------------

VERDICTS = [STATUS_NAMES[s] for s in ("accepted", "rejected", "bonus", "correction", "skipped", "not_reached",
                                      "unchosen")]


def views_of(run, index: int) -> dict:
    """Everything the page is sent for step `index` of `run` with predictions on, by view: the step's views
    (ui/views.py; a fresh session each time, so that no figure is left out as already on the page) and the KV cache
    tab's (ui/ledger.py)."""
    session = Session("views")
    session.run, session.mode, session.predict_first = run, Mode.REPLAYING, True
    said = Controller(session, None).show_step(index).said  # a replay runs no model
    shown, ledger = step_on_page(session, index, said), ledger_views(session, index)
    learn = [LearnViews.of(session, index, at) for at in range(len(run.steps[index].nodes) + 12)]  # past the last
    return {"text": shown["text"].value, **{name: shown[name] or "" for name in FIGURES},
            "summary": shown["summary"], "story": shown["story"], "status": shown["status"],
            "scrubber": shown["scrubber"].label, "ledger": ledger.figure.to_json(), "ledger words": ledger.text,
            "guided": [view.guided.to_json() for view in learn], "phases": [view.phase_text for view in learn],
            "phase count": sorted({view.phase.maximum for view in learn}),
            "learn": [[view.residual and view.residual.to_json(), view.residual_text,
                       view.acceptance and view.acceptance.to_json()] for view in learn]}


def answer_patterns(run, index: int) -> dict[str, str]:
    """What tells step `index`'s answer, by name, in the words the views use: how many tokens it committed and how
    many of them were accepted candidates, its committed tokens, the ledger's kept and cropped rows and what waits
    uncached (the tree's verdicts: VERDICTS)."""
    step, entry = run.steps[index], run_ledger(run)[index].target
    count = len(step.committed)
    accepted = sum(origin not in ("bonus", "correction", "target") for origin in step.committed_origins)
    return {"count": rf"\b{count} tokens? committed|\*\*{count} tokens? for|\b{count} token\(s\) committed",
            "accepted": rf"\b{accepted} accepted, ", "tests": r"Test \d+ of \d+",
            "tokens": r"Committed: |and produced `", "kept": rf"\b{entry.kept} \(the accepted path\) stayed",
            "cropped": rf"\b{entry.cropped} were cropped", "pending": r"wait uncached|nothing is pending",
            "ledger cells": r"kept \(accepted path\)|\"cropped\"|next step starts"}


def told(views: dict, patterns) -> list[str]:
    said = json.dumps(views, ensure_ascii=False)
    return [pattern for pattern in patterns if re.search(pattern, said)]


@pytest.mark.parametrize("name", sorted(example_traces()))
def test_before_the_reveal_no_view_of_a_step_tells_its_answer_and_after_it_every_one_does(name):
    run = load_example(name)
    greedy = all(node.u is None for step in run.steps for node in step.nodes)
    for index in sorted({0, 1, len(run.steps) // 2, len(run.steps) - 1}):
        patterns, count = answer_patterns(run, index), len(run.steps[index].committed)
        before = sum(len(step.committed) for step in run.steps[:index])
        hidden = views_of(run, index)
        assert not told(hidden, patterns.values()), f"step {index} before the reveal: {told(hidden, patterns.values())}"
        assert not told({"tree": hidden["tree"]}, map(re.escape, VERDICTS)), "every candidate untested"
        assert not told({"guided": hidden["guided"]}, map(re.escape, VERDICTS)), "the guided step: none tested"
        sealed = hidden["phase count"]  # the drafting and the verify: as many phases whatever the outcome
        assert sealed == [max(len(set(draft_stages(run.steps[index]))), 1)], sealed
        assert all(residual is None and acceptance is None for residual, _, acceptance in hidden["learn"])
        assert len(hidden["text"]) == before, "the text as it stood before the step"
        assert "predict first" in hidden["story"] and not hidden["pq"]
        timeline = json.loads(hidden["timeline"]) if hidden["timeline"] else {"data": []}
        by_step = [t for t in timeline["data"] if t.get("xaxis", "x") in ("x", "x2")]  # x3, x4: by draft position
        assert all(x < index for trace in by_step for x in trace["x"]), "no bar of this step or later"
        if greedy:  # at T = 0 the target's p of a candidate tells whether it passes
            assert not re.search(r"p \(target\) \d", hidden["tree"])
        predict.reveal(run, index)
        shown = views_of(run, index)
        assert len(shown["text"]) == before + count and shown["story"] == step_story(run, index)
        assert re.search(patterns["count"], json.loads(shown["tree"])["layout"]["title"]["text"])
        assert all(re.search(patterns[name], shown["ledger words"]) for name in ("kept", "cropped", "pending"))
        assert re.search(patterns["ledger cells"], shown["ledger"])


def test_a_step_on_show_draws_no_later_step_the_learner_has_not_seen():
    """A replay holds every step: with predictions on, the views of a seen step stop where the unseen ones start
    (the run timeline draws every step it is given)."""
    run = load_example("sd-sampled")
    predict.keep_seen(run, range(4))
    by_step = [t for t in json.loads(views_of(run, 1)["timeline"])["data"] if t.get("xaxis", "x") in ("x", "x2")]
    assert max(x for trace in by_step for x in trace["x"]) == 3
    assert "4 of" not in views_of(run, 1)["summary"]


# -- a step once seen stays seen -------------------------------------------------------------------------------------

def asking(session: Session) -> list[int]:
    """The steps of the run on show whose views would wait for a guess."""
    return [i for i in range(len(session.run.steps)) if predict.asks_first(session, i)]


def test_a_replays_steps_shown_before_predict_first_was_ticked_stay_shown_and_a_reveal_stays():
    session = Session("seen")
    replay = Controller(session, None)
    replay.example("mcsd-greedy")
    replay.show_step(3)  # the learner dragged the slider to step 3
    replay.predict_first(True, 3, "")
    assert asking(session) == list(range(4, len(session.run.steps))), "steps 0-3 were on show: they stay"
    replay.predict(4, predict.COMMIT, 2)
    replay.predict_first(False, 4, "")
    replay.predict_first(True, 2, "")  # off and on again, back at step 2
    assert asking(session)[0] == 5, "step 4, guessed, stays revealed"
    assert predict.score(session.run) == (int(len(session.run.steps[4].committed) == 2), 1), "only guesses count"


@pytest.fixture(scope="module")
def pairs(tiny_pair):
    return PairCache(loader=lambda *_, **__: tiny_pair)


def test_a_live_runs_steps_stay_shown_and_a_run_shows_its_steps_for_good(pairs):
    settings = Settings(pair="tiny-random", method="sd", max_new_tokens=24)
    session = Session("live")
    control = Controller(session, in_process(pairs))
    for _ in range(3):
        control.step(settings, "hello")
    control.predict_first(True, 1, "")  # scrolled back to step 1: steps 0-2 were each on show when taken
    assert asking(session) == []
    control.step(settings, "hello")
    assert asking(session) == [3], "a new step waits for its guess"
    control.run_begin(settings, "hello")
    while control.run_next().more:
        pass
    assert session.done and asking(session) == [3], "what the Run showed stays shown; step 3 still waits"
    guessed = sum(g.guess != predict.REVEALED for g in session.run.predictions)
    assert guessed == 0 and predict.score(session.run) == (0, 0)


def test_run_upto_is_the_run_as_it_stood_then():
    run = load_example("mcsd-greedy")
    then = predict.run_upto(run, 3)
    assert then.steps == run.steps[:3] and then.finished == "" and run.finished
    assert then.new_token_ids == [t for step in run.steps[:3] for t in step.committed]
    assert then.seconds - sum(s.seconds for s in then.steps) == pytest.approx(
        run.seconds - sum(s.seconds for s in run.steps)), "the prefill's time stays"
    assert predict.run_upto(run, len(run.steps)) is run and replace(run) == run
