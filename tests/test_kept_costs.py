"""This device's costs check themselves: a calibration takes more than three rounds, interleaved over its row
counts, with the machine's load and the process's CPU time against wall time recorded beside it; one taken on a
busy machine is shown and not kept; and the first Step whose own verify ran far faster than the kept costs say
marks them contradicted, so the cost view measures again and says why instead of showing them."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dynasd.cache import CachedModel
from dynasd.explorer import engine
from dynasd.explorer.costs import cost, measuring
from dynasd.explorer.inputs import Settings
from dynasd.explorer.pairs import PairCache
from dynasd.explorer.sessions.calls import in_process

PROMPT = "Count to ten: one, two, three"
QUIET = cost.Conditions(load_average=0.2, threads=1, cpu_s=1.0, wall_s=1.0)


@pytest.fixture()
def pairs(tmp_path, monkeypatch):
    """A pair cache in a temporary folder; the other processes' CPU time is not read (the other test worker's would
    make every measurement busy): a test that wants a busy machine plants a load average or other processes' cores."""
    monkeypatch.setenv("DYNASD_CACHE", str(tmp_path))
    monkeypatch.setattr(cost, "cpu_counters", lambda: None)
    return PairCache(device="cpu")


SETTINGS = Settings(pair="tiny-random", method="mcsd", max_new_tokens=12)


def test_a_kept_cost_100x_too_slow_is_caught_by_the_first_step(pairs):
    pair = pairs.get(SETTINGS)
    ids = pair.encode_prompt(PROMPT)
    timings, _ = cost.measure_forwards(pair.target, ids)
    planted = cost.MeasuredCosts({rows: 100 * seconds for rows, seconds in timings.items()}, "2026-12-05 12:42",
                                 "planted", "this machine", conditions=QUIET)
    path = cost.costs_file(pair)
    cost.keep_costs(path, planted)
    assert measuring.calibrate_context(pairs, SETTINGS, ids).timings == planted.timings, "kept, and so shown"

    progress = in_process(pairs).send(engine.StartRun(SETTINGS, PROMPT, 1))  # a session's start, as the page makes it
    assert not progress.error and len(progress.steps) == 1
    assert cost.read_kept_costs(path).contradicted.startswith("step 0's own verify over ")

    shown = measuring.calibrate_context(pairs, SETTINGS, ids)
    assert not shown.kept and shown.timings[1] < planted.timings[1] / 10, "measured again, not the kept figure"
    assert shown.again_said().startswith("Measured again: the costs kept from 2026-12-05 12:42 UTC disagreed "
                                         "with this device's own steps: step 0's own verify"), shown.again_said()
    assert "\n" not in shown.again_said() and "**" not in shown.again_said(), "one plain line"
    assert shown.said().startswith("measured on this device at "), "the costs' own sentence says no more of it"


def test_a_step_slower_than_the_kept_line_or_outside_it_says_nothing_a_faster_one_does():
    timings = {1: 0.010, 4: 0.016, 16: 0.040}
    step = lambda index, rows, seconds: SimpleNamespace(index=index, root_rows=1, nodes=[None] * (rows - 1),  # noqa: E731
                                                        verify_seconds=seconds)
    assert cost.kept_forward_s(timings, 2) == pytest.approx(0.012)
    assert cost.disagreement(timings, [step(0, 4, 0.030), step(1, 40, 0.001)]) == ""
    assert cost.disagreement(timings, [step(2, 4, 0.012)]) == "", "within 1.5x"
    assert cost.disagreement(timings, [step(2, 4, 0.0085)]) == "", "1.88x: within the spread of honest costs"
    found = cost.disagreement(timings, [step(2, 4, 0.030), step(3, 2, 0.004)])
    assert found == "step 3's own verify over 2 rows took 4.00 ms where they say one forward over 2 rows takes " \
                    "12.00 ms (3.0x)"
    assert cost.disagreement(timings, [step(4, 1, 0.004)]).startswith("step 4's own verify over 1 row took 4.00 ms "
                                                                      "where they say one forward over 1 row takes")


def test_the_rounds_are_interleaved_over_the_row_counts_and_their_conditions_recorded(pairs, monkeypatch):
    pair = pairs.get(SETTINGS)
    forward, seen = CachedModel.forward, []

    def recording(self, committed, nodes, *args, **kwargs):
        seen.append(len(nodes))
        return forward(self, committed, nodes, *args, **kwargs)

    monkeypatch.setattr(CachedModel, "forward", recording)
    timings, conditions = cost.measure_forwards(pair.target, pair.encode_prompt(PROMPT), rows=(1, 4, 16))
    assert cost.CALIBRATION_ROUNDS > 3
    assert seen == [0] + [1, 4, 16] * cost.CALIBRATION_ROUNDS, "the context once, then round after round"
    assert sorted(timings) == [1, 4, 16]
    assert conditions.wall_s > 0 and conditions.cpu_s > 0 and conditions.threads >= 1


