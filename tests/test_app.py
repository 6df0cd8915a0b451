"""The explorer end to end through its API (gradio_client against `python app.py --pair tiny-random`), and the
session machinery behind it: bounded registry, models loaded once, failures kept inside one session."""
import json
import time

import pytest
import torch

from dynasd.explorer.failures import SessionFailed
from dynasd.explorer.inputs import CUSTOM, Settings, UserError
from dynasd.explorer.measure.compare import run_compare
from dynasd.explorer.pairs import PairCache
from dynasd.explorer.sessions.registry import SessionRegistry
from dynasd.explorer.sessions.session import Mode
from dynasd.loading.models import ModelLoadError, tiny_random_pair
from dynasd.options import OPTIONS, DecoderOptions

TINY = dict(pair="tiny-random", method="mcsd", max_new_tokens=24)
OUT = dict(text=0, tree=1, mask=2, pq=3, stop=4, timeline=5, summary=6, status=7, story=8, scrubber=9)


# -- sessions, without a server -----------------------------------------------------------------------------------

class CountingLoader:
    def __init__(self):
        self.calls = 0

    def __call__(self, name=None, target=None, draft=None, device=None, dtype=None):
        self.calls += 1
        if name not in (None, "tiny-random"):
            raise ModelLoadError(f"cannot load '{name or target}'")
        return tiny_random_pair()


def test_a_pair_is_loaded_once_and_shared_by_sessions():
    loader = CountingLoader()
    pairs, registry = PairCache(loader=loader), SessionRegistry()
    a, b = registry.get(None), registry.get(None)
    assert a.id != b.id
    for session in (a, b):
        session.start(pairs, Settings(pair="tiny-random", max_new_tokens=8), "hello")
        session.step(pairs)
    assert loader.calls == 1
    assert a.run is not b.run and a.snapshot is not b.snapshot, "each session keeps its own state"
    assert a.run.steps[0].committed == b.run.steps[0].committed, "the same prompt and settings, the same step"


def test_registry_is_bounded_and_evicts_the_longest_idle_session():
    now = [0.0]
    registry = SessionRegistry(max_sessions=3, ttl_s=100, clock=lambda: now[0])
    ids = []
    for _ in range(3):
        ids.append(registry.get(None).id)
        now[0] += 1
    registry.get(ids[0])  # the oldest becomes the most recently used
    now[0] += 1
    newest = registry.get(None).id
    assert len(registry) == 3
    assert ids[1] not in registry and ids[0] in registry and newest in registry


def test_registry_refuses_when_every_session_is_busy():
    registry = SessionRegistry(max_sessions=1)
    busy = registry.get(None)
    busy.mode = Mode.RUNNING  # a Run streamed to an API client
    with pytest.raises(UserError, match="busy"):
        registry.get(None)


def test_sessions_expire_after_their_time_to_live():
    now = [0.0]
    registry = SessionRegistry(max_sessions=5, ttl_s=10, clock=lambda: now[0])
    old = registry.get(None).id
    now[0] = 5
    assert registry.get(old).id == old
    now[0] = 16
    assert registry.get(old).id != old and old not in registry


def test_a_failing_model_call_marks_only_its_own_session(fail_broken_runs):
    pairs, registry = PairCache(loader=CountingLoader()), SessionRegistry()
    broken, healthy = registry.get(None), registry.get(None)
    for session, prompt in ((broken, "broken"), (healthy, "hello")):
        session.start(pairs, Settings(pair="tiny-random", max_new_tokens=16), prompt)
    fail_broken_runs()
    with pytest.raises(SessionFailed, match="CUDA out of memory.*Reset"):
        broken.step(pairs)
    assert broken.error and healthy.error is None
    with pytest.raises(SessionFailed):  # stays failed until reset
        broken.step(pairs)
    assert healthy.step(pairs).index == 0
    assert not pairs.lock_for(pairs.get(healthy.settings)).locked(), "the failure released the model lock"
    broken.reset()
    broken.start(pairs, Settings(pair="tiny-random", max_new_tokens=16), "hello")
    assert broken.error is None


def test_public_mode_refuses_custom_models():
    pairs = PairCache(loader=CountingLoader(), allow_custom=False)
    with pytest.raises(UserError, match="custom models are turned off"):
        pairs.get(Settings(pair=CUSTOM, target="/etc", draft="/etc"))
    with pytest.raises(UserError, match="unknown model pair"):
        pairs.get(Settings(pair="../../secret"))


