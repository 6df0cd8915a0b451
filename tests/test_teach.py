"""The teaching views say what the engine did: the recorded residual is the walk's, the acceptance chart's verdicts
are the walk's verdicts, a guided phase shows exactly what existed then, the cost arithmetic is right on numbers
worked by hand, the losslessness check passes exact samplers and fails biased ones, and links and examples
round-trip through the same checks as the controls."""
import copy
import json
from dataclasses import asdict

import pytest
import torch
from scipy.stats import chi2

import viz
from dynasd.decoders import make_decoder
from dynasd.explorer.costs import cost
from dynasd.explorer.inputs import Settings, UserError
from dynasd.explorer.lessons import losslessness, side_by_side
from dynasd.explorer.lessons.phases import shown_at, step_at_phase, step_phases
from dynasd.explorer.measure.speed import run_speed
from dynasd.explorer.pairs import PairCache
from dynasd.explorer.sessions import share
from dynasd.options import DecoderOptions
from dynasd.sampling import SamplingConfig
from dynasd.speed import step_cost
from dynasd.trace import TraceError, run_from_dict, run_to_dict
from viz.cost import cost_figure
from viz.guided import guided_figure
from viz.losslessness import losslessness_figure
from viz.residual import acceptance_figure, acceptance_rows, residual_figure

PROMPT = "hello there"
FIGURE_BYTES = 15_000


def run_of(pair, method, max_new_tokens=40, sampling=SamplingConfig(), **options):
    decoder = make_decoder(pair, DecoderOptions(method=method, **asdict(sampling), **options))
    return decoder.generate(pair.encode_prompt(PROMPT), max_new_tokens, PROMPT)


@pytest.fixture(scope="module")
def runs(tiny_pair):
    return {
        "greedy": run_of(tiny_pair, "mcsd", k_config=(4, 2, 2, 1)),
        "sampled": run_of(tiny_pair, "mcsd", k_config=(3, 2, 2), sampling=SamplingConfig(temperature=1.0)),
        "sd": run_of(tiny_pair, "sd", gamma=4, sampling=SamplingConfig(temperature=0.8)),
        "ti": run_of(tiny_pair, "ti-mcsd", width=3, depth=3, sampling=SamplingConfig(temperature=1.0)),
    }


def size(figure) -> int:
    return len(figure.to_json())


# -- the trace records what the walk did ----------------------------------------------------------------------------

def test_a_correction_records_the_residual_it_was_drawn_from(runs):
    corrected = [s for name in ("sampled", "sd") for s in runs[name].steps
                 if s.committed_origins and s.committed_origins[-1] == "correction"]
    assert corrected, "the sampled runs must contain corrections"
    for step in corrected:
        r = step.residual
        assert r is not None and step.committed[-1] in r.token_ids
        assert r.residual[r.token_ids.index(step.committed[-1])] > 0, "the correction had residual mass"
        if r.rejections == 1:  # one rejection: residual = max(p - q, 0) / Z, so where q >= p it is 0 ...
            gaps = [(p - q, res) for p, q, res in zip(r.p, r.q, r.residual)]
            assert all(res < 1e-6 for gap, res in gaps if gap <= 0)
            ratios = [res / gap for gap, res in gaps if gap > 1e-4]  # ... and elsewhere proportional to p - q
            assert max(ratios) == pytest.approx(min(ratios), rel=1e-3)
    bonus = [s for s in runs["sampled"].steps if s.committed_origins[-1] == "bonus"]
    assert all(s.residual is None for s in bonus)


def test_greedy_and_target_rooted_steps_record_no_residual_but_their_test_order(runs):
    assert all(s.residual is None for name in ("greedy", "ti") for s in runs[name].steps)
    for step in runs["greedy"].steps:
        tested = set(step.tested)
        assert tested == {i for i, n in enumerate(step.nodes) if n.status in ("accepted", "rejected")}
        assert [step.nodes[i].level for i in step.tested] == sorted(step.nodes[i].level for i in step.tested)


