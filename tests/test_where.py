"""Where would it pay? (dynasd/explorer/measure/where.py, targets.py): a run's step carried to other targets and a
GPU from given costs, checked against hand-computed values; the sentence about a tree is derived from the view; the
bigger targets' costs are measured once on this device, kept in the temporary cache, read back, and not kept when
busy."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dynasd.explorer.costs import measuring, targets
from dynasd.explorer.costs.cost import Conditions, MeasuredCosts, RunShape, costs_from
from dynasd.explorer.costs.targets import TargetShape
from dynasd.explorer.inputs import Settings
from dynasd.explorer.measure import where
from dynasd.explorer.measure.where import GpuModel, StepShape
from dynasd.explorer.pairs import PairCache
from dynasd.kernels.block_weights import block_kernel
from dynasd.speed.step_cost import chain_tokens_per_step, fit_line
from viz.where import where_figure, where_markdown

DEVICE = MeasuredCosts({1: 0.010, 8: 0.014, 16: 0.018}, "2026-12-06 00:00", "by hand", "here")
BIG = MeasuredCosts({1: 0.040, 8: 0.060, 16: 0.080}, "2026-12-06 00:00", "by hand", "here")
STEP = StepShape(rows=8, draft_forwards=3, depth=3, tokens_per_step=2.5, per_position=(0.8, 0.5, 0.2))
DRAFT = TargetShape("draft", 576, 3, 9, 3, 1536, 16384)
TINY = TargetShape("tiny", 64, 2, 4, 2, 128, 256)


def view(gpu_check=None):
    return where.where_it_pays("mcsd", STEP, 0.002, DEVICE, {"SmolLM2-1.7B": BIG}, DRAFT, gpu_check)


def test_each_row_gives_the_step_cost_draft_share_break_even_and_speedup_by_hand():
    here, big = view().rows[:2]
    base, per_row = fit_line([1.0, 8.0, 16.0], [0.010, 0.014, 0.018])
    assert here.step_s == pytest.approx(3 * 0.002 + base + 8 * per_row) and here.ar_s == 0.010
    assert here.expected == pytest.approx(2.5 * 0.010 / here.step_s) and here.draft_share == pytest.approx(0.2)
    assert chain_tokens_per_step(here.break_even, 3) == pytest.approx(here.step_s / 0.010, abs=1e-4)
    assert big.target == "SmolLM2-1.7B" and big.source == "measured costs, scaled from layers"
    big_base, big_per_row = fit_line([1.0, 8.0, 16.0], [0.040, 0.060, 0.080])
    assert big.step_s == pytest.approx(0.006 + big_base + 8 * big_per_row) and big.draft_share == pytest.approx(0.05)
    assert big.expected == pytest.approx(2.5 * 0.040 / big.step_s)
    assert where.forward_at(DEVICE.timings, 1) == 0.010, "one row: the measured one-row forward, as ar's step"
    assert where.forward_at(DEVICE.timings, 12) == pytest.approx(base + 12 * per_row), "beyond one row: the line"
    costs = costs_from(shape_of(rows=8), DEVICE.timings, 0.002)
    assert here.step_s == pytest.approx(costs.step_s(8, 3)), "as the Cost model reads the same calibration"


def shape_of(rows: int) -> RunShape:
    return RunShape(steps=2, tokens_per_step=2.5, rows=rows, draft_forwards=3, acceptance=0.5, depth=3,
                    draft_per_forward_s=0.002, verify_rows=[rows], verify_seconds=[0.01], tokens_per_s=1.0,
                    overhead_s=0.0)


def test_a_step_too_costly_for_its_depth_never_breaks_even():
    costly = where.where_row("t", "here", "measured", "", lambda n: 0.010 if n == 1 else 0.050, 0.001, STEP)
    assert costly.break_even is None, "5.3 ar steps a step: a depth-3 chain commits at most 4 tokens"


def test_the_gpu_row_is_a_labelled_model_whose_rows_are_free_and_draft_share_is_the_parameters_share():
    gpu = GpuModel(bandwidth=1e12, flops=100e12, bytes_per_weight=2)
    assert gpu.free_rows == 100 and gpu.forward_s(10**9, 1) == gpu.forward_s(10**9, 100) == pytest.approx(2e-3)
    assert gpu.forward_s(10**9, 200) == pytest.approx(4e-3), "compute-bound beyond the free rows"
    rows = [r for r in view().rows if r.device == "a GPU"]
    assert rows and all(r.modelled and r.source == "modelled" for r in rows)
    seventeen = next(r for r in rows if r.target == "SmolLM2-1.7B")
    assert seventeen.draft_share == pytest.approx(DRAFT.parameters / targets.BIGGER_TARGETS[1].parameters)
    assert any("modelled, not measured" in note for note in view().notes)


def test_a_gpu_check_results_file_replaces_the_model(tmp_path):
    path = tmp_path / "results.jsonl"
    records = [{"part": "tokens/s, bfloat16", "method": "sd:gamma=6", "draft_ms": 12.0},
               {"part": "verify cost against rows, bfloat16", "rows": 1, "ms": 20.0},
               {"part": "verify cost against rows, bfloat16", "rows": 64, "ms": 22.0}]
    path.write_text("\n".join(json.dumps(r) for r in records))
    check = where.read_gpu_check(path)
    assert check.target_s == {1: 0.020, 64: 0.022} and check.draft_s == pytest.approx(0.002)
    rows = view(check).rows
    assert not any(r.modelled for r in rows) and rows[-1].source == "measured by gpu_check"
    assert rows[-1].draft_share == pytest.approx(0.1)
    assert where.read_gpu_check(tmp_path / "none.jsonl") is None


def test_the_sentence_about_a_tree_is_derived_from_the_view():
    shown = view()
    said = where.tree_verdict(shown)
    here = shown.rows[0]
    assert f"expected at {here.expected:.2f}× ar" in said and f"{here.draft_share:.0%} of a target forward" in said
    assert "SmolLM2-1.7B-shaped target" in said and "(modelled)" in said and "measured by Compare" not in said
    faster = replace(shown, rows=[replace(here, expected=3.21)] + shown.rows[1:])
    assert "expected at 3.21× ar" in where.tree_verdict(faster), "a number changed in the view changes the sentence"
    not_run = where.where_it_pays("mcsd", replace(STEP, tokens_per_step=None), 0.002, DEVICE, {}, DRAFT)
    first = where.tree_verdict(not_run).split(";")[0]
    assert f"is expected to pay above acceptance {not_run.rows[0].break_even:.2f} per level" in first
    text = where_markdown(shown, said)
    assert said in text and "0.80 · 0.50 · 0.20" in text and "| SmolLM2-1.7B | a GPU | modelled |" in text
    assert "Nothing measured for this method, prompt and settings yet" in text
    assert all(f"{r.expected:.2f}× (expected)" in text for r in shown.rows), "every speed-up: expected"
    bars = where_figure(shown).data[0]
    assert len(bars.y) == len(shown.rows) and any(p == "/" for p in bars.marker.pattern.shape), "modelled: hatched"
    assert all(" expected (" in text for text in bars.text), "every bar is an expectation, and says so"


def test_scaled_shapes_read_the_line_through_their_depths():
    shape = replace(TINY, layers=10)
    assert targets.scaled_timings(shape, {1: {1: 1.0, 4: 2.0}, 3: {1: 2.0, 4: 4.0}}) == {1: 5.5, 4: 11.0}


@pytest.mark.skipif(block_kernel() is None, reason="no block kernel on this CPU")
def test_a_shapes_costs_are_measured_once_kept_and_a_busy_measurement_never_replaces_quiet_ones(tmp_path,
                                                                                              monkeypatch):
    """The bigger targets' costs follow the device's own rule (cost.settle), one part a shape (measuring.py):
    measured once and kept; a busy measurement with nothing kept is kept, marked busy, and read back like any other
    (every view one table); a quiet one asked for again replaces it; a busy one asked for again is refused while
    quiet costs are kept."""
    monkeypatch.setenv("DYNASD_CACHE", str(tmp_path))
    monkeypatch.setattr(measuring, "BIGGER_TARGETS", (TINY,))
    pairs, settings = PairCache(device="cpu"), Settings(pair="tiny-random", method="mcsd")
    # busy or not as the load handed in says: the other work on the machine (this process's CPU time against its
    # wall time) is not what is tested here, and on a loaded machine it made a quiet measurement busy
    busy_because = Conditions.busy_because
    monkeypatch.setattr(Conditions, "busy_because",
                        lambda self: busy_because(replace(self, cpu_s=self.wall_s, others=None)))
    measure = lambda shapes, load: targets.measure_targets(shapes, rows=(1, 4), rounds=2, context=8,  # noqa: E731
                                                           load=load)

    def tiny_costs(again: bool, load=None):
        """TINY's costs as Where would it pay? gets them; `load`: what measuring them now finds (None: refused)."""
        def measured_now(shapes):
            assert load is not None, "kept costs are read back, not measured again"
            return measure(shapes, lambda: load)
        monkeypatch.setattr(measuring, "measure_targets", measured_now)
        return where.where_costs(pairs, settings, list(range(5, 30)), again).targets[TINY.name]

    path = targets.target_costs_file(TINY)
    busy = tiny_costs(False, load=99.0)
    assert "busy machine: load 99.0" in busy.busy and path.exists(), "nothing kept: kept, marked busy"
    assert busy.seconds > 0, "how long it took, kept for the next time's estimate"
    assert path.resolve().is_relative_to(tmp_path.resolve()), "kept in the cache folder, beside the device's costs"
    read = tiny_costs(False)
    assert read.kept and read.busy and read.timings == busy.timings, "the busy table is the one every view reads"
    first = tiny_costs(True, load=0.0)
    assert sorted(first.timings) == [1, 4] and not first.kept and not first.busy, "a quiet one replaces it"
    again = tiny_costs(False)
    assert again.kept and again.timings == first.timings and not again.busy
    refused = tiny_costs(True, load=99.0)
    assert refused.timings == first.timings and "was refused: measured on a busy machine" in refused.refused
    assert tiny_costs(False).timings == first.timings, "quiet costs stay"
    monkeypatch.setattr(targets, "WHOLE_BYTES", 0)  # too big to build whole: a few layers, scaled
    scaled = measure((replace(TINY, name="tiny-scaled", layers=8),), lambda: 0.0)["tiny-scaled"]
    assert f"{targets.SCALED_DEPTHS[0]} and {targets.SCALED_DEPTHS[1]} real-shaped layers" in scaled.how
    assert "scaled to its 8 layers" in scaled.how and sorted(scaled.timings) == [1, 4]