def test_the_ar_step_is_timed_after_one_row_forwards_and_read_as_the_models_ar_step(pairs, monkeypatch):
    """A one-row forward right after the sweep's widest one reads slower than ar's own steps, which follow ar
    steps: each round runs the target in with AR_STEP_RUN_IN one-row forwards and times the next; the cost model
    takes it as its ar step, the sweep's own one-row forward as a verify's floor; both are kept."""
    pair = pairs.get(SETTINGS)
    forward, seen = CachedModel.forward, []

    def recording(self, committed, nodes, *args, **kwargs):
        seen.append((self.model is pair.target, len(nodes)))
        return forward(self, committed, nodes, *args, **kwargs)

    monkeypatch.setattr(CachedModel, "forward", recording)
    timings, _ = cost.measure_models({"target": pair.target, "draft": pair.draft}, pair.encode_prompt(PROMPT),
                                     rows=(1, 4), rounds=2, ar_step_of="target")
    sweep = [(True, 1), (True, 4)] + [(True, 1)] * (cost.AR_STEP_RUN_IN + 1) + [(False, 1), (False, 4)]
    assert seen[2:] == sweep * 2 and cost.AR_STEP_RUN_IN >= 2
    assert sorted(timings) == sorted(["target", "draft", cost.AR_STEP]) and list(timings[cost.AR_STEP]) == [1]
    shape = SimpleNamespace(verify_rows=[], verify_seconds=[], draft_per_forward_s=None)
    costs = cost.costs_from(shape, {1: 0.010, 4: 0.016}, ar_step_s=0.008)
    assert costs.ar_s == 0.008 and costs.verify_floor_s == 0.010 and costs.verify_s(1) == pytest.approx(0.010)
    assert cost.costs_from(shape, {1: 0.010, 4: 0.016}).ar_s == 0.010, "costs kept before it: the sweep's forward"
    monkeypatch.setattr(cost, "load_average", lambda: 0.1)
    monkeypatch.setattr(CachedModel, "forward", forward)
    measured = measuring.calibrate_context(pairs, SETTINGS, pair.encode_prompt(PROMPT))
    assert measured.ar_step_s and cost.read_kept_costs(cost.costs_file(pair)).ar_step_s == measured.ar_step_s


def test_a_busy_measurement_with_nothing_kept_is_kept_said_busy_and_read_by_every_view_until_a_quiet_one(
        pairs, monkeypatch):
    """With no costs kept, a measurement on a busy machine is kept marked busy, so the next view reads the same
    table (one run, one expected figure) instead of measuring its own; a quiet measurement replaces it."""
    monkeypatch.setattr(cost, "load_average", lambda: 27.0)
    pair = pairs.get(SETTINGS)
    measured = measuring.calibrate_context(pairs, SETTINGS, pair.encode_prompt(PROMPT))
    assert measured.busy.startswith("measured on a busy machine: load 27.0 on ") and not measured.not_kept
    assert "**measured on a busy machine: load 27.0" in measured.said() and "measure again" in measured.said()
    again = measuring.calibrate_context(pairs, SETTINGS, pair.encode_prompt(PROMPT))
    assert again.kept and again.timings == measured.timings and again.busy == measured.busy, "the same table"
    asked = measuring.calibrate_context(pairs, SETTINGS, pair.encode_prompt(PROMPT), again=True)
    assert asked.busy and not asked.refused and not asked.kept, "measured again when asked: it replaces a busy one"
    monkeypatch.setattr(cost, "load_average", lambda: 0.1)
    monkeypatch.setattr(cost.Conditions, "busy_because", lambda self: "")
    quiet = measuring.calibrate_context(pairs, SETTINGS, pair.encode_prompt(PROMPT), again=True)
    assert not quiet.busy and cost.read_kept_costs(cost.costs_file(pair)).busy == "", "a quiet one replaces it"


def test_what_makes_a_machine_busy():
    assert cost.Conditions(2.7, 2, 3.0, 2.0).busy_because() == "measured on a busy machine: load 2.7 on 2 threads"
    assert cost.Conditions(1.9, 2, 3.0, 2.0).busy_because() == ""
    assert cost.Conditions(None, 1, 0.3, 1.0).busy_because().startswith("measured on a busy machine: this process "
                                                                        "ran 30% of the 1.00 s")
    assert cost.Conditions(None, 1, 0.3, 1.0, on_cpu=False).busy_because() == "", "a GPU's host thread may wait"