def test_sent_outputs_leave_out_what_the_page_holds_until_a_failure_or_a_wait():
    """An output whose content was the last one sent is left out; after an update that failed, or one that had
    to wait for another update of the session (the two may reach the page in either order), all is sent."""
    import threading

    from ui.sent import SentOutputs

    sent = SentOutputs()
    with sent.update() as page:
        assert page.changed("tree", "a") and page.changed("mask", "b")
    with sent.update() as page:
        assert not page.changed("tree", "a") and page.changed("mask", "c")
    with pytest.raises(RuntimeError), sent.update() as page:
        page.changed("stop", "d")
        raise RuntimeError("the update failed")
    with sent.update() as page:
        assert page.changed("tree", "a"), "after a failure everything is sent"
    holding, release, results = threading.Event(), threading.Event(), []

    def first():
        with sent.update():
            holding.set()
            release.wait(10)

    def second():
        with sent.update() as page:
            results.append(page.changed("tree", "a"))

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    holding.wait(10)
    threads[1].start()
    release.set()
    for thread in threads:
        thread.join(10)
    assert results == [True], "an update that waited for another one sends in full"


def test_bad_settings_are_user_errors_with_a_reason():
    pairs = PairCache(loader=CountingLoader())
    session = SessionRegistry().get(None)
    cases = [(Settings(pair="tiny-random", k_config="4,0"), "hi", "at least 1"),
             (Settings(pair="tiny-random", method="beam"), "hi", "unknown method"),
             (Settings(pair="tiny-random", max_new_tokens=0), "hi", "max new tokens"),
             (Settings(pair="tiny-random", stop="confidence", threshold=1.5), "hi", "threshold"),
             (Settings(pair="tiny-random", k_config="99,99"), "hi", "limit"),
             (Settings(pair="tiny-random", max_new_tokens=500), "long " * 200, "context"),
             (Settings(pair="tiny-random"), "   ", "empty"),
             (Settings(pair="tiny-random", method="sd", lookup=257), "hi", "prompt lookup must lie"),
             (Settings(pair="tiny-random", method="pld", lookup=-1), "hi", "prompt lookup must lie")]
    for settings, prompt, message in cases:
        with pytest.raises(UserError, match=message):
            session.start(pairs, settings, prompt)


def test_every_recipe_runs_and_sets_only_method_controls():
    """Each recipe is a dict of valid decoder options that steps on a pair, and the app's handler changes the
    method controls it names and nothing else (pair, prompt and sampling stay)."""
    from dataclasses import replace

    from dynasd.recipes import RECIPES
    from ui import play
    from ui.controls import CONTROL_NAMES

    pairs, registry = PairCache(loader=CountingLoader()), SessionRegistry()
    user = Settings(pair="tiny-random", temperature=0.7, top_p=0.9, max_new_tokens=6, seed=3)
    for name, values in RECIPES.items():
        assert all(OPTIONS[key].group != "sampling" for key in values), name
        DecoderOptions(**values).validate()
        session = registry.get(None)
        session.start(pairs, replace(user, **values), "hello")
        assert session.step(pairs).committed, name  # a step commits at least one token
        assert session.run.lossless == (values["method"] != "ti-mcsd"), name
        *updates, status, dynamic_section = play.on_recipe(name)
        assert (dynamic_section.get("open") is True) == bool(values.get("dynamic_depth")), \
            "a recipe that turns on dynamic depth opens that section"
        changed = {control: update["value"] for control, update in zip(CONTROL_NAMES, updates)
                   if "value" in update}
        assert changed == {key: OPTIONS[key].record(value) for key, value in values.items()}, name
        assert status.startswith("✓"), name
    *updates, status, _ = play.on_recipe("no such recipe")
    assert all("value" not in update for update in updates) and "unknown recipe" in status


def test_compare_runs_every_method_and_lossless_ones_match_ar():
    pairs = PairCache(loader=CountingLoader())
    *_, last = run_compare(pairs, Settings(pair="tiny-random", max_new_tokens=20), "hello", peer=False)
    runs = {method: method_run.run for method, method_run in last.runs.items()}
    assert list(runs) == ["ar", "sd", "mcsd", "ti-mcsd", "pld", "recycle", "dynamic"]
    assert (runs["sd"].text == runs["mcsd"].text == runs["pld"].text == runs["recycle"].text == runs["dynamic"].text
            == runs["ar"].text)
    assert not runs["ti-mcsd"].lossless


# -- the app through its API ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def connect(explorer_url):
    from gradio_client import Client as GradioClient

    return lambda: GradioClient(explorer_url, verbose=False)


def value(output):
    """A component returned with new properties arrives as an update dict; its value is inside."""
    if isinstance(output, dict) and output.get("__type__") == "update":
        return output.get("value")
    return output


