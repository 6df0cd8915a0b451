"""Compare runs its methods interleaved in chunks of steps (dynasd/explorer/measure/compare.py), so load falls on all of
them alike: the order rotates round by round, ar runs in every round (again from the prompt once its own run is
done) so each method's speed is a ratio against ar's chunk of the same round, with a range over those rounds; the
load is recorded, no winner is named within the noise (a row timed once is compared by its value), the counter
counts methods, and a busy machine is said to be one."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dynasd.explorer.inputs import Settings
from dynasd.explorer.measure import compare
from dynasd.explorer.measure.compare import CompareResult, CompareRow, PairedRatio, paired_ratio, rate_range
from dynasd.explorer.measure.measured_here import KeptCompare, Measured, fastest_recipe_here
from dynasd.explorer.pairs import PairCache
from dynasd.options import OPTIONS
from dynasd.recipes import RECIPES
from viz.compare import AGAINST_AR, AR_SAME_ROUNDS, compare_figure, compare_table
from viz.timeline import TOKENS_PER_S


def row(method: str, rate: float, low: float, high: float, parts: int = 5, forward: float = 1.0,
        ratio: tuple[float, float, float] | None = None, peer: bool = False) -> CompareRow:
    paired = None if ratio is None else PairedRatio(*ratio, pairs=parts)
    return CompareRow(method, True, True, rate, low, high, parts, forward, None, (), (), 10, 10, 0.0, True, peer,
                      paired)


CHUNK_STEPS = {"ar": 10, "sd": 2, "pld": 2}


@pytest.fixture(scope="module")
def rounds(tiny_pair):
    loads = iter([0.5, 0.7, 0.4, 0.9, 0.3] + [0.2] * 200)
    pairs = PairCache(loader=lambda *_, **__: tiny_pair)
    # chunks of fixed steps, not of fixed seconds, so that the rounds do not depend on how busy the machine is: ar's
    # many (its steps are the fastest, as timed), so that its own run ends first and its reference runs
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compare, "chunk_steps", lambda method_run: CHUNK_STEPS[method_run.method])
        states = list(compare.run_compare(pairs, Settings(pair="tiny-random", max_new_tokens=24), "the cat the cat",
                                          methods=("ar", "sd", "pld"), peer=False, load=lambda: next(loads)))
    return states


def test_every_round_gives_each_unfinished_method_one_chunk_in_a_rotated_order(rounds):
    final = rounds[-1]
    assert final.finished and final.rounds == len(rounds) >= 2
    for index in range(final.rounds):
        ran = [c.method for c in final.chunks if c.round == index]
        assert ran == [m for m in final.order(index) if m in ran], f"round {index} ran in its rotated order"
    assert final.order(1) == ["sd", "pld", "ar"] and final.order(3) == final.order(0)
    firsts = {min((c for c in final.chunks if c.round == i), key=final.chunks.index).method
              for i in range(min(final.rounds, 3))}
    assert len(firsts) > 1, "no method always goes first"
    for method, run in final.runs.items():
        chunks = [c for c in final.chunks if c.method == method and not c.repeat]
        assert sum(c.tokens for c in chunks) == len(run.run.new_token_ids) == 24
        assert sum(c.seconds for c in chunks) == pytest.approx(sum(s.seconds for s in run.run.steps))


def test_ar_is_timed_in_every_round_again_from_the_prompt_once_its_own_run_is_done(rounds):
    final = rounds[-1]
    for index in range(final.rounds):
        ars = [c for c in final.chunks if c.round == index and c.method == "ar"]
        assert len(ars) == 1, f"round {index} has one ar chunk to pair with"
    own_rounds = {c.round for c in final.chunks if c.method == "ar" and not c.repeat}
    reference = [c for c in final.chunks if c.method == "ar" and c.repeat]
    assert reference and all(c.round not in own_rounds for c in reference), "the reference runs after ar's own"
    assert final.repeats["ar"].run.prompt == final.runs["ar"].run.prompt
    timed = [c for c in final.chunks if c.cpu_seconds is not None]
    assert timed and all(c.call_seconds > 0 and c.cpu_seconds >= 0 for c in timed), "CPU time beside wall time"
    assert all(c.cpu_seconds is None for c in final.chunks if c.round == 0), "a call that prefilled is not timed"


def test_a_method_finished_early_runs_again_from_the_prompt_until_it_is_timed_long_enough(rounds, tiny_pair):
    """A fast method's whole run is a few tenths of a second: while another method still runs, it runs again from
    the prompt (timed only) until MIN_TIMED_S of its steps are timed, and those chunks count in its ratio."""
    final = rounds[-1]
    for method in ("sd", "pld"):
        own = [c for c in final.chunks if c.method == method and not c.repeat]
        again = [c for c in final.chunks if c.method == method and c.repeat]
        others_left = [r for r in range(max(c.round for c in own) + 1, final.rounds)
                       if any(c.round == r and not c.repeat for c in final.chunks if c.method != method)]
        assert {c.round for c in again} == set(others_left), f"{method} ran again in every round another ran"
        if again:
            assert final.repeats[method].run.prompt == final.runs[method].run.prompt
    assert any(c.repeat for c in final.chunks if c.method != "ar"), "one of the two finished before the other"
    paired = compare.compare_result(final).rows[1].against_ar
    assert paired.pairs == len([c for c in final.chunks if c.method == "sd"]), "its repeats count"

    pairs = PairCache(loader=lambda *_, **__: tiny_pair)
    with pytest.MonkeyPatch.context() as patch:  # timed long enough at once: only ar runs again
        patch.setattr(compare, "chunk_steps", lambda method_run: CHUNK_STEPS[method_run.method])
        patch.setattr(compare, "MIN_TIMED_S", 0.0)
        *_, timed = compare.run_compare(pairs, Settings(pair="tiny-random", max_new_tokens=24), "the cat the cat",
                                        methods=("ar", "sd", "pld"), peer=False, load=lambda: 0.1)
    assert {c.method for c in timed.chunks if c.repeat} == {"ar"}


def test_the_rows_are_ratios_against_ar_paired_by_round_then_tokens_per_s(rounds):
    final = rounds[-1]
    result = compare.compare_result(final)
    assert [r.method for r in result.rows] == ["ar", "sd", "pld"]
    assert result.load_average == 0.9, "the highest load read around any round"
    ar_of = {c.round: c for c in final.chunks if c.method == "ar"}
    for r in result.rows:
        chunks = [c for c in final.chunks if c.method == r.method]  # its repeats' too
        assert (r.low, r.high) == rate_range([(c.tokens, c.seconds) for c in chunks]) and r.parts == len(chunks)
        assert r.same_text_as_ar is True, "greedy sd and pld write ar's text"
        if r.method == "ar":
            assert r.against_ar is None and r.speed == 1.0
            continue
        paired = r.against_ar
        expected = paired_ratio([(c.tokens, c.seconds) for c in chunks],
                                [(ar_of[c.round].tokens, ar_of[c.round].seconds) for c in chunks])
        assert (paired.ratio, paired.low, paired.high, paired.pairs) == \
            (expected.ratio, expected.low, expected.high, len(chunks))
        assert paired.low <= paired.ratio <= paired.high
    table = compare_table(result)
    assert table[0]["timed in"].startswith(f"{result.rows[0].parts} chunks")
    assert list(table[1])[:5] == ["method", "same text as ar", AGAINST_AR, TOKENS_PER_S, AR_SAME_ROUNDS], \
        "ratios lead"
    # every chunk paired: the method's tokens / s over ar's in the same rounds is the ratio the table leads with
    for row, cells in zip(result.rows[1:], table[1:]):
        assert cells[TOKENS_PER_S] / cells[AR_SAME_ROUNDS] == pytest.approx(row.against_ar.ratio, rel=0.01)
    assert table[0][AR_SAME_ROUNDS] == "–"
    assert result.threads == torch.get_num_threads() and not result.busy, "a load under the threads is not busy"


def test_a_paired_ratio_cancels_what_both_rounds_share_and_its_range_comes_from_the_rounds():
    slow_round = [(10, 1.0), (10, 2.0), (10, 1.0), (10, 1.0)]  # the second round ran at half speed for both
    ar = [(20, 1.0), (20, 2.0), (20, 1.0), (20, 1.0)]
    paired = paired_ratio(slow_round, ar)
    assert paired.ratio == pytest.approx(0.5) and paired.low == pytest.approx(0.5) == paired.high
    noisy = paired_ratio([(10, 1.0), (12, 1.0), (8, 1.0), (11, 1.0)], [(20, 1.0)] * 4)
    assert noisy.low < noisy.ratio < noisy.high and noisy == paired_ratio([(10, 1.0), (12, 1.0), (8, 1.0),
                                                                          (11, 1.0)], [(20, 1.0)] * 4)
    once = paired_ratio([(10, 1.0)], [(20, 1.0)])
    assert (once.ratio, once.low, once.high, once.pairs) == (0.5, 0.5, 0.5, 1)
    by_cpu = paired_ratio([(10, 1.0)], [(20, 1.0)], [2.0], [2.0])
    assert by_cpu.by_cpu == pytest.approx(0.5) and not by_cpu.cpu_disagrees
    assert paired_ratio([(10, 1.0)], [(20, 1.0)], [4.0], [2.0]).cpu_disagrees, "CPU time says 0.25: outside"
    assert paired_ratio([], []) is None


def test_a_ratio_over_a_few_pairs_gets_students_t_range_wider_than_their_own_spread():
    """Three whole peer runs: a bootstrap of three stays within their own ratios; Student's t (two-sided 90%, two
    degrees of freedom) reaches past them, as a second Compare's ratio does."""
    own, ar = [(40, 1.0), (41, 1.0), (42, 1.0)], [(100, 1.0)] * 3
    few = paired_ratio(own, ar)
    half = 2.920 * 0.01 / 3 ** 0.5
    assert few.ratio == pytest.approx(0.41) and few.pairs == 3
    assert (few.low, few.high) == pytest.approx((0.41 - half, 0.41 + half)) and few.low < 0.40 and few.high > 0.42
    assert paired_ratio([(5, 1.0), (50, 1.0), (100, 1.0)], ar).low == 0.0, "a wide t range stops at nothing"
    many = paired_ratio(own * 3, ar * 3)  # nine pairs: the seeded bootstrap, within the pairs' own ratios
    assert 0.40 <= many.low < many.ratio < many.high <= 0.42