def test_costs_kept_without_their_conditions_are_measured_again(tmp_path):
    path = tmp_path / "old.json"
    path.write_text('{"timings": {"1": 1.05834}, "measured_at": "2026-12-05 12:42", "how": "x", "device": "y"}')
    assert cost.read_kept_costs(path) is None
    cost.keep_costs(path, cost.MeasuredCosts({1: 0.011}, "2026-12-05 13:00", "x", "y", conditions=QUIET))
    assert cost.read_kept_costs(path).conditions == QUIET
    assert cost.read_kept_costs(path).ar_step_s is None, "kept without one (a planted cost): the sweep's forward"
    kept = json.loads(path.read_text())
    del kept["ar_step_s"]
    path.write_text(json.dumps(kept))
    assert cost.read_kept_costs(path) is None, "kept before the ar step was timed apart: measured again"
    cost.keep_costs(path, cost.MeasuredCosts({1: 0.011}, "2026-12-07 13:00", "x", "y", conditions=QUIET,
                                             ar_step_s=0.009))
    assert cost.read_kept_costs(path).ar_step_s == 0.009
    kept = json.loads(path.read_text())
    kept["ar_step_run_in"] = cost.AR_STEP_RUN_IN - 3
    path.write_text(json.dumps(kept))
    assert cost.read_kept_costs(path) is None, "an ar step timed after another run-in: measured again"


def test_the_draft_is_timed_beside_the_target_and_a_runs_cost_model_reads_it(pairs, monkeypatch):
    """The draft's forwards are timed in the same interleaved rounds as the target's and kept with them, so a draft's
    share of a target forward compares two forwards taken in the same conditions (a run's own draft, timed while the
    page drew its last step, is not); a run's cost model reads a draft forward over its own tree's rows (the drafted
    nodes' parents) from that line, and says so."""
    from dataclasses import replace

    from dynasd.explorer.measure.speed import run_speed

    monkeypatch.setattr(cost, "load_average", lambda: 0.1)
    pair = pairs.get(SETTINGS)
    measured = measuring.calibrate_context(pairs, SETTINGS, pair.encode_prompt(PROMPT))
    assert sorted(measured.draft_timings) == sorted(measured.timings) == sorted(cost.CALIBRATION_ROWS)
    assert "rounds of target and draft forwards" in measured.how
    path = cost.costs_file(pair)
    cost.keep_costs(path, measured)
    kept = cost.read_kept_costs(path)
    assert kept.draft_timings == measured.draft_timings

    progress = engine.serve(pairs, engine.StartRun(SETTINGS, PROMPT, 4))
    run = replace(progress.run, steps=[recorded.step for recorded in progress.steps])
    warm = cost.warm_steps(run)
    parents = sum(len({n.parent for n in s.nodes if n.origin == "draft"}) for s in warm)
    shape = cost.run_shape(run)
    assert shape.draft_rows == pytest.approx(parents / sum(s.draft_forwards for s in warm))
    assert 1 <= shape.draft_rows < max(len(s.nodes) for s in warm), "a level's parents, not its children"
    speed = run_speed(run, kept)
    assert speed.costs.draft_per_forward_s == pytest.approx(cost.kept_forward_s(kept.draft_timings, shape.draft_rows))
    assert speed.draft_said == f"measured here beside the target, over {shape.draft_rows:.1f} rows"
    unmeasured = run_speed(run, replace(kept, draft_timings={}))
    assert unmeasured.costs.draft_per_forward_s == pytest.approx(shape.draft_per_forward_s)
    assert unmeasured.draft_said == "this run's own"


def test_other_processes_cores_meanwhile_make_a_measurement_busy():
    """A busy loop on one core beside a measurement: the kernel's counters over exactly its time say so, where a
    one-minute load average lags behind."""
    assert cost.Conditions(0.3, 2, 2.0, 1.0, others=0.9).busy_because() == (
        "measured on a busy machine: other processes kept 0.9 cores busy meanwhile, beside its 2 threads")
    assert cost.Conditions(0.3, 2, 2.0, 1.0, others=0.05).busy_because() == ""
    assert cost.others_between((10.0, 4.0), (13.0, 5.0), 2.0) == pytest.approx(1.0), "3 s busy, 1 its own, in 2 s"
    counters = cost.cpu_counters()
    assert counters is None or (counters[0] > 0 and counters[1] >= 0)


