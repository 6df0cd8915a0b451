"""The misconception lab: the correct rule's output is p (exactly, and within sampling noise when sampled), each
wrong rule's is clearly not, at a recorded rejection of the shipped example (fixed seeds); the sampler agrees with
each rule's exact distribution; a greedy run is told what the lab needs."""
import json

import numpy as np
import pytest

from dynasd.explorer.inputs import UserError
from dynasd.explorer.lessons import misconceptions as lab
from dynasd.explorer.sessions.share import load_example
from viz.misconceptions import lab_figure, lab_markdown

SAMPLES = 4000


def test_the_correct_rule_is_exactly_p_for_any_p_and_q_and_every_wrong_rule_is_not():
    rng = np.random.default_rng(3)
    for _ in range(50):
        p, q = rng.dirichlet(np.full(8, 0.5)), rng.dirichlet(np.full(8, 0.5))
        for k in (1, 2, 3):
            exact = lab._exact(0, p, q, k)
            assert abs(exact.sum() - 1) < 1e-12 and lab.total_variation(exact, p) < 1e-12
            for rule in range(1, len(lab.RULES)):
                assert abs(lab._exact(rule, p, q, k).sum() - 1) < 1e-12
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.1, 0.3, 0.6])
    assert all(lab.total_variation(lab._exact(rule, p, q), p) > 0.05 for rule in range(1, len(lab.RULES)))


def test_at_the_examples_clearest_rejection_correct_sits_on_p_and_each_wrong_rule_is_clearly_away():
    run = load_example("sd-sampled")
    step = lab.clearest_step(run)
    position = lab.position_of(run, step)
    results = lab.run_lab(position, SAMPLES, seed=0)
    noise = lab.sampling_noise(position, SAMPLES)
    correct, *wrong = results
    assert correct.correct and correct.exact_tv < 1e-9 and correct.sampled_tv < 3 * noise
    for result in wrong:
        assert result.exact_tv > 8 * noise and result.sampled_tv > 5 * correct.sampled_tv, result.name
        assert "biased" in result.verdict
    for result in results:  # the sampler draws what the exact distribution says
        assert lab.total_variation(result.counts / SAMPLES, result.exact) < 3 * noise, result.name
    again = lab.run_lab(position, SAMPLES, seed=0)
    assert all((a.counts == b.counts).all() for a, b in zip(results, again))


def test_the_figure_and_the_words_say_each_rule_and_its_verdict():
    run = load_example("sd-sampled")
    position = lab.position_of(run, 0)
    results = lab.run_lab(position, 1000)
    figure = json.loads(lab_figure(position, results, 1000).to_json())
    titles = [a["text"] for a in figure["layout"]["annotations"]]
    assert len(titles) == len(lab.RULES) and titles[0].startswith("✓") and all(t.startswith("✗") for t in titles[1:])
    text = lab_markdown(position, results, 1000, lab.clearest_step(run))
    assert "exact: its output is distributed as p" in text and text.count("biased") == len(lab.RULES) - 1
    assert "too small to see" in text and f"Step {lab.clearest_step(run)} shows them best" in text


def test_a_greedy_run_or_a_bad_sample_count_gets_one_clear_line():
    with pytest.raises(UserError, match="temperature above 0"):
        lab.position_of(load_example("mcsd-greedy"), 0)
    with pytest.raises(UserError, match="number of samples"):
        lab.run_lab(lab.position_of(load_example("sd-sampled"), 0), 10)


def test_the_lab_moves_to_a_position_where_the_biases_show():
    run = load_example("sd-sampled")
    assert lab.lab_position(run, 0, SAMPLES).step == lab.clearest_step(run)  # step 0's p is nearly certain
    assert lab.lab_position(run, 7, SAMPLES).step == 7
