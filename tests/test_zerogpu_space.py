"""The explorer as a ZeroGPU Space runs it: every model call in a forked child whose memory is lost.

The app is started as a Space starts it, with tests/zerogpu_double standing in for the `spaces` package
(SPACES_ZERO_GPU=1): each spaces.GPU call runs in a forked child, arguments and results travel pickled, a child
is sometimes reused and sometimes fresh, and CUDA may not be initialised in the app's process. Through the API,
every feature of the page must work there as it does in one process; the double's log counts the GPU calls and
the bytes that cross.
"""
from __future__ import annotations

import json
import os
import threading

import pytest
from conftest import REPO, served_app
from test_browser import browser  # noqa: F401 (the fixture: headless Chromium)

# One worker starts the app under the double once for the whole module (tests/conftest.py runs each group together).
pytestmark = pytest.mark.xdist_group("zerogpu-app")

TINY = dict(pair="tiny-random", method="mcsd", max_new_tokens=24)
OUT = dict(text=0, tree=1, mask=2, pq=3, stop=4, timeline=5, summary=6, status=7, story=8, scrubber=9)
STEP_FIGURES = ("tree", "mask", "pq")


@pytest.fixture(scope="module")
def zerogpu_app(tmp_path_factory):
    """The app under the ZeroGPU double, on tiny-random; yields (url, path of the double's call log)."""
    folder = tmp_path_factory.mktemp("zerogpu")
    log_path, calls = folder / "app.log", folder / "gpu_calls.jsonl"
    env = {"DYNASD_PUBLIC": "", "SPACES_ZERO_GPU": "1", "ZEROGPU_DOUBLE_LOG": str(calls),
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "zerogpu_double"), str(REPO)])}
    with served_app(["--pair", "tiny-random", "--device", "cpu"], env, log_path) as url:
        yield url, calls
    assert "CudaInMainProcess" not in log_path.read_text(), "CUDA was touched in the app's process"
    assert "ModelInMainProcess" not in log_path.read_text(), "a model ran in the app's process"


@pytest.fixture
def client(zerogpu_app):
    from gradio_client import Client

    return Client(zerogpu_app[0], verbose=False)


