"""A run's speed figures have one owner (dynasd/explorer/measure/speed.py): one measured speed-up against ar, every
other number named for what it is, with why they differ; the cost view draws them as given."""
from __future__ import annotations

from dataclasses import replace

import pytest

from dynasd.decoders import make_decoder
from dynasd.explorer.measure.cost import MeasuredCosts, run_shape
from dynasd.explorer.measure.measured_here import KeptCompare, Measured
from dynasd.explorer.measure.speed import compared_speedup, run_speed
from dynasd.options import DecoderOptions
from viz.cost import cost_figure, cost_markdown

PROMPT = "the cat sat on the mat and the cat"
COSTS = MeasuredCosts({1: 0.010, 2: 0.011, 4: 0.013, 8: 0.017, 16: 0.025}, "2026-12-06 00:00", "by hand",
                      "this machine")


@pytest.fixture(scope="module")
def run(tiny_pair):
    decoder = make_decoder(tiny_pair, DecoderOptions(method="mcsd", k_config=(2, 2, 1)))
    decoder.start(tiny_pair.encode_prompt(PROMPT), 24, PROMPT)
    while not decoder.done:
        decoder.step()
    return decoder.run


@pytest.fixture(scope="module")
def costs(run):
    """This device's costs, measured (by hand) on the machine the run's steps were taken on."""
    return replace(COSTS, device=run.device)


def test_a_run_has_one_measured_speedup_its_own_steps_against_the_measured_ar_step(run, costs):
    speed = run_speed(run, costs)
    shape = run_shape(run)
    assert speed.measured == pytest.approx(shape.tokens_per_s * 0.010), "tokens / s times one measured ar step"
    assert speed.measured_step_s == pytest.approx(shape.tokens_per_step / shape.tokens_per_s)
    rows = max(round(shape.rows), 1)
    step_s = speed.costs.draft_per_forward_s * round(shape.draft_forwards) + speed.costs.verify_s(rows)
    assert speed.expected == pytest.approx(shape.tokens_per_step * 0.010 / step_s), "the cost model's, apart"
    said = speed.why_they_differ()
    assert f"**This run: {speed.measured:.2f}× ar, measured**" in said
    assert f"{speed.expected:.2f}× (expected)" in said and "Compare" not in said
    assert said.count("measured**") == 1, "one number is called the run's measurement"


def test_compares_number_is_named_for_what_it_is_and_only_for_the_same_settings(run, costs):
    controls = {"temperature": 0.0, "k_config": "2,2,1"}
    kept = KeptCompare("2026-12-06 00:10", "here", "tiny-random", dict(controls),
                       [Measured("ar", 100.0, 90.0, 110.0), Measured("mcsd", 50.0, 45.0, 55.0)])
    compared = compared_speedup(kept, "mcsd", controls)
    assert compared.speedup == pytest.approx(0.5) and not compared.within_noise
    assert compared_speedup(kept, "mcsd", {**controls, "k_config": "4,2,2,1"}) is None, "another tree: not this run"
    assert compared_speedup(kept, "ar", controls) is None
    said = run_speed(run, costs, compared).why_they_differ()
    assert "0.50× (measured by Compare on another run of each method**" in said and "2026-12-06 00:10" in said
    busy = compared_speedup(replace(kept, busy="measured on a busy machine: load 3.1 on 2 threads"), "mcsd",
                            controls)
    assert "load 3.1 on 2 threads" in run_speed(run, costs, busy).why_they_differ()


def test_without_measured_costs_or_on_another_machine_nothing_is_called_measured(run, costs):
    modelled = run_speed(run, None)
    assert modelled.measured is None and not modelled.costs_measured
    assert "No measured speed-up" in modelled.why_they_differ()
    assert "this run: measured" not in {t.name for t in cost_figure(modelled).data}
    elsewhere = run_speed(replace(run, device="another machine; target: x"), COSTS)
    assert elsewhere.measured is None and "another machine" in elsewhere.why_they_differ()
    assert elsewhere.scale == 1.0, "a measurement taken elsewhere scales nothing here"


def test_the_cost_view_draws_and_writes_the_owners_numbers(run, costs):
    speed = run_speed(run, costs)
    names = {t.name: t for t in cost_figure(speed).data}
    assert list(names["this run: measured"].y) == [round(speed.measured, 4)]
    assert list(names["this run: expected"].y) == [round(speed.expected, 4)]
    assert tuple(names[f"this device ({speed.rows} verify rows)"].y) == speed.curve_here
    text = cost_markdown(speed)
    assert speed.why_they_differ() in text and "Where would it pay?" in text
    assert "GPU-like" not in text, "no claim about a GPU: that is the Where view's, from measured costs"


def test_when_no_row_cost_pays_the_cost_view_says_which_part_is_too_dear(run, costs):
    """The draft alone, or the draft with the verify forward's cost before any row: the sentence names the one the
    numbers show, with the numbers (a draft measured beside the target, costing less than the tokens it wins, must
    not be called too dear on its own)."""
    won = lambda speed: speed.shape.tokens_per_step * speed.costs.ar_s  # noqa: E731
    shape = run_speed(run, costs).shape
    for draft_s, alone in ((1.2, True), (0.3, False)):  # the drafts against the ms the tokens win
        per_forward = draft_s * shape.tokens_per_step * 0.010 / shape.draft_forwards
        measured = replace(costs, timings={r: 0.010 + 0.05 for r in costs.timings} | {1: 0.010},
                           draft_timings={1: per_forward, 64: per_forward})
        speed = run_speed(run, measured)
        assert speed.break_even_row_cost is None
        text = cost_markdown(speed)
        drafts = speed.costs.draft_per_forward_s * speed.draft_forwards
        assert (drafts >= won(speed)) is alone
        assert ("The draft forwards alone cost more" in text) is alone
        assert ("already cost more than the tokens they win" in text) is not alone
