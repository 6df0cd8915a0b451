"""The best static tree (dynasd/speed/tree_search.py, `dynasd best-tree`): expected tokens from an acceptance vector,
every k-config within a budget searched, and the command's choice checked against what it measures."""
import json

import pytest
from test_metrics import node, step

from dynasd import cli
from dynasd.speed.step_cost import StepCosts
from dynasd.speed.tree_search import (
    acceptance_vector,
    best_by_budget,
    evaluate,
    expected_tokens,
    passes_one,
    rank_counts,
    shapes_within,
)
from dynasd.tree import TreeShape

FREE_ROWS = StepCosts(ar_s=1.0, verify_base_s=1.0, verify_per_row_s=0.0, draft_per_forward_s=0.0)


def test_expected_tokens_by_hand():
    """p = (0.5, 0.2): one candidate passes half the time, two 1 - 0.5 * 0.8 = 0.6 of the time; a (2, 1) tree
    commits 1 + 0.6 + 0.6 * 0.5 tokens; a rank past the vector adds nothing."""
    p = [0.5, 0.2]
    assert passes_one(p, 1) == 0.5 and passes_one(p, 2) == pytest.approx(0.6) and passes_one(p, 5) == passes_one(p, 2)
    assert expected_tokens((2, 1), p) == pytest.approx(1 + 0.6 + 0.3)
    assert expected_tokens((1, 1, 1), [1.0]) == 4.0


def test_every_shape_within_the_budget_and_no_other():
    shapes = list(shapes_within(6, 3, 3))
    assert len(shapes) == len(set(shapes))
    assert all(TreeShape(s).num_nodes <= 6 and len(s) <= 3 and max(s) <= 3 for s in shapes)
    brute = [(a,) for a in range(1, 4)] + [(a, b) for a in range(1, 4) for b in range(1, 4)] + \
            [(a, b, c) for a in range(1, 4) for b in range(1, 4) for c in range(1, 4)]
    assert set(shapes) == {s for s in brute if TreeShape(s).num_nodes <= 6}


def test_free_rows_favour_the_deepest_tree_and_costly_rows_a_narrow_one():
    """With verify rows free (a GPU, roughly) more nodes never hurt; when each row costs as much as an ar step,
    the best tree stays small. The best speed-up can only grow with the budget."""
    p = [0.7, 0.3, 0.1]
    free = best_by_budget(p, FREE_ROWS, 30, 6)
    assert free[-1].tokens_per_step == max(c.tokens_per_step for c in free)
    costly = best_by_budget(p, StepCosts(1.0, 1.0, 1.0, 0.1), 30, 6)
    assert costly[-1].nodes < free[-1].nodes
    assert all(a.speedup <= b.speedup for a, b in zip(costly, costly[1:]))
    c = evaluate((2, 1), p, StepCosts(1.0, 1.0, 1.0, 0.1), overhead_per_node_s=0.5)
    assert c.step_s == pytest.approx(2 * 0.1 + 1.0 + 5 * 1.0 + 4 * 0.5) and c.nodes == 4  # 4 nodes + the root row


def test_measured_draft_timings_price_each_level_by_the_rows_it_reads():
    """Without measured timings every draft forward costs the run's average; with them, the first forward reads the
    root (1 row) and each further one the level above: (4, 2) reads 1 then 4 rows, a chain (1, 1, 1) 1 row three times,
    and a wide level costs a chain more than the average would say."""
    line = StepCosts(1.0, 1.0, 0.0, 0.1, draft_timings=((1, 0.06), (4, 0.09), (16, 0.21)))  # on 0.05 + 0.01 a row
    assert line.tree_draft_s([4, 8]) == pytest.approx((0.05 + 0.01) + (0.05 + 0.04))
    assert line.tree_draft_s([1, 1, 1]) == pytest.approx(3 * 0.06)
    assert StepCosts(1.0, 1.0, 0.0, 0.1).tree_draft_s([4, 8]) == pytest.approx(0.2)
    wide, chain = evaluate((4, 2), [0.5], line), evaluate((1, 1), [0.5], line)
    assert wide.step_s == pytest.approx(0.06 + 0.09 + 1.0) and chain.step_s == pytest.approx(2 * 0.06 + 1.0)


def test_the_acceptance_vector_counts_each_rank_after_the_earlier_ones_were_rejected():
    """Two steps of a 3-wide level: in the first the second candidate passes (rank 1 rejected, rank 2 accepted);
    in the second the first passes and the others are never tested."""
    tree = [node(-1, 1, status="rejected"), node(-1, 1, status="accepted"), node(-1, 1, status="not_reached")]
    first = step(0, tree, [1], [7, 7])
    first.tested = [0, 1]
    second = step(1, [node(-1, 1, status="accepted"), node(-1, 1, status="not_reached"),
                      node(-1, 1, status="not_reached")], [0], [7, 7])
    second.tested = [0]
    assert rank_counts([first, second]) == ([2, 1], [1, 1])
    assert acceptance_vector([first, second], min_tests=1) == [0.5, 1.0]
    assert acceptance_vector([first, second], min_tests=2) == [0.5]