def spans(outputs) -> list[dict]:
    return value(outputs[OUT["text"]]) or []


def plot_json(value) -> dict:
    """A figure as the API sends it: the Plotly JSON of the step's figure views (the compare plot is a gr.Plot)."""
    assert value is not None
    return json.loads(value if isinstance(value, str) else value["plot"])


FIGURES = ("tree", "mask", "pq", "stop", "timeline")


def sent_figures(outputs) -> set[str]:
    """The figures an update carries (each as its Plotly JSON); one left out (gr.skip()) is an update without a
    value, a cleared one is None."""
    return {name for name in FIGURES if isinstance(outputs[OUT[name]], str)}


def test_step_shows_the_tree_mask_and_text_of_each_step(connect):
    client = connect()
    first = client.predict(prompt="hello", **TINY, api_name="/step")
    second = client.predict(prompt="hello", **TINY, api_name="/step")
    assert "Step 0" in first[OUT["status"]] and "Step 1" in second[OUT["status"]]
    tree = plot_json(second[OUT["tree"]])
    assert tree["layout"]["title"]["text"].startswith("Step 1: 44 candidates")
    assert len(json.dumps(tree)) < 100_000
    heat = plot_json(second[OUT["mask"]])["data"][0]
    # root row + 44 nodes, sent as a typed array that Gradio passes through to plotly.js
    assert heat["type"] == "heatmap" and heat["z"]["dtype"] == "u1" and heat["z"]["shape"] == "45, 46"
    figures = sum(len(second[OUT[name]]) for name in sent_figures(second))
    assert figures <= 60_000, f"one update sends {figures} bytes of figures"
    text = spans(second)
    assert len(text) > len(spans(first)) >= 1
    assert any(s["class_or_confidence"].endswith("this step") for s in text)
    assert second[OUT["scrubber"]]["maximum"] == 1 and second[OUT["scrubber"]]["value"] == 1
    assert "Step 1" in second[OUT["story"]]


def test_an_update_sends_only_the_figures_that_changed(connect):
    """A figure the page shows already is left out of an update: the step on show shown again sends none, the
    stop scores of a run without a stop policy go once, a step elsewhere sends the figures that differ, and a
    Reset clears them once."""
    client = connect()
    first = client.predict(prompt="hello", **TINY, api_name="/step")
    assert sent_figures(first) == set(FIGURES)
    second = client.predict(prompt="hello", **TINY, api_name="/step")
    assert sent_figures(second) == {"tree", "mask", "pq", "timeline"}, "no stop policy: the same stop figure"
    again = client.predict(1, api_name="/show_step")
    assert sent_figures(again) == set() and "Showing step 1" in again[OUT["status"]]
    assert spans(again) == spans(second), "the text comes with every update"
    back = client.predict(0, api_name="/show_step")
    assert sent_figures(back) == {"tree", "mask", "pq", "timeline"}
    assert all(plot_json(back[OUT[name]]) == plot_json(first[OUT[name]]) for name in ("tree", "mask", "pq"))
    cleared = client.predict(api_name="/reset")
    assert all(cleared[OUT[name]] is None for name in FIGURES), "Reset sends the empty figures"
    assert sent_figures(client.predict(prompt="hello", **TINY, api_name="/step")) == set(FIGURES)


def paced_run(steps: int):
    """A page's Run driven by hand: on_run_begin, then on_run_next until `steps` steps are taken."""
    from ui import play, state

    session = state.SESSIONS.get(None)
    begun = play.on_run_begin(session.id, "hello", 0, pair="tiny-random", method="mcsd", max_new_tokens=64)
    assert sent_figures(begun) == set(FIGURES) and begun[-1] == 1, "the first step, and the tick for the next"
    tick = 1
    for _ in range(steps - 1):
        update = play.on_run_next(session.id, tick, False)
        assert sent_figures(update) == {"tree", "mask", "pq", "timeline"} and update[-1] == tick + 1
        tick += 1
    return session, tick


def test_a_stopped_paced_run_ends_without_sending_its_figures_again():
    """The page's Run, stopped through the server (the Stop request arrives first): the next request ends it,
    and that last update shows the step already on show, so it carries no figure. Stop's own reply leaves the
    status to the run's last update, which it could overtake."""
    import gradio as gr

    from ui import play

    session, tick = paced_run(2)
    assert play.on_stop(session.id)[0] == gr.skip() and session.mode is Mode.STOPPING
    stopped = play.on_run_next(session.id, tick, False)
    assert "Stopped after 2 steps" in stopped[OUT["status"]]
    assert sent_figures(stopped) == set(), "the step on show is unchanged: no figure is sent again"
    assert not session.run_in_progress
    assert "Nothing is running" in play.on_stop(session.id)[0]


