"""The session's state machine (dynasd/explorer/sessions/controller.py) without Gradio: each learner action moves the
one Mode as its docstring says and returns one Outcome; the session stays data that pickles mid-Run and goes on in a
copy; a failing model call marks only its own session, bad input is a UserError."""
from dataclasses import replace

import pytest

from dynasd.explorer.failures import SessionFailed
from dynasd.explorer.inputs import Settings, UserError
from dynasd.explorer.pairs import PairCache
from dynasd.explorer.sessions.calls import in_process
from dynasd.explorer.sessions.controller import Controller, Show
from dynasd.explorer.sessions.session import Mode, Session

SETTINGS = Settings(pair="tiny-random", method="sd", max_new_tokens=8)


@pytest.fixture(scope="module")
def pairs(tiny_pair):
    return PairCache(loader=lambda *_, **__: tiny_pair)


def control(session: Session, pairs: PairCache) -> Controller:
    return Controller(session, in_process(pairs))


def test_step_starts_a_run_goes_on_and_asks_before_replacing_the_finished_one(pairs):
    session = Session("a")
    first = control(session, pairs).step(SETTINGS, "hello")
    assert session.mode is Mode.STEPPING and first.kind == "ok" and "Step 0 took" in first.said
    assert "started a new run" in first.said and first.show is Show.STEP
    while not session.done:
        control(session, pairs).step(SETTINGS, "hello")
    assert session.mode is Mode.FINISHED
    steps = len(session.run.steps)
    asked = control(session, pairs).step(SETTINGS, "hello")
    assert session.mode is Mode.REPLACE_ASKED and asked.show is Show.KEEP and "Press again" in asked.said
    assert len(session.run.steps) == steps, "the finished run stays on show"
    again = control(session, pairs).step(SETTINGS, "hello")
    assert session.mode is Mode.STEPPING and "in place of the finished one" in again.said
    assert len(session.run.steps) == 1


def test_the_pages_run_steps_on_request_and_stop_ends_it_after_the_step_in_progress(pairs):
    session = Session("b")
    settings = replace(SETTINGS, max_new_tokens=64)
    begun = control(session, pairs).run_begin(settings, "hello")
    assert session.mode is Mode.RUNNING and begun.more and session.run_in_progress
    with pytest.raises(UserError, match="Run is in progress"):
        control(session, pairs).step(settings, "hello")
    assert control(session, pairs).run_next().more
    assert control(session, pairs).stop().said is None, "the page said Stopping itself"
    assert session.mode is Mode.STOPPING
    ended = control(session, pairs).run_next()
    assert not ended.more and ended.said.startswith("Stopped after 2 steps")
    assert session.mode is Mode.STEPPING and not session.run_in_progress
    assert control(session, pairs).run_next().show is Show.NOTHING, "no step after the end"
    assert "Nothing is running" in control(session, pairs).stop().said


def test_a_stop_pressed_in_the_page_is_heard_with_its_request_and_the_late_stop_says_nothing(pairs):
    session = Session("c")
    control(session, pairs).run_begin(replace(SETTINGS, max_new_tokens=64), "hello")
    ended = control(session, pairs).run_next(stop_pressed=True)
    assert ended.said.startswith("Stopped after 1 steps") and session.mode is Mode.STOPPED_BY_PAGE
    late = control(session, pairs).stop()
    assert late.said is None and late.show is Show.KEEP and session.mode is Mode.STEPPING
    assert "stopped after 1 steps" in control(session, pairs).stop().said


def test_the_api_run_streams_to_the_end_and_reset_empties_the_session(pairs):
    session = Session("d")
    outcomes = list(control(session, pairs).run(SETTINGS, "hello", every_s=0.0))
    assert outcomes[-1].said.startswith("Done after") and session.mode is Mode.FINISHED and session.done
    emptied = control(session, pairs).reset()
    assert emptied.show is Show.EMPTY and session.mode is Mode.EMPTY and session.run is None


