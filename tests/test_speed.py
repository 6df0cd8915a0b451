"""A run's speed figures have one owner (dynasd/explorer/measure/speed.py): the one measured figure is Compare's ratio
against ar for the run's method, settings and prompt on this machine, quoted with its range, when and the load;
every other speed-up is the cost model's, labelled expected, and where the two differ beyond the range one sentence
says why; the run's own tokens / s are "as it happened". Every view reads them from there."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from dynasd.decoders import make_decoder
from dynasd.device_info import machine_line
from dynasd.explorer.costs.cost import MeasuredCosts, run_shape
from dynasd.explorer.inputs import Settings
from dynasd.explorer.measure import batching, where
from dynasd.explorer.measure.measured_here import KeptCompare, Measured, keep_compare, prompt_key
from dynasd.explorer.measure.speed import ComparedSpeedup, as_it_happened, compared_here, run_speed
from viz.cost import COMPARED, cost_figure, cost_markdown
from viz.timeline import summary_markdown

PROMPT = "the cat sat on the mat and the cat"
COSTS = MeasuredCosts({1: 0.010, 2: 0.011, 4: 0.013, 8: 0.017, 16: 0.025}, "2026-12-06 00:00", "by hand",
                      "this machine")
SETTINGS = Settings(pair="tiny-random", method="mcsd", k_config="2,2,1", max_new_tokens=24).normalised()
RATIO = re.compile(r"(\d+\.\d+)×")


@pytest.fixture(scope="module")
def run(tiny_pair):
    decoder = make_decoder(tiny_pair, SETTINGS.options.for_method())
    decoder.start(tiny_pair.encode_prompt(PROMPT), 24, PROMPT)
    while not decoder.done:
        decoder.step()
    return decoder.run


@pytest.fixture(scope="module")
def costs(run):
    """This device's costs, measured (by hand) on the machine the run's steps were taken on."""
    return replace(COSTS, device=run.device)


def kept(ratio=(0.50, 0.45, 0.55), controls=None, prompt=PROMPT, busy="") -> KeptCompare:
    return KeptCompare("2026-12-06 00:10", machine_line(), "tiny-random", dict(controls or SETTINGS.controls()),
                       [Measured("ar", 100.0, 90.0, 110.0), Measured("mcsd", 50.0, 45.0, 55.0, *ratio, 9)],
                       busy=busy, prompt=prompt, prompt_key=prompt_key(prompt), load="load 0.4 on 2 threads")


def test_without_a_compare_nothing_is_called_measured_and_the_model_is_expected(run, costs):
    speed = run_speed(run, costs)
    said = speed.why_they_differ()
    assert speed.compared is None and "Not measured yet" in said and f"{speed.expected:.2f}× (expected)" in said
    text = cost_markdown(speed)
    for figure in RATIO.finditer(text):
        after = text[figure.end():figure.end() + 14]
        assert after.startswith((" (expected)", " (expected)**", "** (expected)", " = ")) or "expected" in after, \
            f"every speed-up in the cost view is labelled expected: …{text[figure.start() - 40:figure.end() + 20]}…"
    assert "measured by Compare" not in text and COMPARED not in {t.name for t in cost_figure(speed).data}
    assert speed.scale == 1.0, "nothing measured: nothing scales the best-tree chart"


def test_compares_ratio_is_quoted_only_for_this_machine_method_settings_and_prompt(run, tmp_path, monkeypatch):
    monkeypatch.setenv("DYNASD_CACHE", str(tmp_path))
    controls = SETTINGS.controls()
    assert compared_here(run, controls, "tiny-random") is None, "nothing kept yet"
    keep_compare(kept(controls={**controls, "k_config": "4,2,2,1"}))
    assert compared_here(run, controls, "tiny-random") is None, "another tree: not this run's settings"
    keep_compare(kept(prompt="another prompt"))
    assert compared_here(run, controls, "tiny-random") is None, "another prompt: not this run's text"
    keep_compare(kept(controls={**controls, "method": "pld"}))  # Compare pressed with another method selected
    quoted = compared_here(run, controls, "tiny-random")
    assert quoted is not None and (quoted.ratio, quoted.low, quoted.high, quoted.pairs) == (0.50, 0.45, 0.55, 9)
    assert compared_here(run, controls, "embedded") is None, "another pair"
    assert compared_here(replace(run, method="ar"), controls, "tiny-random") is None, "ar has no speed-up to quote"
    said = quoted.said()
    assert said.startswith("**0.50× ar, measured by Compare** (0.45–0.55 over 9 paired rounds with ar")
    assert "2026-12-06 00:10 UTC, load 0.4 on 2 threads" in said


def test_a_model_outside_compares_range_says_why_in_one_sentence_with_the_step_times(run, costs):
    model = run_speed(run, costs)
    far = ComparedSpeedup(model.expected / 2, model.expected / 2.2, model.expected / 1.8, 9, "2026-12-06 00:10",
                          "load 0.4 on 2 threads", tokens_per_s=50.0, ar_tokens_per_s=100.0)
    speed = run_speed(run, costs, far)
    said = speed.why_they_differ()
    assert said.startswith("This run's method: **") and said.count(".") >= 1
    assert "above Compare's range: the model counts a step as its draft and verify forwards" in said
    # beside the model's step, Compare's step of the method (this run's tokens a step at Compare's 50 tokens / s),
    # not this run's own (timed while the page drew it)
    compare_step = speed.shape.tokens_per_step / 50.0
    assert f"{speed.step_s * 1000:.1f} ms, where Compare's steps of this method took {compare_step * 1000:.1f} ms" \
        in said
    assert "where Compare's ar steps took 10.00 ms" in said, "ar's step by Compare (100 tokens/s) against one forward"
    assert speed.scale == pytest.approx(far.ratio / speed.expected), "the best-tree chart is scaled to Compare"
    near = replace(far, low=model.expected * 0.9, high=model.expected * 1.1)
    agreeing = run_speed(run, costs, near)
    assert agreeing.why_they_differ().endswith("within Compare's range.") and agreeing.scale == 1.0


def test_the_cost_view_draws_compare_with_its_range_beside_the_model(run, costs):
    compared = ComparedSpeedup(0.5, 0.45, 0.55, 9, "2026-12-06 00:10", "load 0.4 on 2 threads")
    speed = run_speed(run, costs, compared)
    names = {t.name: t for t in cost_figure(speed).data}
    assert list(names["this run: expected"].y) == [round(speed.expected, 4)]
    mark = names[COMPARED]
    assert list(mark.y) == [0.5] and mark.error_y.array[0] == pytest.approx(0.05)
    assert mark.error_y.arrayminus[0] == pytest.approx(0.05)
    assert tuple(names[f"this device, {speed.rows} verify rows (expected)"].y) == speed.curve_here
    text = cost_markdown(speed)
    assert text.startswith(speed.why_they_differ()), "the measurement and the model lead"
    assert text.index("measured by Compare") < text.index("tokens/s, this run as it happened")
    assert "GPU-like" not in text, "no claim about a GPU: that is the Where view's, from measured costs"


def test_the_summary_quotes_compare_first_and_the_runs_own_rate_as_it_happened(run):
    happened = as_it_happened(run)
    assert happened.tokens_per_s == pytest.approx(len(run.new_token_ids) / sum(s.seconds for s in run.steps))
    bare = summary_markdown(run)
    assert "– (not measured: Compare)" in bare and f"| {happened.tokens_per_s:.1f} |" in bare
    assert "this run as it happened" in bare and "measured by Compare" not in bare
    compared = ComparedSpeedup(0.5, 0.45, 0.55, 9, "2026-12-06 00:10", "load 0.4 on 2 threads")
    quoted = summary_markdown(run, compared=compared)
    assert "| 0.50× ar (0.45–0.55), measured by Compare |" in quoted and compared.said() in quoted
    header = next(line for line in quoted.splitlines() if line.startswith("| steps"))
    assert header.index("speed-up over ar") < header.index("tokens / s, as it happened"), "ratios lead"


@pytest.mark.parametrize("ar_step_s", [None, 0.008])
def test_rows_and_batches_and_where_expect_for_this_run_what_the_cost_model_expects(run, costs, ar_step_s):
    """One run, one expectation: the batch model for one sequence and Where's row for this device are the Cost
    model's figure (with an ar step timed apart too), and Rows and batches quotes Compare beside it."""
    costs = replace(costs, ar_step_s=ar_step_s)
    speed = run_speed(run, costs)
    view = batching.rows_and_batches(run, costs)
    assert view.points[0][1] == pytest.approx(speed.expected)
    assert f"**{speed.expected:.2f}× (expected)** for one sequence" in view.text
    assert "nothing was measured for this method" in view.text
    compared = ComparedSpeedup(0.5, 0.45, 0.55, 9, "2026-12-06 00:10", "load 0.4 on 2 threads")
    assert compared.said() in batching.rows_and_batches(run, costs, compared).text
    carried = where.where_of_run(run, where.WhereCosts(costs, {}, None), compared)
    assert carried.rows[0].expected == pytest.approx(speed.expected)
    assert carried.compared is compared and "0.50× ar (0.45–0.55), measured by Compare" in where.tree_verdict(carried)
    assert run_shape(run).tokens_per_step == speed.shape.tokens_per_step


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