def test_a_busy_measurement_never_replaces_kept_quiet_costs(pairs, monkeypatch):
    """Measured again on a busy machine: the quiet costs kept earlier stay and are what the page reads, with a line
    saying the new measurement was refused; nothing is written."""
    pair = pairs.get(SETTINGS)
    planted = {"conditions": QUIET, "seconds": 0.010}

    def time_rounds(models, context_ids, rows=cost.CALIBRATION_ROWS, rounds=1, ar_step_of=None, **_):
        timings = {name: {n: [planted["seconds"] * n] * rounds for n in rows} for name in models}
        return {**timings, cost.AR_STEP: {1: [planted["seconds"]] * rounds}}, planted["conditions"]

    monkeypatch.setattr(measuring, "time_rounds", time_rounds)
    quiet = measuring.calibrate_context(pairs, SETTINGS, pair.encode_prompt(PROMPT))
    assert quiet.conditions.busy_because() == "" and cost.costs_file(pair).exists()
    kept_text = cost.costs_file(pair).read_text()
    planted.update(conditions=cost.Conditions(27.0, 1, 1.0, 1.0), seconds=0.030)  # 3x slower under the load
    again = measuring.calibrate_context(pairs, SETTINGS, pair.encode_prompt(PROMPT), again=True)
    assert again.timings == quiet.timings and again.measured_at == quiet.measured_at and again.kept
    assert again.refused.startswith("a new measurement at ") and "load 27.0" in again.refused
    assert again.again_said().startswith(f"Kept costs of {quiet.measured_at} UTC used: a new measurement at ")
    assert cost.costs_file(pair).read_text() == kept_text


def test_a_measurement_in_parts_says_how_long_counts_its_rounds_and_keeps_nothing_until_the_last(pairs,
                                                                                                monkeypatch):
    """Each calibration round is one part (one model call, from its state as data to the next: it pickles), the
    page can say how far it got, a measurement stopped between two parts keeps nothing, and the next one is said
    to take about as long as the last one here took."""
    import pickle

    monkeypatch.setattr(cost, "load_average", lambda: 0.1)
    monkeypatch.setattr(cost.Conditions, "busy_because", lambda self: "")
    pair = pairs.get(SETTINGS)
    ids = pair.encode_prompt(PROMPT)
    path = cost.costs_file(pair)
    first = measuring.start_measuring(pairs, SETTINGS, ids)
    assert first.rounds_left == cost.CALIBRATION_ROUNDS and not first.targets_left and not first.complete
    assert "the first measurement here, so no earlier one to time it by" in first.how_long()
    stopped = measuring.measure_part(pairs, SETTINGS, measuring.measure_part(pairs, SETTINGS, first))
    assert stopped.progress() == f"Measuring this pair's costs: round 2 of {cost.CALIBRATION_ROUNDS} done."
    assert stopped.device is None and not path.exists(), "stopped between two parts: nothing kept"
    resumed = pickle.loads(pickle.dumps(stopped))  # a part may run in another process (ZeroGPU)
    while not resumed.complete:
        resumed = measuring.measure_part(PairCache(device="cpu"), SETTINGS, resumed)
    kept = cost.read_kept_costs(path)
    assert resumed.device.timings == kept.timings and all(len(t) == cost.CALIBRATION_ROUNDS
                                                         for t in resumed.runs["target"].values())
    assert kept.seconds == pytest.approx(resumed.seconds) and kept.seconds > kept.conditions.wall_s > 0
    assert f"of {cost.CALIBRATION_ROUNDS} interleaved rounds of target and draft forwards" in kept.how
    standing = measuring.start_measuring(pairs, SETTINGS, ids)
    assert standing.complete and standing.device.kept and standing.how_long() == "", "kept costs stand: no parts"
    again = measuring.start_measuring(pairs, SETTINGS, ids, again=True)
    assert again.how_long() == (f"Measuring this pair's costs ({cost.CALIBRATION_ROUNDS} rounds): about "
                                f"{max(1, round(kept.seconds))} s (as long as the last measurement here took).")


def test_conditions_of_parts_add_their_times_and_keep_the_highest_load():
    parts = [cost.Conditions(0.5, 2, 1.0, 2.0, others=0.1), cost.Conditions(1.5, 2, 3.0, 2.0, others=0.5)]
    merged = cost.Conditions.merged(parts)
    assert (merged.load_average, merged.cpu_s, merged.wall_s) == (1.5, 4.0, 4.0)
    assert merged.others == pytest.approx(0.3)
    assert cost.Conditions.merged([parts[0], cost.Conditions(None, 2, 1.0, 1.0)]).others is None