def test_the_sentence_said_at_a_runs_start_reads_only_kept_costs(tiny_pair):
    from dynasd.explorer.costs.cost import Conditions, costs_file, keep_costs

    path = costs_file(tiny_pair)
    path.unlink(missing_ok=True)
    assert where.tree_sentence("mcsd", (2, 2, 1), tiny_pair, 0.002) == "", "nothing kept: nothing said"
    keep_costs(path, replace(DEVICE, conditions=Conditions(0.1, 2, 1.0, 1.0)))
    try:
        said = where.tree_sentence("mcsd", (2, 2, 1), tiny_pair, 0.002)
        view = where.where_of_tree("mcsd", (2, 2, 1), 0.002, where.kept_where_costs(tiny_pair))
        assert said == where.tree_verdict(view) and "(11 verify rows, 3 draft forwards)" in said
        assert view.rows[0].step_s == pytest.approx(3 * 0.002 + where.forward_at(DEVICE.timings, 11))
    finally:
        path.unlink()


def test_the_bigger_targets_note_says_when_they_were_measured_and_a_busy_table_or_a_refusal():
    said = lambda big: next(n for n in where.where_it_pays(  # noqa: E731
        "mcsd", STEP, 0.002, DEVICE, {"SmolLM2-1.7B": big}, DRAFT).notes if n.startswith("Bigger targets"))
    assert said(BIG).endswith("Measured at 2026-12-06 00:00 UTC.")
    busy = said(replace(BIG, busy="measured on a busy machine: load 3.0 on 2 threads"))
    assert "load 3.0 on 2 threads: kept as the one table until a measurement on a quiet machine" in busy
    refused = said(replace(BIG, refused="a new measurement at 2026-12-07 10:00 UTC was refused: busy"))
    assert refused.endswith("UTC; a new measurement at 2026-12-07 10:00 UTC was refused: busy.")
