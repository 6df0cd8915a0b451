"""Compare runs its methods interleaved in chunks of steps (dynasd/explorer/measure/compare.py), so load falls on all of
them alike: the order rotates round by round, each range comes from the chunks, the load is recorded, no winner is
named within the noise, and a busy machine is said to be one."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dynasd.explorer.inputs import Settings
from dynasd.explorer.measure import compare
from dynasd.explorer.measure.compare import CompareResult, CompareRow, rate_range
from dynasd.explorer.measure.measured_here import KeptCompare, Measured, fastest_recipe_here
from dynasd.explorer.pairs import PairCache
from dynasd.options import OPTIONS
from dynasd.recipes import RECIPES
from viz.compare import compare_figure, compare_table


def row(method: str, rate: float, low: float, high: float, parts: int = 5, forward: float = 1.0) -> CompareRow:
    return CompareRow(method, True, True, rate, low, high, parts, forward, None, (), (), 10, 10, 0.0, True)


@pytest.fixture(scope="module")
def rounds(tiny_pair):
    loads = iter([0.5, 0.7, 0.4, 0.9, 0.3] + [0.2] * 200)
    pairs = PairCache(loader=lambda *_, **__: tiny_pair)
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
        chunks = [c for c in final.chunks if c.method == method]
        assert sum(c.tokens for c in chunks) == len(run.run.new_token_ids) == 24
        assert sum(c.seconds for c in chunks) == pytest.approx(sum(s.seconds for s in run.run.steps))


def test_the_rows_are_numbers_measured_over_chunks_and_the_load_is_recorded(rounds):
    final = rounds[-1]
    result = compare.compare_result(final)
    assert [r.method for r in result.rows] == ["ar", "sd", "pld"]
    assert result.load_average == 0.9, "the highest load read around any round"
    for r in result.rows:
        chunks = [(c.tokens, c.seconds) for c in final.chunks if c.method == r.method]
        assert (r.low, r.high) == rate_range(chunks) and r.parts == len(chunks)
        assert r.same_text_as_ar is True, "greedy sd and pld write ar's text"
    assert compare_table(result)[0]["timed in"] == f"{result.rows[0].parts} chunks"
    assert result.threads == torch.get_num_threads() and not result.busy, "a load under the threads is not busy"


def test_a_range_is_the_spread_of_the_chunks_rates_seeded():
    parts = [(10, 1.0), (20, 1.0), (30, 1.0), (12, 1.0)]
    low, high = rate_range(parts)
    assert 10 <= low < 18 < high <= 30 and rate_range(parts) == (low, high)
    assert rate_range([(10, 1.0), (30, 1.0)]) == (10.0, 30.0), "two parts: their two rates"
    assert rate_range([(10, 2.0)]) == (5.0, 5.0)


def test_no_winner_is_named_within_the_noise_and_a_busy_machine_is_said_to_be_one():
    quiet = CompareResult([row("ar", 10.5, 9.8, 11.2), row("pld", 10.8, 10.1, 11.6)], 6, 1.2, 2, True)
    close = compare.verdict(quiet)
    assert "No clear winner" in close and "Fastest here" not in close and "ar (9.8–11.2)" in close
    clear = compare.verdict(replace(quiet, rows=[row("ar", 10.5, 9.8, 11.2), row("mcsd", 2.7, 2.5, 2.9, forward=2)]))
    assert "Fastest here: **ar**" in clear and "No speculative method paid" in clear
    assert "mcsd needed the fewest target forwards" in clear
    once = compare.verdict(replace(quiet, rows=[row("pld", 30.0, 29.0, 31.0), row("peer", 5.0, 5.0, 5.0, 1)]))
    assert "No clear winner" in once, "a row timed once has no range: it cannot be beaten within noise"
    busy = replace(quiet, rows=[row("ar", 10.5, 9.8, 11.2), row("mcsd", 2.7, 2.5, 2.9)], load_average=2.7)
    assert busy.busy == "measured on a busy machine: load 2.7 on 2 threads"
    assert "Measured on a busy machine: load 2.7 on 2 threads" in compare.verdict(busy)
    assert busy.busy in compare_figure(busy).layout.title.text


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
                       [Measured("pld", 50.0, 48.0, 52.0), Measured("ar", 20.0, 19.0, 21.0)])
    assert fastest_recipe_here(kept, {label: values}) == label, "a quiet machine's clear winner is marked"
    busy = replace(kept, busy="measured on a busy machine: load 3.0 on 2 threads")
    assert fastest_recipe_here(busy, {label: values}) is None