def test_a_views_measurement_says_what_and_how_long_then_each_part_and_nothing_when_kept_costs_stand(pairs):
    """What a Learn view's handler yields while it measures (ui/measuring.py): the up-front line with the way to
    stop it, one line a part with the seconds so far; with the costs kept, no line and no model call but the first."""
    from ui.measuring import measured_in_parts

    run = SimpleNamespace(prompt_ids=list(range(5, 30)), new_token_ids=[7, 8])

    def lines(**asked):
        shown = measured_in_parts(run, SETTINGS, lambda line: line, **asked)
        said = []
        while True:
            try:
                said.append(next(shown))
            except StopIteration as done:
                return said, done.value

    said, measured = lines()
    assert said[0].startswith("→ Measuring this pair's costs (") and "**Stop measuring** ends it" in said[0]
    assert [line.split(" done.")[0] for line in said[1:]] == [
        f"→ Measuring this pair's costs: round {k} of {cost.CALIBRATION_ROUNDS}" for k in
        range(1, cost.CALIBRATION_ROUNDS)]
    assert all(line.endswith(" s so far.") for line in said[1:])
    assert measured.complete and measured.device is not None
    assert lines() == ([], lines()[1]) and lines()[1].device.kept, "kept costs stand: nothing to say"
    again, _ = lines(again=True)
    assert "about " in again[0] and "as long as the last measurement here took" in again[0]


def test_the_bigger_targets_progress_counts_only_those_this_measurement_takes():
    kept = cost.MeasuredCosts({1: 0.01}, "2026-12-07 00:00", "kept", "here")
    part = measuring.Measuring([1], targets={"kept one": kept, "first": kept}, targets_asked=("first", "second"),
                               targets_left=("second",))
    assert part.progress() == "Measuring the bigger targets: 1 of 2 done, next second."


def test_a_measured_draft_line_is_read_only_for_the_draft_kind_it_was_measured_for(pairs):
    """The calibration times the pair's default draft and keeps its kind: a run of the other draft kind gets no
    figure from that line (its own draft forwards speak for it), and a trace of draft kind "default" says by its
    draft label which draft it ran (the embedded pair's default is its feature draft, tiny-random's its token
    draft)."""
    from dynasd.options import FEATURE_DRAFT_MARK, DecoderOptions, draft_that_ran

    kept = cost.MeasuredCosts({1: 0.01}, "2026-12-07 00:00", "kept", "here", draft_timings={1: 0.002, 4: 0.003},
                              draft_kind="features")
    assert cost.draft_forward_s(kept, 1.0, "features") == 0.002
    assert cost.draft_forward_s(kept, 1.0, "tokens") is None and cost.draft_forward_s(kept, 1.0) is None
    path = cost.costs_file(pairs.get(SETTINGS))
    cost.keep_costs(path, replace_conditions(kept))
    assert cost.read_kept_costs(path).draft_kind == "features", "kept with its table"
    def config(method: str, kind: str) -> dict:  # a trace's config, as every decoder records it
        return {"options": DecoderOptions(method=method, draft_kind=kind).validate().to_record()}

    assert draft_that_ran("mcsd", config("mcsd", "default"),
                          f"{FEATURE_DRAFT_MARK} (1 layer + the target's hidden states)") == "features"
    assert draft_that_ran("mcsd", config("mcsd", "default"), "distilled draft (3 layers)") == "tokens"
    assert draft_that_ran("mcsd", config("mcsd", "features"), "") == "features"
    assert draft_that_ran("mcsd", config("mcsd", "tokens"), FEATURE_DRAFT_MARK) == "tokens", "asked for by name"
    assert draft_that_ran("pld", config("pld", "default"), FEATURE_DRAFT_MARK) == "tokens", "no draft model"
    assert draft_that_ran("mcsd", {"options": "not a record"}, FEATURE_DRAFT_MARK) == "tokens", "options unread"
    pair = pairs.get(SETTINGS)
    assert FEATURE_DRAFT_MARK in pair.feature_draft_label and FEATURE_DRAFT_MARK not in pair.draft_label
    path.unlink()  # (the planted table, quiet, would stand against a measurement the busy suite makes busy)
    measured = measuring.calibrate_context(pairs, SETTINGS, pair.encode_prompt(PROMPT))
    assert measured.draft_kind == pair.default_draft_kind, "the kind of the draft the calibration timed"


def replace_conditions(costs):
    from dataclasses import replace

    return replace(costs, conditions=QUIET, ar_step_s=0.01)