def test_a_stop_heard_during_a_step_ends_the_run_with_that_step():
    """The Stop request arrives while the page's next step is being taken: that step's update is the run's last
    (no tick for another request), so the page's 'Stopping…' is followed by 'Stopped', not by 'Running…'."""
    import gradio as gr

    from ui import play

    session, tick = paced_run(2)
    take_step = session.step

    def step_while_stop_is_pressed(compute, steps=None):
        taken = take_step(compute, steps)
        play.on_stop(session.id)
        return taken

    session.step = step_while_stop_is_pressed
    last = play.on_run_next(session.id, tick, False)
    assert "Stopped after 3 steps" in last[OUT["status"]] and last[-1] == gr.skip()
    assert sent_figures(last) == {"tree", "mask", "pq", "timeline"}, "the new step is drawn"
    assert not session.run_in_progress
    assert "stopped after 3 steps" in play.on_stop(session.id)[0], "a second Stop: nothing is running"


def test_the_page_stops_its_run_with_the_request_for_the_next_step():
    """Stop pressed in the page travels with the page's next request: no step is taken, whether or not the
    server heard the Stop request yet; when that request comes after the end, its reply changes nothing, and a
    second Stop says nothing is running."""
    import gradio as gr

    from ui import play

    session, tick = paced_run(3)
    stopped = play.on_run_next(session.id, tick, True)
    assert "Stopped after 3 steps" in stopped[OUT["status"]] and len(session.run.steps) == 3
    assert not session.run_in_progress
    assert play.on_stop(session.id)[0] == gr.skip(), "the late Stop request does not overwrite 'Stopped'"
    assert "Nothing is running" in play.on_stop(session.id)[0]
    assert play.on_run_next(session.id, tick + 1, True) == tuple(gr.skip() for _ in range(12))


def test_the_first_use_of_a_pair_says_the_models_are_loading(monkeypatch):
    """Step and Run say in a toast that a pair not loaded yet is loading; a loaded pair goes without a word."""
    import gradio as gr

    from ui import play, state

    said = []
    monkeypatch.setattr(state, "PAIRS", PairCache(loader=CountingLoader()))
    monkeypatch.setattr(gr, "Info", said.append)
    session = state.SESSIONS.get(None)
    play.on_step(session.id, "hello", pair="tiny-random", max_new_tokens=4)
    assert len(said) == 1 and "Loading the model pair tiny-random" in said[0]
    play.on_step(session.id, "hello", pair="tiny-random", max_new_tokens=4)
    assert len(said) == 1, "loaded: nothing said"


def test_a_step_reaches_the_decoder_through_eight_functions_entering_ui_once(monkeypatch):
    """A Step of a run under way, from the function Gradio calls to Decoder.step: the handler's decorator, the
    handler, the Controller, the Session, the hand-over to the model thread (the transport), the engine's one door
    and the decoder; ui/ only at the top (docs/ARCHITECTURE.md draws this path)."""
    import traceback
    from pathlib import Path

    from dynasd.decoders.base import Decoder
    from dynasd.explorer.sessions import calls
    from ui import play, state

    repo = Path(__file__).resolve().parent.parent

    def ours(stack) -> list[str]:
        return [f"{Path(frame.filename).relative_to(repo).as_posix()}:{frame.name}" for frame in stack
                if Path(frame.filename).is_relative_to(repo) and not frame.filename.startswith(str(repo / "tests"))
                and ".venv" not in frame.filename]

    monkeypatch.setattr(state, "PAIRS", PairCache(loader=CountingLoader()))
    session = state.SESSIONS.get(None)
    controls = dict(pair="tiny-random", method="mcsd", max_new_tokens=8)
    play.on_step(session.id, "hello", **controls)  # the run starts
    serving, model = [], []
    hand_over, step = calls.on_the_model_thread, Decoder.step

    def handing_over(function, *args, **kwargs):
        serving.extend(ours(traceback.extract_stack()) + ["dynasd/explorer/model_thread.py:on_the_model_thread"])
        return hand_over(function, *args, **kwargs)

    def stepping(self):
        model.extend(ours(traceback.extract_stack()) + ["dynasd/decoders/base.py:step"])
        return step(self)

    monkeypatch.setattr(calls, "on_the_model_thread", handing_over)
    monkeypatch.setattr(Decoder, "step", stepping)
    assert play.on_step(session.id, "hello", **controls)[7].startswith("✓ Step 1")
    path = serving + model
    assert path == ["ui/handler.py:plain", "ui/handler.py:told", "ui/play.py:on_step",
                    "dynasd/explorer/sessions/controller.py:step", "dynasd/explorer/sessions/session.py:step",
                    "dynasd/explorer/model_thread.py:on_the_model_thread", "dynasd/explorer/engine.py:serve",
                    "dynasd/decoders/base.py:step"], path
    ui = [index for index, where in enumerate(path) if where.startswith("ui/")]
    assert ui == list(range(len(ui))), "ui/ entered once, at the top"