def test_a_range_is_the_spread_of_the_chunks_rates_seeded():
    parts = [(10, 1.0), (20, 1.0), (30, 1.0), (12, 1.0)]
    low, high = rate_range(parts)
    assert 10 <= low < 18 < high <= 30 and rate_range(parts) == (low, high)
    assert rate_range([(10, 1.0), (30, 1.0)]) == (10.0, 30.0), "two parts: their two rates"
    assert rate_range([(10, 2.0)]) == (5.0, 5.0)


def test_the_verdict_ranks_by_ratio_and_names_no_winner_within_the_noise():
    quiet = CompareResult([row("ar", 10.5, 9.8, 11.2), row("pld", 10.8, 10.1, 11.6, ratio=(1.03, 0.97, 1.09))],
                          6, 1.2, 2, True)
    close = compare.verdict(quiet)
    assert "No clear winner" in close and "Fastest here" not in close and "ar (1× ar (itself))" in close
    clear = compare.verdict(replace(quiet, rows=[row("ar", 10.5, 9.8, 11.2),
                                                 row("mcsd", 2.7, 2.5, 2.9, forward=2, ratio=(0.26, 0.24, 0.28))]))
    assert "Fastest here: **ar**" in clear and "No speculative method paid" in clear
    assert "mcsd needed the fewest target forwards" in clear and "0.26× ar (0.24–0.28 over 5 paired rounds)" in clear
    busy = replace(quiet, rows=[row("ar", 10.5, 9.8, 11.2), row("mcsd", 2.7, 2.5, 2.9, ratio=(0.26, 0.24, 0.28))],
                   load_average=2.7)
    assert busy.busy == "measured on a busy machine: load 2.7 on 2 threads"
    assert "Measured on a busy machine: load 2.7 on 2 threads" in compare.verdict(busy)
    assert "<b>busy: load 2.7 on 2 threads</b>" in compare_figure(busy).layout.title.text, "short on a phone"