def test_the_new_fields_round_trip_and_bad_ones_are_refused(runs):
    run = runs["sampled"]
    back = run_from_dict(json.loads(json.dumps(run_to_dict(run))))
    assert [s.residual for s in back.steps] == [s.residual for s in run.steps]
    assert [s.tested for s in back.steps] == [s.tested for s in run.steps]
    obj = run_to_dict(run)
    index = next(i for i, s in enumerate(obj["steps"]) if s["residual"])
    for breakage in ({"p": [2.0]}, {"tokens": []}, {"context": 999}, {"secret": 1}):
        broken = copy.deepcopy(obj)
        broken["steps"][index]["residual"].update(breakage)
        if "p" in breakage:
            broken["steps"][index]["residual"]["p"] = [2.0] * len(broken["steps"][index]["residual"]["tokens"])
        with pytest.raises(TraceError):
            run_from_dict(broken)
    broken = copy.deepcopy(obj)
    broken["steps"][0]["tested"] = [0, 0]
    with pytest.raises(TraceError, match="test order"):
        run_from_dict(broken)


# -- residual and acceptance figures --------------------------------------------------------------------------------

def test_the_acceptance_chart_recomputes_every_verdict_the_walk_made(runs):
    rows = [r for name in ("sampled", "sd", "ti") for s in runs[name].steps for r in acceptance_rows(s)]
    assert any(r["accepted"] for r in rows) and any(not r["accepted"] for r in rows)
    for r in rows:
        assert r["accepted"] == (r["u"] < r["accept_probability"])
        assert r["accepted"] == (r["status"] in ("accepted", "unchosen"))
    step = runs["sampled"].steps[0]
    bars, draws = acceptance_figure(step, greedy=False).data
    assert list(draws.y) == [r["u"] for r in acceptance_rows(step)]


def test_the_residual_figure_marks_the_correction_and_greedy_says_why_there_is_none(runs):
    step = next(s for s in runs["sampled"].steps if s.residual)
    figure = residual_figure(step, greedy=False)
    p_bars, q_bars, residual_bars = figure.data
    assert list(residual_bars.y) == step.residual.residual and list(p_bars.y) == step.residual.p
    marked = [i for i, w in enumerate(residual_bars.marker.line.width) if w]
    assert [step.residual.token_ids[i] for i in marked] == [step.committed[-1]]
    greedy = residual_figure(runs["greedy"].steps[0], greedy=True)
    assert not greedy.data and "argmax" in greedy.layout.annotations[0].text
    assert max(size(figure), size(acceptance_figure(step, False))) < FIGURE_BYTES


# -- the guided step ------------------------------------------------------------------------------------------------

def test_a_tested_token_is_quoted_so_punctuation_reads_as_the_token(runs):
    """A comma printed bare read "(,, level 1)"; quoted it reads "(‘,’, level 1)"."""
    step = copy.deepcopy(runs["sampled"].steps[1])
    first = step.tested[0]
    step.nodes[first].token = ","
    test = next(p for p in step_phases(step) if p.kind == "test")
    assert f"Node {first} (‘,’, level {step.nodes[first].level})" in test.text, test.text


def test_phases_come_in_order_and_each_shows_only_what_existed_then(runs):
    step = runs["sampled"].steps[1]
    phases = step_phases(step)
    depth = max(n.level for n in step.nodes)
    assert [p.kind for p in phases] == ["draft"] * depth + ["mask"] + ["test"] * len(step.tested) + ["commit"]
    for phase in phases[:depth]:
        view = step_at_phase(step, phase)
        assert {n.level for n in view.nodes} == set(range(1, phase.level + 1))
        assert all(n.status == "pending" for n in view.nodes) and view.final_parent is None
        # drawn as drafted and waiting, not as "not reached", which would say the walk stopped above them
        assert "not reached" not in json.dumps(guided_figure(shown_at(step, phase), phase, None).to_plotly_json())
    for phase in phases[depth + 1:-1]:
        view = step_at_phase(step, phase)
        decided = {i for i, n in enumerate(view.nodes) if n.status != "pending"}
        assert decided <= set(step.tested[:phase.tests]) and step.tested[phase.tests - 1] in decided
    assert step_at_phase(step, phases[-1]) is step
    mask = guided_figure(step, phases[depth], None)
    assert mask.data[0].type == "heatmap"
    assert all(size(guided_figure(shown_at(step, p), p, None)) < FIGURE_BYTES for p in phases)


# -- the cost model's arithmetic ------------------------------------------------------------------------------------

