"""The Learn tab through the app's API (gradio_client against `python app.py --pair tiny-random`): every endpoint
answers with figures of the step on show, and bad input gets one clear message."""
import json
from urllib.parse import parse_qsl

import pytest

TINY = dict(pair="tiny-random", method="mcsd", max_new_tokens=16)
SAMPLED = dict(TINY, temperature=1.0)
LEARN = dict(guided=0, phase_text=1, phase=2, residual=3, residual_text=4, acceptance=5, status=6)
STATUS = 7  # in the main views


@pytest.fixture(scope="module")
def connect(explorer_url):
    from gradio_client import Client as GradioClient

    return lambda: GradioClient(explorer_url, verbose=False)


def plot(value) -> dict:
    assert value is not None and value["type"] == "plotly"
    return json.loads(value["plot"])


def test_learn_step_and_phases_explain_the_step_on_show(connect):
    client = connect()
    client.predict(prompt="hello", **SAMPLED, api_name="/step")
    views = client.predict(0, api_name="/learn_step")
    assert "Phase 1 of" in views[LEARN["phase_text"]] and "Draft level 1" in views[LEARN["phase_text"]]
    assert plot(views[LEARN["acceptance"]])["data"], "a sampled step has tests with u"
    assert plot(views[LEARN["residual"]])["layout"]["title"]["text"].startswith("Step 0")
    last = views[LEARN["phase"]]["maximum"]
    end = client.predict(0, last, api_name="/learn_phase")  # the last phase is the commit
    assert "Commit" in end[1] and end[2]["value"] == last
    assert all(len(json.dumps(v)) < 20_000 for v in (views[LEARN["guided"]], views[LEARN["residual"]],
                                                      views[LEARN["acceptance"]]))


def test_learn_step_without_a_run_says_what_to_do(connect):
    views = connect().predict(0, api_name="/learn_step")
    assert "nothing to explain yet" in views[LEARN["status"]]


def test_cost_model_side_by_side_and_losslessness(connect):
    client = connect()
    for _ in range(3):  # a prompt no other test compares: the app and its kept Compares are shared by the suite
        client.predict(prompt="hello, cost model", **TINY, api_name="/step")
    figure, budget, text, status = client.predict(1, True, **TINY, api_name="/cost_model")  # measure again
    assert "measured now on this device" in status and "ar step" in text
    names = [trace["name"] for trace in plot(figure)["data"]]
    assert names[1:3] == ["verify rows free (expected)", "this run: expected"]
    assert ("Compare: measured against ar" in names) == ("measured by Compare" in text), "kept: drawn and said"
    assert "Forward costs measured on this device" in text and "(expected)" in text
    assert "Not measured yet" in text, "no Compare of this prompt and settings ran: nothing is called measured"
    assert plot(budget)["layout"]["title"]["text"].startswith(("Best static tree", "No static tree"))
    tree_a, story_a, tree_b, story_b, status = client.predict(1, "sd", "ti-mcsd", **TINY,
                                                                 api_name="/side_by_side")
    assert "**sd**" in story_a and "LOSSY" in story_b and plot(tree_a)["data"] and plot(tree_b)["data"]
    greedy = client.predict("hello", "sd", 50, **TINY, api_name="/losslessness")
    assert "temperature above 0" in greedy[2]
    figure, text, status = client.predict("hello", "sd", 100, **SAMPLED, api_name="/losslessness")
    assert "p-value" in text and "ti-mcsd" in text and len(plot(figure)["data"]) == 3


def test_a_shared_link_and_the_shipped_examples(connect):
    client = connect()
    client.predict(prompt="hello", **TINY, api_name="/step")
    link, status = client.predict("hello", 0, **dict(TINY, temperature=0.5), api_name="/share_link")
    params = dict(parse_qsl(link.split("?", 1)[1]))
    assert params["prompt"] == "hello" and params["temperature"] == "0.5" and params["step"] == "0"
    views = client.predict("hello", 2, **TINY, api_name="/goto_step")
    assert "Showing step 2" in views[STATUS]
    bad = client.predict("hello", 1, **dict(TINY, k_config="4,x"), api_name="/goto_step")
    assert bad[STATUS].startswith("⚠") and "tree shape" in bad[STATUS]
    replay = client.predict("mcsd-greedy", api_name="/replay_example")
    assert "Replaying the example" in replay[STATUS]
    prompt = replay[10]  # after the 10 views (the session state is not sent): the prompt box, set to the run's
    assert (prompt.get("value") if isinstance(prompt, dict) else prompt).startswith("Explain why the sky is blue")
    assert "The" in json.dumps(replay[0]), "the generated text of step 0 is on show"
    with pytest.raises(Exception, match="not in the list of choices"):  # the dropdown refuses unknown names
        client.predict("nope", api_name="/replay_example")