def test_a_step_sends_its_figures_to_the_page_once(explorer_inprocess, monkeypatch):
    """Every message Gradio queues for the page, counted: a Step's figures travel in one message (a generator
    handler's last update travels twice, once more as its result)."""
    from gradio import queueing
    from gradio_client import Client

    messages = []
    original = queueing.Queue.send_message

    def counted(self, event, message):
        messages.append(message.model_dump_json())
        return original(self, event, message)

    monkeypatch.setattr(queueing.Queue, "send_message", counted)
    client = Client(explorer_inprocess.url, verbose=False)
    for _ in range(2):
        messages.clear()
        client.predict(prompt="hello", **TINY, api_name="/step")
        carrying_figures = [m[:120] for m in messages if '\\"layout\\"' in m]  # a figure's JSON, quoted
        assert len(carrying_figures) == 1, carrying_figures


def test_the_idle_queue_polls_at_the_apps_interval(explorer_inprocess):
    """app.serve sets the queue's idle poll through a private gradio attribute: if a gradio release renames it,
    this fails instead of the app quietly going back to gradio's 1 ms poll."""
    queue = explorer_inprocess.demo._queue
    assert queue.sleep_when_free == explorer_inprocess.app.QUEUE_IDLE_POLL_S


def test_the_feature_draft_checkbox_switches_the_draft_and_stays_lossless(connect):
    client = connect()
    plain = client.predict(prompt="hello", **TINY, api_name="/run")
    client = connect()
    features = client.predict(prompt="hello", **TINY, draft_kind="features", api_name="/run")
    assert "feature draft" in features[OUT["summary"]] and "feature draft" not in plain[OUT["summary"]]
    words = lambda outputs: [s["token"] for s in spans(outputs)]  # noqa: E731
    assert words(features) == words(plain)


def test_run_streams_until_done_and_the_scrubber_goes_back(connect):
    client = connect()
    job = client.submit(prompt="hello", pair="tiny-random", method="sd", max_new_tokens=48, api_name="/run")
    updates = list(job)
    final = job.outputs()[-1]
    assert "Done" in final[OUT["status"]]
    steps = final[OUT["scrubber"]]["maximum"] + 1
    assert len(updates) >= 2, "the run streams intermediate steps"
    assert 1 < steps < 48, "sd commits more than one token per step"
    assert sum(len(s["token"]) for s in spans(final)) >= 48
    back = client.predict(0, api_name="/show_step")
    assert "step 0" in back[OUT["status"]].lower()
    assert plot_json(back[OUT["tree"]])["layout"]["title"]["text"].startswith("Step 0")
    assert len(spans(back)) < len(spans(final))


def test_stop_ends_a_run_early(connect):
    client = connect()
    job = client.submit(prompt="hello", pair="tiny-random", method="mcsd", temperature=1.5, max_new_tokens=512,
                        api_name="/run")
    deadline = time.monotonic() + 60
    while not job.outputs() and time.monotonic() < deadline:  # wait for the run to be under way
        time.sleep(0.05)
    assert "Stopping" in client.predict(api_name="/stop")
    final = job.result()
    assert "Stopped" in final[OUT["status"]]
    assert sum(len(s["token"]) for s in spans(final)) < 512


def test_stop_with_nothing_running_says_so_and_leaves_the_status_idle(connect):
    client = connect()
    assert "Nothing is running" in client.predict(api_name="/stop")
    client.predict(prompt="hello", pair="tiny-random", method="sd", max_new_tokens=4, api_name="/run")
    after = client.predict(api_name="/stop")
    assert "Nothing is running" in after and "finished" in after, "a Stop after the end does not wait for one"
    assert "Step 0" in client.predict(prompt="other", **TINY, api_name="/step")[OUT["status"]]