def test_cost_arithmetic_on_hand_worked_numbers():
    assert step_cost.expected_speedup(3.0, step_s=0.02, ar_s=0.01) == pytest.approx(1.5)
    assert step_cost.chain_tokens_per_step(0.5, 2) == pytest.approx(1.75)
    assert step_cost.chain_tokens_per_step(1.0, 4) == 5.0
    # a step costing 1.75 ar steps on a depth-2 chain breaks even exactly at acceptance 0.5
    assert step_cost.break_even_acceptance(2, step_s=0.0175, ar_s=0.01) == pytest.approx(0.5, abs=1e-5)
    assert step_cost.break_even_acceptance(2, step_s=0.031, ar_s=0.01) is None  # more than 3 ar steps: never pays
    assert step_cost.break_even_acceptance(2, step_s=0.009, ar_s=0.01) == 0.0
    # 3 tokens per step at 10 ms each = 30 ms of budget; draft 8 ms + base 2 ms leave 20 ms for 40 rows
    assert step_cost.break_even_row_cost(3.0, 40, 0.008, 0.002, 0.01) == pytest.approx(0.0005)
    assert step_cost.break_even_row_cost(1.0, 40, 0.02, 0.0, 0.01) is None
    assert step_cost.fit_line([1, 2, 4], [3, 5, 9]) == pytest.approx((1.0, 2.0))
    assert step_cost.fit_line([5, 5], [1, 3]) == (2.0, 0.0)
    costs = step_cost.StepCosts(ar_s=0.01, verify_base_s=0.008, verify_per_row_s=0.001, draft_per_forward_s=0.002)
    assert costs.step_s(rows=20, draft_forwards=4) == pytest.approx(0.036)


def test_costs_come_from_the_calibration_or_else_from_the_run(runs):
    shape = cost.run_shape(runs["greedy"])
    calibrated = cost.costs_from(shape, {1: 0.010, 2: 0.011, 4: 0.013, 8: 0.017})
    assert calibrated.ar_s == 0.010 and calibrated.verify_per_row_s == pytest.approx(0.001)
    assert calibrated.verify_base_s == pytest.approx(0.009)
    own = cost.costs_from(shape, None)
    assert own.verify_s(round(shape.rows)) == pytest.approx(sum(shape.verify_seconds) / len(shape.verify_seconds),
                                                            rel=1e-6)
    numbers = cost.cost_numbers(shape, calibrated)
    assert numbers["predicted"] == pytest.approx(
        shape.tokens_per_step * 0.010 / calibrated.step_s(numbers["rows"], numbers["draft_forwards"]))
    assert numbers["free_rows"] > numbers["predicted"], "free verify rows can only help"
    measured = cost.MeasuredCosts({1: 0.010, 2: 0.011, 4: 0.013, 8: 0.017}, "2026-12-06 00:00", "by hand", "here")
    assert size(cost_figure(run_speed(runs["greedy"], measured))) < FIGURE_BYTES


def test_calibration_times_every_row_count_and_leaves_the_cache_as_it_was(tiny_pair):
    timings = cost.calibrate(tiny_pair.target, tiny_pair.encode_prompt(PROMPT), rows=(1, 4, 16), repeats=2)
    assert sorted(timings) == [1, 4, 16] and all(t > 0 for t in timings.values())


# -- the empirical losslessness check -------------------------------------------------------------------------------

P = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02])


def sampler(probs: torch.Tensor):
    def first(seed: int) -> int:
        return int(torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed)))
    return first


def test_an_exact_sampler_passes_and_a_biased_one_fails():
    exact = losslessness.check_samples(losslessness.sample_first_tokens(sampler(P), 1000), P)
    assert exact.p_value > 1e-3 and exact.total_variation < 0.05
    sharpened = P ** 1.5 / (P ** 1.5).sum()  # favours likely tokens, as picking the best of several chains does
    biased = losslessness.check_samples(losslessness.sample_first_tokens(sampler(sharpened), 1000), P)
    assert biased.p_value < 1e-3
    impossible = losslessness.check_samples([0] * 20 + [6] * 5, torch.tensor([0.8, 0.2, 0, 0, 0, 0, 0.0]))
    assert impossible.p_value == 0.0
    assert sum(exact.observed) == exact.samples == 1000 and sum(exact.expected) == pytest.approx(1.0)


def test_the_chi_square_tail_matches_scipy():
    for statistic, dof in ((3.2, 4), (20.0, 5), (0.5, 1), (40.0, 11)):
        assert losslessness.chi_square_sf(statistic, dof) == pytest.approx(chi2.sf(statistic, dof), rel=1e-6)