def test_best_tree_measures_searches_checks_and_writes_a_recipe(tiny_pair, tmp_path, capsys, monkeypatch):
    """The command end to end on the tiny pair: the table, the check against ar and a recipe file whose bench
    spec is the chosen tree."""
    monkeypatch.setattr("dynasd.speed.best_tree.load_pair_from", lambda args: tiny_pair)
    prompts = tmp_path / "q.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [text]}) + "\n"
                               for i, text in enumerate(["Tell me a story about a cat.", "Write a poem."])))
    out = tmp_path / "best.json"
    assert cli.main(["best-tree", "--prompts", str(prompts), "--budget", "12", "--max-new-tokens", "24",
                     "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    record = json.loads(out.read_text())
    assert f"mcsd k={record['shape']}" in printed and "expected" in printed and "measured" in printed
    assert record["nodes"] <= 12 and record["measured_speedup"] > 0 and record["acceptance_vector"]
    assert cli.main(["recipes", "--file", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"mcsd:k={record['shape']}"


def test_a_bad_recipe_file_gets_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    for text in ("{", json.dumps({"key": "x", "label": "y", "own": {"method": "mcsd", "k_config": "0,2"}}),
                 json.dumps({"key": "x", "label": "y", "own": {"method": "mcsd", "colour": 3}})):
        bad.write_text(text)
        assert cli.main(["recipes", "--file", str(bad)]) == 2
        error = capsys.readouterr().err
        assert error.startswith("error: ") and error.count("\n") == 1 and "Traceback" not in error


def test_the_learn_view_marks_the_runs_tree_against_the_best_for_each_budget(tiny_pair):
    """Learn → Cost model's second chart: the best expected speed-up for budgets 1..64 never falls, and an mcsd
    run's own tree sits on or under the line at its node count (the search saw that shape too)."""
    from dynasd.decoders import make_decoder
    from dynasd.explorer.costs.trees_by_budget import BUDGET_NODES, best_trees
    from dynasd.options import DecoderOptions
    from viz.cost import budget_figure

    run = make_decoder(tiny_pair, DecoderOptions(method="mcsd", k_config=(3, 2))).generate(
        tiny_pair.encode_prompt("Tell me a story about a cat."), 48)
    costs = StepCosts(ar_s=0.01, verify_base_s=0.01, verify_per_row_s=0.001, draft_per_forward_s=0.004)
    figure = budget_figure(best_trees(run, costs))
    line, own = figure.data[0], figure.data[1]
    assert len(line.y) == BUDGET_NODES and all(a <= b for a, b in zip(line.y, line.y[1:]))
    assert own.name == "this run's tree k=3,2" and own.x[0] == 9 and own.y[0] <= line.y[8] + 1e-9
    ar = make_decoder(tiny_pair, DecoderOptions(method="ar")).generate(tiny_pair.encode_prompt("hi"), 8)
    assert "tested no draft candidate" in budget_figure(best_trees(ar, costs)).layout.annotations[0].text
    # on the page the run's tree carries the run's own expected figure (the Cost model's): one per method and settings
    mine = budget_figure(best_trees(run, costs, own_expected=0.77)).data[1]
    assert mine.y[0] == 0.77 and "expected 0.77× (the Cost model's figure" in mine.hovertemplate


def test_a_verify_never_costs_less_than_one_ar_step():
    """A line fitted over 1..64 rows passes under its few-row points: a 2-row verify on it would undercut the
    one-row forward it contains, and a one-node chain would look faster than ar for free."""
    costs = StepCosts(ar_s=10.0, verify_base_s=5.0, verify_per_row_s=2.5, draft_per_forward_s=0.0)
    assert costs.verify_s(2) == 10.0 and costs.verify_s(4) == 15.0
    assert evaluate((1,), [0.0], costs).speedup == pytest.approx(1.0)  # nothing accepted, nothing gained


def test_a_verify_is_floored_at_its_own_one_row_forward_where_the_ar_step_was_timed_apart():
    """An ar step timed after ar steps runs warmer than a verify, which follows a step's draft forwards: the verify's
    floor is the one-row forward timed as a verify runs, so a cheaper ar step makes a chain slower, not faster."""
    apart = StepCosts(ar_s=8.0, verify_base_s=5.0, verify_per_row_s=2.5, draft_per_forward_s=0.0, verify_floor_s=10.0)
    assert apart.verify_s(2) == 10.0 and apart.verify_s(4) == 15.0
    assert evaluate((1,), [0.0], apart).speedup == pytest.approx(0.8)  # nothing accepted: 8 / 10