def test_a_step_after_the_end_asks_before_replacing_the_finished_run(connect):
    client = connect()
    done = client.predict(prompt="hello", pair="tiny-random", method="sd", max_new_tokens=6, api_name="/run")
    steps = done[OUT["scrubber"]]["maximum"] + 1
    client.predict(0, api_name="/show_step")
    asked = client.predict(prompt="hello", pair="tiny-random", method="sd", max_new_tokens=6, api_name="/step")
    assert "finished" in asked[OUT["status"]] and "Press again" in asked[OUT["status"]]
    assert value(asked[OUT["tree"]]) is None, "the figures are left as they are (the step on show stays)"
    kept = client.predict(1, api_name="/show_step")
    assert kept[OUT["scrubber"]]["maximum"] + 1 == steps, "the finished run is still there"
    again = client.predict(prompt="hello", pair="tiny-random", method="sd", max_new_tokens=6, api_name="/step")
    assert "Step 0 took" in again[OUT["status"]] and "in place of the finished one" in again[OUT["status"]]


def test_step_times_leave_out_the_prefill_and_say_so(connect):
    client = connect()
    import re

    status = client.predict(prompt="word " * 100, **TINY, api_name="/step")[OUT["status"]]
    assert "Step 0 took" in status and "prefill not included" in status, status
    assert re.search(r"prefill of \d{3} prompt tokens took \d+ ms", status), "the prefill is reported once, apart"
    later = client.predict(prompt="word " * 100, **TINY, api_name="/step")[OUT["status"]]
    assert "Step 1 took" in later and "prefill of" not in later


def test_every_api_endpoint_names_its_inputs_and_outputs(connect):
    info = connect().view_api(print_info=False, return_format="dict")
    for name, endpoint in info["named_endpoints"].items():
        for part in ("parameters", "returns"):
            for item in endpoint[part]:
                label = item.get("label") or item.get("parameter_name") or ""
                assert label and not label.startswith("value_"), (name, part, item)
    assert "/run" in info["named_endpoints"] and "/step" in info["named_endpoints"]


def test_reset_clears_the_run(connect):
    client = connect()
    client.predict(prompt="hello", **TINY, api_name="/step")
    out = client.predict(api_name="/reset")
    assert "Reset" in out[OUT["status"]]
    assert not spans(out) and out[OUT["tree"]] is None
    assert "Step 0" in client.predict(prompt="hello", **TINY, api_name="/step")[OUT["status"]]


def test_sessions_do_not_share_runs(connect):
    a, b = connect(), connect()
    for _ in range(3):
        a.predict(prompt="hello", **TINY, api_name="/step")
    assert "Step 0" in b.predict(prompt="other prompt", **TINY, api_name="/step")[OUT["status"]]
    assert "Step 3" in a.predict(prompt="hello", **TINY, api_name="/step")[OUT["status"]]


def test_compare_tab_runs_every_method_and_transformers_assisted_generation(connect):
    """Every method, then transformers' assisted generation as the peer: at temperature 0 it writes ar's text
    too, in fewer target forwards than tokens, and its row has every column the others have."""
    client = connect()
    table, plot, status = client.predict(prompt="hello", pair="tiny-random", max_new_tokens=16,
                                         api_name="/compare")
    rows = {row[0]: dict(zip(table["headers"], row)) for row in table["data"]}
    peer = "hf-assisted (transformers)"
    assert set(rows) == {"ar", "sd", "mcsd", "ti-mcsd (LOSSY)", "pld", "recycle", "dynamic", peer}
    assert all(rows[m]["same text as ar"] == "yes" for m in ("sd", "mcsd", "pld", "recycle", "dynamic", peer))
    assert rows["mcsd"]["tokens / target forward"] > 1.0
    assert rows[peer]["new tokens"] == rows["ar"]["new tokens"] == 16
    assert 1.0 < rows[peer]["tokens / target forward"] == round(16 / rows[peer]["target forwards"], 2)
    assert rows[peer]["tokens / s (decoding)"] > 0 and rows[peer]["prefill (ms)"] >= 0
    assert all(value is not None for value in rows[peer].values()), rows[peer]
    assert len(plot_json(plot)["data"]) == 2 and "all methods" in status.lower() and peer in status, status


def test_compare_says_why_a_pair_without_a_runnable_draft_has_no_peer_row():
    from dynasd.explorer.measure.peer import run_peer, why_no_peer

    pair = tiny_random_pair()
    assert why_no_peer(pair) is None
    pair.draft = None
    assert "no draft model" in why_no_peer(pair)
    pairs = PairCache(loader=lambda *_, **__: pair)
    with pytest.raises(UserError, match="cannot run here: this pair has no draft model"):
        run_peer(pairs, Settings(pair="tiny-random", max_new_tokens=4), "hello")