def test_a_row_timed_once_is_compared_by_its_value_not_counted_as_tied():
    """pld 1.75x ar with its range above 1, the peer timed in one run at 0.15x: pld is the clear winner (a row timed
    once has a range of one value, and that value is far below pld's range)."""
    rows = [row("ar", 111.0, 87.4, 119.0), row("pld", 195.0, 140.0, 213.6, ratio=(1.75, 1.52, 1.98)),
            row("peer", 18.0, 18.0, 18.0, parts=1, ratio=(0.16, 0.16, 0.16), peer=True)]
    said = compare.verdict(CompareResult(rows, 6, 0.5, 2, True))
    assert said.startswith("Fastest here: **pld**, **1.75× ar (1.52–1.98 over 5 paired rounds)**, 195.0 tokens/s")
    once_near = rows[:2] + [row("peer", 190.0, 190.0, 190.0, parts=1, ratio=(1.6, 1.6, 1.6), peer=True)]
    assert "No clear winner" in compare.verdict(CompareResult(once_near, 6, 0.5, 2, True)), "1.6 is in pld's range"


def test_the_counter_counts_methods_started_and_finished_not_rows(rounds):
    middle = rounds[0]
    said, kind = compare.progress(middle, compare.compare_result(middle))
    assert kind == "info" and said.startswith("Round 1: 3 of 3 methods started, ")
    assert "drawn at the end" in said and "×" not in said and "tokens/s" not in said, "no speed while it measures"
    with_peer = replace(middle, peers=[object()])
    result = replace(compare.compare_result(middle), rows=compare.compare_result(middle).rows + [
        row("peer", 5.0, 5.0, 5.0, parts=1, peer=True)])
    assert "3 of 3 methods started" in compare.progress(with_peer, result)[0], "the peer's row is not a method"