def test_one_speculative_step_samples_the_target_next_token(tiny_pair):
    sampling = SamplingConfig(temperature=1.0)
    ids = tiny_pair.encode_prompt(PROMPT)
    probs = losslessness.target_next_probs(tiny_pair.target, ids, sampling)
    decoder = make_decoder(tiny_pair, DecoderOptions(method="sd", gamma=3, temperature=1.0))
    draws = losslessness.sample_first_tokens(losslessness.decoder_first_token(decoder, ids), 300)
    check = losslessness.check_samples(draws, probs)
    assert check.p_value > 1e-3 and check.dof >= 2
    figure = losslessness_figure({"sd": check}, {t: str(t) for t in check.token_ids})
    assert list(figure.data[0].y) == [round(e, 5) for e in check.expected] and size(figure) < FIGURE_BYTES
    with pytest.raises(ValueError, match="samples"):
        losslessness.sample_first_tokens(sampler(P), 0)


# -- two methods on one step ----------------------------------------------------------------------------------------

def test_two_methods_from_the_same_prefix_continue_the_greedy_text(runs, tiny_pair):
    run = runs["greedy"]
    index = 2
    prefix = side_by_side.prefix_before(run, index)
    assert prefix[len(run.prompt_ids):] == [t for s in run.steps[:index] for t in s.committed]
    pairs = PairCache(loader=lambda *args, **kwargs: tiny_pair)
    both = side_by_side.side_by_side(pairs, Settings(pair="tiny-random", max_new_tokens=8), ("sd", "mcsd"), prefix,
                                     PROMPT)
    ahead = [t for s in run.steps[index:] for t in s.committed]
    for one in both.values():
        committed = one.steps[0].committed
        assert committed == ahead[:len(committed)], "at T = 0 every lossless method writes the target's text"
    with pytest.raises(UserError, match="two different"):
        side_by_side.side_by_side(pairs, Settings(pair="tiny-random"), ("sd", "sd"), prefix, PROMPT)
    with pytest.raises(UserError, match="no step"):
        side_by_side.prefix_before(run, len(run.steps))


# -- links and example traces ---------------------------------------------------------------------------------------

def test_a_link_round_trips_prompt_settings_and_step():
    settings = Settings(pair="tiny-random", method="sd", gamma=6, temperature=0.7, dynamic_depth=True,
                        stop="confidence").normalised()
    query = share.link_query("why is the sky blue?", settings.controls(), 5)
    assert "k_config" not in query, "defaults stay out of the link"
    from urllib.parse import parse_qsl

    prompt, back, step = share.settings_of_query({**dict(parse_qsl(query)), "__theme": "dark"})
    assert (prompt, back, step) == ("why is the sky blue?", settings, 5)
    assert share.settings_of_query({"__theme": "dark"}) == (None, None, None)


@pytest.mark.parametrize("params, message", [
    ({"prompt": "x", "temperature": "hot"}, "settings are not valid"),
    ({"prompt": "x", "step": "two"}, "whole number"),
    ({"prompt": "x", "step": "-1"}, "must lie in"),
    ({"prompt": "  "}, "prompt is empty"),
])
def test_a_bad_link_gets_one_clear_message(params, message):
    with pytest.raises(UserError, match=message):
        share.settings_of_query(params)


def test_the_shipped_examples_are_small_valid_traces():
    examples = share.example_traces()
    assert examples, "at least one example trace ships"
    for name, path in examples.items():
        assert path.stat().st_size <= 200_000
        run = share.load_example(name)
        assert run.steps and run.text
    with pytest.raises(UserError, match="no example"):
        share.load_example("nope")
    assert viz.tree_figure(run.steps[0]) is not None


def test_a_cost_line_never_has_a_negative_base_nor_a_cost_that_falls_with_more_rows():
    """Load on the few-row forwards gave "-49.36 + 45 × 9.910 ms" (a negative base); a forward over more rows read
    faster than one over fewer is noise and counts as the larger."""
    base, per_row = step_cost.fit_line([1, 2, 4, 8], [30.0, 2.0, 3.0, 5.0])
    assert base >= 0 and per_row >= 0
    assert step_cost.fit_line([1, 8, 16], [0.5, 0.1, 0.1]) == pytest.approx((0.5, 0.0)), "never falling: flat"
    base, per_row = step_cost.fit_line([8, 16, 32, 64], [1.0, 10.0, 30.0, 70.0])  # a negative intercept
    assert base == 0.0 and per_row == pytest.approx((8 * 1 + 16 * 10 + 32 * 30 + 64 * 70) / (64 + 256 + 1024 + 4096))