def test_a_saved_trace_replays_in_another_session_without_stepping(connect):
    from gradio_client import handle_file

    from ui.controls import CONTROL_NAMES

    author = connect()
    for _ in range(3):
        shown = author.predict(prompt="hello", **TINY, api_name="/step")
    path, status = author.predict(api_name="/save_trace")
    assert "Saved 3 steps" in status
    with open(path) as f:
        assert json.load(f)["format"] == "dynasd-trace/1"
    viewer = connect()
    loaded = viewer.predict(handle_file(path), api_name="/load_trace")
    assert "Loaded" in loaded[OUT["status"]] and "no model" in loaded[OUT["status"]]
    # after the views (the session id, a gr.State, is not sent to API clients): the prompt, then every control
    updates = dict(zip(("prompt",) + CONTROL_NAMES, loaded[len(OUT):]))
    controls = {name: update["value"] for name, update in updates.items()}
    assert controls["prompt"] == "hello" and controls["pair"] == "tiny-random" and controls["method"] == "mcsd"
    assert controls["k_config"] == "4,2,2,1" and controls["temperature"] == 0
    assert spans(loaded) == spans(shown)
    assert plot_json(loaded[OUT["tree"]]) == plot_json(shown[OUT["tree"]])
    first = viewer.predict(0, api_name="/show_step")
    assert plot_json(first[OUT["mask"]])["layout"]["title"]["text"].startswith("Step 0")


RESTORED = [dict(method="mcsd", k_config="3,2,1", with_replacement=True, lookup=4, lookup_ngram=1,
                 draft_kind="features", dynamic_depth=True, stop="decision", threshold=0.3,
                 decision_model="decision-smollm2-hard", temperature=0.7, top_p=0.9, top_k=20, seed=7),
            dict(method="ti-mcsd", ti_k_config="2,2,1", stop="cumulative", threshold=0.2, temperature=0.5, seed=3)]


@pytest.mark.parametrize("changes", RESTORED, ids=["mcsd", "ti-mcsd"])
def test_loading_a_trace_restores_every_control(connect, changes):
    """Every control, the advanced ones too, goes back to the value the run was made with (the controls a method
    does not read go back to their defaults), so Step or Run makes the same run again."""
    from gradio_client import handle_file

    from ui.controls import CONTROL_NAMES

    sent = dict(pair="tiny-random", max_new_tokens=10, **changes)
    author = connect()
    made = author.predict(prompt="restore me", **sent, api_name="/run")
    assert "Done" in made[OUT["status"]], made[OUT["status"]]
    path, _ = author.predict(api_name="/save_trace")
    loaded = connect().predict(handle_file(path), api_name="/load_trace")
    controls = {name: update["value"] for name, update in zip(("prompt",) + CONTROL_NAMES, loaded[len(OUT):])}
    defaults = {name: OPTIONS[name].record(OPTIONS[name].default) for name in OPTIONS}
    assert controls == {"prompt": "restore me", "target": "", "draft": "", **defaults, **sent}
    again = connect().predict(prompt="restore me", **{k: v for k, v in controls.items() if k != "prompt"},
                              api_name="/run")
    assert spans(again) == spans(made)


def test_bad_input_returns_a_clear_message_not_a_traceback(connect, tmp_path):
    from gradio_client import handle_file

    client = connect()
    cases = [(dict(prompt="", **TINY), "the prompt is empty"),
             (dict(prompt="hi", pair="tiny-random", k_config="4,x"), "comma-separated integers"),
             (dict(prompt="hi", pair="tiny-random", k_config="99,99"), "limit"),
             (dict(prompt="hi", pair="custom", target="", draft=""), "needs both a target and a draft"),
             (dict(prompt="hi", pair="tiny-random", target="/nonexistent", draft="/nonexistent"),
              None),  # ids are ignored unless the pair is custom: this one runs
             (dict(prompt="hi", pair="custom", target="/nonexistent/model", draft="/nonexistent/model"),
              "no model at local path"),
             (dict(prompt="word " * 300, pair="tiny-random", max_new_tokens=500), "exceeds the model's context")]
    for kwargs, message in cases:
        status = client.predict(**kwargs, api_name="/step")[OUT["status"]]
        if message is None:
            assert status.startswith("✓"), status
            continue
        assert status.startswith("⚠") and message in status, status
        assert "Traceback" not in status
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    status = client.predict(handle_file(str(bad)), api_name="/load_trace")[OUT["status"]]
    assert status.startswith("⚠") and "cannot load that trace" in status


