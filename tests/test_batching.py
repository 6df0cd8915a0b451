"""Rows and batches: the sentence reads a calibration as memory-bound, compute-bound or both (hand-made numbers);
the batch-size model is the arithmetic its docstring states, falls with the batch and tends to tokens per step /
rows; the endpoint measures this device and labels the model as one."""
import json

import pytest

from dynasd.explorer.costs.cost import RunShape, costs_from
from dynasd.explorer.measure import batching
from dynasd.speed.step_cost import expected_speedup
from viz.batching import batching_figure

GPU_LIKE = {1: 1.0, 2: 1.0, 4: 1.01, 8: 1.02, 16: 1.05, 32: 1.1, 64: 1.2}
CPU_LIKE = {1: 1.0, 2: 1.9, 4: 3.8, 8: 7.5, 16: 15.0, 32: 30.0, 64: 60.0}
KNEE = {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.3, 16: 2.2, 32: 4.0, 64: 8.0}


def shape(tokens_per_step=3.0, rows=9.0, draft_s=0.0) -> RunShape:
    return RunShape(steps=4, tokens_per_step=tokens_per_step, rows=rows, draft_forwards=1.0, acceptance=0.5,
                    depth=4, draft_per_forward_s=draft_s, verify_rows=[9], verify_seconds=[1.0], tokens_per_s=1.0,
                    overhead_s=0.0)


def test_the_sentence_reads_the_regime_from_the_measurements():
    assert "memory-bound over the whole range" in batching.rows_sentence(GPU_LIKE)
    assert "compute-bound almost at once" in batching.rows_sentence(CPU_LIKE)
    knee = batching.rows_sentence(KNEE)
    assert "memory-bound up to about 8 rows" in knee and "over 64 rows 8.0x" in knee
    with pytest.raises(ValueError):
        batching.row_cost({2: 1.0})


def test_the_batch_model_is_its_stated_arithmetic_and_ends_below_ar():
    cost = batching.row_cost(KNEE)
    run = shape(tokens_per_step=3.0, rows=9.0, draft_s=0.1)
    costs = costs_from(run, KNEE, 0.1)
    points = batching.batch_speedups(costs, run)
    b1 = 3.0 * KNEE[1] / (0.1 + cost.forward_s(9))
    assert points[0] == (1, pytest.approx(b1)), "one sequence: the measured one-row forward against the step"
    assert points[0][1] == pytest.approx(expected_speedup(3.0, costs.step_s(9, 1), costs.ar_s)), "the cost model's"
    b4 = 3.0 * (KNEE[1] + 3 * cost.per_row_s) / (0.1 + cost.forward_s(36))
    assert dict(points)[4] == pytest.approx(b4), "ar's batch of 4 rows: the one-row forward and 3 rows more"
    speedups = [s for _, s in points]
    assert speedups == sorted(speedups, reverse=True) and speedups[0] > 1 > speedups[-1]
    assert speedups[-1] == pytest.approx(3.0 / 9.0, rel=0.1)
    stop = batching.break_even_batch(points)
    assert stop is not None and dict(points)[stop] < 1 <= dict(points)[stop // 2]
    text = batching.batch_sentence(points, run)
    assert text.startswith("**Model, not a measurement:**") and f"from a batch of {stop}" in text
    assert f"**{points[0][1]:.2f}× (expected)** for one sequence (the Cost model's figure)" in text
    figure = json.loads(batching_figure(cost, points).to_json())
    assert "MODEL" in json.dumps(figure["layout"]["annotations"])


def test_the_endpoint_measures_this_device_and_labels_the_model(explorer_url):
    from gradio_client import Client

    client = Client(explorer_url, verbose=False)
    tiny = dict(pair="tiny-random", method="mcsd", max_new_tokens=16)
    assert "nothing to measure" in client.predict(0, **tiny, api_name="/rows_and_batches")[1]
    for _ in range(3):  # a prompt no other test compares: the app and its kept Compares are shared by the suite
        client.predict(prompt="hello, rows and batches", **tiny, api_name="/step")
    figure, text = client.predict(1, **tiny, api_name="/rows_and_batches")
    assert text.startswith("On this device one target forward over 8 rows") and "Model, not a measurement" in text
    assert "For one sequence nothing was measured for this method" in text, "no Compare ran: nothing quoted"
    assert len(json.loads(figure["plot"])["data"]) == 3


def test_a_noisy_point_does_not_stretch_the_memory_bound_range():
    noisy = {**KNEE, 4: 5.0}
    assert batching.memory_bound_rows(noisy) == 2 and batching.memory_bound_rows(KNEE) == 8