def test_a_session_pickled_mid_run_goes_on_in_a_copy_as_it_would_have_here(pairs):
    settings = replace(SETTINGS, max_new_tokens=24)
    here = Session("e")
    control(here, pairs).run_begin(settings, "hello")
    control(here, pairs).run_next()
    copy = Session.from_state(here.state())
    assert copy.mode is Mode.STEPPING and copy.run.steps == here.run.steps, "the copy goes on with Step or Run"
    while control(here, pairs).run_next().more:
        pass
    while not copy.done:
        control(copy, pairs).step(settings, "hello")
    assert copy.run.text == here.run.text and copy.mode is here.mode is Mode.FINISHED


def test_a_failing_model_call_fails_only_its_own_session_until_reset(pairs, fail_broken_runs):
    broken, healthy = Session("f"), Session("g")
    control(broken, pairs).step(SETTINGS, "broken")
    control(healthy, pairs).step(SETTINGS, "hello")
    fail_broken_runs()
    with pytest.raises(SessionFailed, match="CUDA out of memory"):
        control(broken, pairs).step(SETTINGS, "broken")
    assert broken.mode is Mode.FAILED and healthy.mode is Mode.STEPPING
    with pytest.raises(SessionFailed):  # the same settings and prompt: still failed
        control(broken, pairs).step(SETTINGS, "broken")
    assert control(healthy, pairs).step(SETTINGS, "hello").kind == "ok"
    control(broken, pairs).reset()
    assert control(broken, pairs).step(SETTINGS, "hello").kind == "ok" and broken.mode is Mode.STEPPING


def test_bad_input_is_a_user_error_and_leaves_the_mode_alone(pairs):
    session = Session("h")
    with pytest.raises(UserError, match="empty"):
        control(session, pairs).step(SETTINGS, "   ")
    with pytest.raises(UserError, match="at least 1"):
        control(session, pairs).step(replace(SETTINGS, k_config="4,0", method="mcsd"), "hi")
    assert session.mode is Mode.EMPTY
    with pytest.raises(UserError, match="step must lie"):
        control(session, pairs).goto_step(SETTINGS, "hi", 10**6)
    assert control(session, pairs).show_step(0).show is Show.EMPTY


def test_a_replayed_example_refuses_to_step_and_a_follow_up_waits_for_the_end(pairs):
    session = Session("i")
    shown = control(session, pairs).example("sd-sampled")
    assert session.mode is Mode.REPLAYING and shown.loaded is session.run and shown.index == 0
    with pytest.raises(UserError, match="trace file"):
        session.step(in_process(pairs))
    control(session, pairs).step(SETTINGS, "hello")
    with pytest.raises(UserError, match="after a finished run"):
        control(session, pairs).follow_up("and then?")


def test_a_run_starts_saying_what_this_devices_kept_costs_say_of_its_tree(pairs, tiny_pair, monkeypatch):
    """The start line's sentence on speed is Where would it pay?'s verdict on the kept costs, not a rule of thumb
    that could contradict that view; with nothing kept, the rule, said as one."""
    from dynasd.explorer.costs import cost
    from dynasd.explorer.costs.cost import Conditions, MeasuredCosts, costs_file, keep_costs
    from dynasd.explorer.measure import where

    wide = replace(SETTINGS, method="mcsd", k_config="4,2,2,1").normalised()
    path = costs_file(tiny_pair)
    path.unlink(missing_ok=True)
    keep_costs(path, MeasuredCosts({1: 0.010, 8: 0.014, 16: 0.018, 64: 0.050}, "2026-12-06 00:00", "by hand",
                                   "here", conditions=Conditions(0.1, 2, 1.0, 1.0)))
    monkeypatch.setattr(cost, "disagreement", lambda *_: "")  # kept by hand: a step here would contradict them
    try:
        session = Session("n")
        said = control(session, pairs).step(wide, "hello").said
        first = session.run.steps[0]
        expected = where.tree_sentence("mcsd", (4, 2, 2, 1), tiny_pair, first.draft_seconds / first.draft_forwards)
        assert expected.startswith("On this CPU this tree (45 verify rows, 4 draft forwards)")
        assert session.tree_note == expected and expected.rstrip(".") in said
        assert "expected to be slower than ar" not in said, "one sentence on speed, from the view"
    finally:
        path.unlink()
    session = Session("m")
    said = control(session, pairs).step(wide, "hello").said
    assert session.tree_note == "" and "On this CPU this tree" not in said