def test_a_replayed_or_modelled_run_is_never_called_measured(run):
    modelled = run_speed(run, None)
    assert not modelled.costs_measured and "Not measured yet" in modelled.why_they_differ()
    assert "modelled from this run's own verify times" in cost_markdown(modelled)
    elsewhere = run_speed(replace(run, device="another machine; target: x"), COSTS)
    assert elsewhere.elsewhere and "another machine" in cost_markdown(elsewhere)


def test_the_ar_step_is_said_as_it_was_timed(run, costs):
    """Costs with an ar step timed as ar runs (after one-row forwards) price ar with it and say so; costs kept
    without one price it with the sweep's one-row forward, which a verify is never below either way."""
    timed = run_speed(run, replace(costs, ar_step_s=0.008))
    assert timed.costs.ar_s == 0.008 and timed.costs.verify_s(1) >= 0.010
    assert "**One ar step** (a one-row target forward after one-row ones, as ar runs them) takes **8.00 ms**" \
        in cost_markdown(timed)
    sweep = run_speed(run, costs)
    assert sweep.costs.ar_s == 0.010 and "**One ar step** (a one-row target forward) takes **10.00 ms**" \
        in cost_markdown(sweep)
    assert timed.expected < sweep.expected, "a cheaper ar step makes the same steps less of a speed-up"