def gpu_calls(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def status(outputs) -> str:
    return outputs[OUT["status"]]


def figure(outputs, name: str) -> dict:
    return json.loads(outputs[OUT[name]])


def test_every_model_running_endpoint_and_no_other_makes_gpu_calls(zerogpu_app, tmp_path):
    """Every endpoint that runs a model runs it in GPU calls, and no other makes one: a model's forward in the
    app's process raises in the double (ModelInMainProcess), so each endpoint answering without a failure shows
    that none ran there; the double's log shows which endpoints made GPU calls."""
    from gradio_client import Client, handle_file

    url, log = zerogpu_app
    client = Client(url, verbose=False)
    tiny = dict(TINY, max_new_tokens=40)  # more than one GPU call of a Step computes
    calls = {"/step": lambda: client.predict(prompt="hello", **tiny, api_name="/step"),
             "/show_step": lambda: client.predict(0, api_name="/show_step"),
             "/save_trace": lambda: client.predict(api_name="/save_trace"),
             "/run": lambda: client.predict(prompt="hello", **tiny, api_name="/run"),
             "/learn_step": lambda: client.predict(0, api_name="/learn_step"),
             "/cost_model": lambda: client.predict(0, True, **tiny, api_name="/cost_model"),
             "/side_by_side": lambda: client.predict(0, "sd", "mcsd", **tiny, api_name="/side_by_side"),
             "/share_link": lambda: client.predict("hello", 0, **tiny, api_name="/share_link"),
             "/follow_up": lambda: client.predict("and then?", api_name="/follow_up"),  # after the Run
             "/goto_step": lambda: client.predict("hello", 1, **tiny, api_name="/goto_step"),
             "/losslessness": lambda: client.predict("hello", "sd", 50, **dict(tiny, temperature=1.0),
                                                     api_name="/losslessness"),
             "/reset": lambda: client.predict(api_name="/reset"),
             "/stop": lambda: client.predict(api_name="/stop"),
             "/compare": lambda: client.predict(prompt="hello", pair="tiny-random", max_new_tokens=6,
                                                api_name="/compare")}
    results, made = {}, {}
    for endpoint, call in calls.items():
        before = len(gpu_calls(log))
        results[endpoint] = call()
        made[endpoint] = len(gpu_calls(log)) - before
    results["/load_trace"] = Client(url, verbose=False).predict(handle_file(results["/save_trace"][0]),
                                                                api_name="/load_trace")
    assert status(results["/step"]).startswith("✓ Step 0"), status(results["/step"])
    assert "Loaded" in status(results["/load_trace"]), "a trace replays with no model and no GPU call"
    failed = {endpoint: result for endpoint, result in results.items()
              if "went wrong" in json.dumps(result, ensure_ascii=False)}
    assert not failed, f"failed (a model in the app's process?): {failed}"
    model_endpoints = {"/step", "/run", "/compare", "/follow_up", "/cost_model", "/side_by_side", "/losslessness",
                       "/goto_step"}
    assert {endpoint for endpoint, count in made.items() if count} == model_endpoints, made


def test_steps_advance_although_every_gpu_call_forgets_its_memory(client):
    statuses = [status(client.predict(prompt="hello", **TINY, api_name="/step")) for _ in range(3)]
    assert [s.split(" took")[0] for s in statuses] == ["✓ Step 0", "✓ Step 1", "✓ Step 2"], statuses


def test_a_run_is_one_gpu_call_and_its_steps_play_back_without_one(client, zerogpu_app):
    log = zerogpu_app[1]
    before = len(gpu_calls(log))
    done = client.predict(prompt="a run", pair="tiny-random", method="sd", max_new_tokens=64, api_name="/run")
    calls = gpu_calls(log)[before:]
    assert "Done after" in status(done) or "Stopped" in status(done), status(done)
    assert len(calls) == 1, f"a whole Run in one GPU call, got {[c['function'] for c in calls]}"
    steps = int(status(done).split("after ")[1].split(" steps")[0])
    assert steps > 1
    before = len(gpu_calls(log))
    shown = client.predict(1, api_name="/show_step")
    assert "Showing step 1" in status(shown) and len(gpu_calls(log)) == before, "scrubbing needs no GPU"


def test_steps_figures_are_those_of_one_process(client, explorer_url):
    """The same settings give the same step figures with the emulation as without it."""
    from gradio_client import Client

    plain = Client(explorer_url, verbose=False)
    for index in range(3):
        emulated = client.predict(prompt="same figures", **TINY, api_name="/step")
        direct = plain.predict(prompt="same figures", **TINY, api_name="/step")
        for name in STEP_FIGURES:
            assert figure(emulated, name) == figure(direct, name), (index, name)
        assert emulated[OUT["text"]] == direct[OUT["text"]]


def test_follow_up_share_links_and_examples_work_across_gpu_calls(client):
    client.predict(prompt="hello", pair="tiny-random", method="sd", max_new_tokens=6, api_name="/run")
    turn = client.predict("and then?", api_name="/follow_up")
    assert "Turn 2" in status(turn), status(turn)
    assert "Step 0" in status(client.predict(prompt="hello", pair="tiny-random", method="sd", max_new_tokens=6,
                                             api_name="/step"))
    link, said = client.predict("hello", 0, **TINY, api_name="/share_link")
    assert "step=0" in link, said
    linked = client.predict("hello", 2, **TINY, api_name="/goto_step")
    assert figure(linked, "tree")["layout"]["title"]["text"].startswith("Step 2"), status(linked)
    replay = client.predict("mcsd-greedy", api_name="/replay_example")
    assert "no model" in status(replay) or "Loaded" in status(replay) or "example" in status(replay).lower()


def test_compare_and_the_learn_views_work_across_gpu_calls(client):
    table, plot, said = client.predict(prompt="hello", pair="tiny-random", max_new_tokens=8, api_name="/compare")
    methods = {row[0] for row in table["data"]}
    assert {"ar", "sd", "mcsd", "pld"} <= methods, said
    client.predict(prompt="hello", **TINY, api_name="/step")
    client.predict(prompt="hello", **TINY, api_name="/step")
    views = client.predict(1, api_name="/learn_step")
    assert views
    figure_, budget_, text, said = client.predict(1, True, **TINY, api_name="/cost_model")
    assert "✗" not in said and "⚠" not in said, said
    tree_a, story_a, tree_b, story_b, said = client.predict(1, "sd", "mcsd", **TINY, api_name="/side_by_side")
    assert "✗" not in said and "⚠" not in said, said
    figure_, text, said = client.predict("hello", "sd", 60, **dict(TINY, temperature=1.0), api_name="/losslessness")
    assert "✗" not in said and "⚠" not in said, said


def test_two_concurrent_sessions_stay_apart(zerogpu_app):
    from gradio_client import Client

    a, b = Client(zerogpu_app[0], verbose=False), Client(zerogpu_app[0], verbose=False)
    seen: dict[str, list[str]] = {"a": [], "b": []}

    def steps(name, who, prompt):
        for _ in range(3):
            seen[name].append(status(who.predict(prompt=prompt, **TINY, api_name="/step")).split(" took")[0])

    threads = [threading.Thread(target=steps, args=("a", a, "first prompt")),
               threading.Thread(target=steps, args=("b", b, "second prompt"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert seen == {"a": ["✓ Step 0", "✓ Step 1", "✓ Step 2"], "b": ["✓ Step 0", "✓ Step 1", "✓ Step 2"]}


@pytest.mark.browser
def test_the_page_steps_runs_and_stops_on_zerogpu(zerogpu_app, browser):  # noqa: F811 (the imported fixture)
    """In a real browser: Step, Step, Run (one GPU call, played back by the page), Stop within a step of the one
    on show, then Step goes on from the recorded run without a GPU call."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait
    from test_browser import _open_accordion, _set_slider, _shown_step

    url, log = zerogpu_app
    wait = WebDriverWait(browser, 120, poll_frequency=0.05)
    browser.get(url)
    status = lambda: browser.find_element(By.ID, "status").text  # noqa: E731
    wait.until(ready.element_to_be_clickable((By.ID, "step-btn"))).click()
    wait.until(lambda _: "Step 0 took" in status())
    browser.find_element(By.ID, "step-btn").click()
    wait.until(lambda _: "Step 1 took" in status())
    _open_accordion(browser, "Sampling", "#max-new-tokens input[type=number]")
    _set_slider(browser, "max-new-tokens", 256)
    calls = len(gpu_calls(log))
    browser.find_element(By.ID, "run-btn").click()
    wait.until(lambda _: (_shown_step(browser) or 0) >= 3)
    shown_at_stop = browser.execute_script(
        "const shown = document.getElementById('scrubber').innerText.match(/Step on show: (\\d+)/);"
        "document.getElementById('stop-btn').click();"
        "return shown ? Number(shown[1]) : null;")
    wait.until(lambda _: "Stopped after" in status())
    stopped_at = _shown_step(browser)
    assert shown_at_stop is not None and stopped_at <= shown_at_stop + 1
    run_calls = gpu_calls(log)[calls:]
    assert len(run_calls) == 1, f"the Run was one GPU call, got {[c['function'] for c in run_calls]}"
    browser.find_element(By.ID, "step-btn").click()
    wait.until(lambda _: f"Step {stopped_at + 1} took" in status())
    assert len(gpu_calls(log)) == calls + 1, "the next Step came from the recorded run, without a GPU call"
    tree = browser.find_elements(By.CSS_SELECTOR, "#tree-plot .js-plotly-plot .scatterlayer .point")
    assert len(tree) > 10


@pytest.mark.slow(seconds=20)
def test_a_classroom_at_once_advances_every_session_on_its_own_state_with_the_gpu_calls_of_one_alone(zerogpu_app):
    """scripts/classroom.py's learners (Step, Step, Run, scrub, a follow-up and its Step; Compare left out), first
    one of each settings alone, then three at once: every session's steps advance one by one, every text (token ids)
    is its settings' alone, and the three make exactly the GPU calls of their settings alone, none lost or shared."""
    import importlib.util
    import sys

    for name in ("soak", "classroom"):  # classroom.py imports soak.py as its neighbour
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
            sys.modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(sys.modules[name])
    Learner = sys.modules["classroom"].Learner
    url, log = zerogpu_app
    configs = [("a classroom prompt", dict(method="mcsd", k_config="2,1,1,1")), ("another one", dict(method="ar"))]

    def learner(i):
        prompt, options = configs[i % 2]
        return Learner(url, 120, dict(pair="tiny-random", max_new_tokens=8, **options), prompt)

    alone, calls_alone = [], []
    for i in range(2):
        before = len(gpu_calls(log))
        one = learner(i)
        one.lesson(compare=False)
        assert one.problems == [] and one.token_ids
        alone.append(one.token_ids)
        calls_alone.append(len(gpu_calls(log)) - before)
    before = len(gpu_calls(log))
    classroom = [learner(i) for i in range(3)]
    threads = [threading.Thread(target=one.lesson, kwargs=dict(compare=False)) for one in classroom]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert [one.problems for one in classroom] == [[]] * 3, "every step was the next one of its own run"
    assert [one.token_ids for one in classroom] == [alone[i % 2] for i in range(3)]
    assert len(gpu_calls(log)) - before == sum(calls_alone[i % 2] for i in range(3)), calls_alone