def test_no_progress_overlay_covers_a_status_line_or_the_guided_figure():
    """Gradio's progress overlay writes "processing | 0.1/0.3s" and "queue: 1/1" into the component it covers and
    greys it out: over a figure it flickers at every phase. Every event with a model or a status line among its
    outputs hides it, but for the one display that tells a waiting learner its place in the queue: the minimal
    runtime display on the event's own status line only (ui/layout.py queue_place, whose CSS puts it under the
    status text and keeps the text legible)."""
    import app
    from ui.layout import QUEUE_PLACE_CSS

    demo = app.build_app("tiny-random")
    watched = {"status", "learn-status", "compare-status", "learn-guided-plot"}
    covering, placed = [], set()
    for fn in demo.fns.values():
        shown = [o.elem_id for o in fn.outputs if o.elem_id in watched]
        if fn.fn is None or fn.show_progress == "hidden" or not shown:
            continue
        on = [o.elem_id for o in fn.show_progress_on or fn.outputs]
        if fn.show_progress == "minimal" and len(on) == 1 and on[0] in ("status", "compare-status"):
            placed.add(fn.api_name or fn.name)
            continue
        covering.append(f"{fn.name} -> {sorted(shown)}")
    assert not covering, covering
    assert {"step", "compare", "follow_up"} <= placed, placed
    assert all(f"#{elem} .pending" in QUEUE_PLACE_CSS for elem in ("status", "compare-status"))


def test_a_wide_tree_on_a_cpu_says_at_its_start_why_it_is_slower_than_ar(monkeypatch):
    from dataclasses import replace

    import dynasd.explorer.sessions.controller
    from dynasd.explorer.inputs import Settings
    from dynasd.explorer.sessions.controller import wide_tree_on_a_cpu as _wide_tree_on_a_cpu

    default = Settings().normalised()
    assert default.method == "mcsd"
    monkeypatch.setattr(dynasd.explorer.sessions.controller, "pick_device", lambda _: torch.device("cuda"))
    assert _wide_tree_on_a_cpu(default) == "", "on a GPU the paper's tree is the right first sight"
    monkeypatch.setattr(dynasd.explorer.sessions.controller, "pick_device", lambda _: torch.device("cpu"))
    note = _wide_tree_on_a_cpu(default)
    assert "44-node tree is expected to be slower than ar" in note and "45 rows" in note
    narrow = replace(Settings(), k_config="2,1,1,1").normalised()
    assert _wide_tree_on_a_cpu(narrow) == ""
    assert _wide_tree_on_a_cpu(replace(Settings(), method="pld").normalised()) == ""


def test_the_page_keeps_no_run_history_in_the_browser(explorer_inprocess):
    """Gradio's run history would copy every Step's figures and prompt into the browser's storage, read and written
    whole at each event; the app turns it off (app.serve), and the page's config says so."""
    import requests

    config = requests.get(explorer_inprocess.url.rstrip("/") + "/config", timeout=10).json()
    assert config["run_history"] is False


def test_every_model_call_runs_on_the_one_model_thread():
    """ui/gpu.call runs the model calls of handlers on any of Gradio's worker threads on one thread of its own (one
    OpenMP team: dynasd/explorer/model_thread.py), hands back results and exceptions, and a call made on that
    thread runs in place instead of waiting for itself."""
    import threading

    from ui import gpu

    settings = Settings(pair="tiny-random")
    seen = []

    def model_call(settings, tag):
        seen.append((tag, threading.get_ident(), threading.current_thread().name))
        if tag == "outer":
            return gpu.call(model_call, settings, "inner")
        if tag == "fails":
            raise ValueError("the pair says no")
        return tag

    callers = [threading.Thread(target=gpu.call, args=(model_call, settings, f"caller {n}")) for n in range(3)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert gpu.call(model_call, settings, "outer") == "inner"
    with pytest.raises(ValueError, match="the pair says no"):
        gpu.call(model_call, settings, "fails")
    assert len(seen) == 6 and len({ident for _, ident, _ in seen}) == 1, seen
    assert seen[0][2].startswith("dynasd-model") and threading.get_ident() != seen[0][1]


def test_a_finished_compare_redraws_the_summary_that_quotes_it():
    """The Summary quotes Compare's ratio for the run's settings: when Compare's table comes, the step on show is
    drawn again (before, the Summary said "not measured" until the step slider moved)."""
    import app

    demo = app.build_app("tiny-random")
    table = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "compare-table")
    redraws = [fn for fn in demo.fns.values() if (table._id, "change") in fn.targets
               and "summary" in {o.elem_id for o in fn.outputs}]
    assert [fn.fn.__name__ for fn in redraws] == ["on_show_step"]