def test_whole_peer_runs_go_between_the_rounds_spread_over_them():
    state = compare.CompareState(Settings(pair="tiny-random"), "hi", ("ar",), runs={"ar": compare.MethodRun("ar")})
    calls = []

    def fake_round(s):
        s = replace(s, rounds=s.rounds + 1)
        if s.rounds == 9:  # the run ends after 9 rounds
            s.runs["ar"].run = type("Run", (), {"finished": "eos"})()
        calls.append(("round", s.rounds))
        return s

    def fake_peer():
        calls.append(("peer", len(calls)))
        return object(), ""

    list(compare.interleaved(state, fake_round, fake_peer))
    peers_after = [calls[i - 1][1] for i, call in enumerate(calls) if call[0] == "peer"]
    assert peers_after == [1, 1 + compare.PEER_EVERY, 1 + 2 * compare.PEER_EVERY][:compare.PEER_RUNS]


def test_a_busy_compare_marks_no_recipe_fastest_here():
    label, values = next((label, values) for label, values in RECIPES.items() if values.get("method") == "pld")
    controls = {name: OPTIONS[name].record(value) for name, value in values.items() if name != "method"}
    kept = KeptCompare("2026-12-06 00:00", "here", "embedded", controls,
                       [Measured("pld", 50.0, 48.0, 52.0, 2.5, 2.4, 2.6, 6), Measured("ar", 20.0, 19.0, 21.0)])
    assert fastest_recipe_here(kept, {label: values}) == label, "a quiet machine's clear winner is marked"
    busy = replace(kept, busy="measured on a busy machine: load 3.0 on 2 threads")
    assert fastest_recipe_here(busy, {label: values}) is None


def test_a_finished_compare_is_kept_with_its_prompt_ratios_and_load(rounds, tmp_path, monkeypatch):
    from dynasd.device_info import machine_line
    from dynasd.explorer.measure.measured_here import compare_for

    monkeypatch.setenv("DYNASD_CACHE", str(tmp_path))
    final = rounds[-1]
    result = compare.compare_result(final)
    compare.keep(result, final)
    controls = final.settings.controls()
    machine = final.runs["ar"].run.device.partition(";")[0]
    assert machine == machine_line()
    kept = compare_for(machine, "tiny-random", "sd", {**controls, "method": "sd"}, "the cat the cat")
    sd = next(r for r in result.rows if r.method == "sd").against_ar
    assert kept is not None and kept.row("sd").ratio == sd.ratio and kept.row("sd").pairs == sd.pairs
    assert kept.load == result.load_said() and kept.prompt == "the cat the cat"
    assert compare_for(machine, "tiny-random", "sd", controls, "another prompt") is None


def test_the_chart_rounds_a_ratio_as_the_table_does_and_its_hover_gives_a_ratio_range():
    """0.8149 is "0.81×" in the table; rounded to 0.815 first it read "0.82×" on the bar. The hover's range is the
    ratio's, not the tokens / s range."""
    rows = [row("ar", 100.0, 95.0, 105.0), row("pld", 81.49, 75.0, 88.0, ratio=(0.8149, 0.7551, 0.8749))]
    result = CompareResult(rows, 6, 0.5, 2, True)
    bars = compare_figure(result).data[0]
    cell = compare_table(result)[1][AGAINST_AR]
    assert cell == "0.81× (0.76–0.87)" and list(bars.text) == ["1.00×", "0.81×"]
    assert bars.customdata[1].startswith("0.81× (0.76–0.87) ar") and "(75.0" not in bars.customdata[1]
