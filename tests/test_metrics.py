"""The standard acceptance metrics: per-position acceptance, draft tokens proposed and accepted, and the mean
acceptance length, from hand-built traces whose values are known, and on a real run."""
import pytest

from dynasd.acceptance import acceptance_of, add_histograms, per_position_acceptance
from dynasd.bench import summary
from dynasd.trace import NodeTrace, RunTrace, StepTrace


def node(parent, level, origin="draft", status="rejected"):
    return NodeTrace(token_id=5, token="a", parent=parent, level=level, origin=origin, p=0.5, q=0.5, status=status)


def step(index, nodes, path, committed):
    return StepTrace(index=index, context_len=10 + index, nodes=nodes, max_nodes=len(nodes), max_depth=4,
                     live_depth=max((n.level for n in nodes), default=0), root_rows=1, verify_mask=[],
                     position_ids=[], accepted_path=path, committed=committed, committed_tokens=["a"] * len(committed),
                     committed_origins=["draft"] * (len(committed) - 1) + ["bonus"], target_forwards=1)


def chain(length):
    return [node(-1 if level == 1 else level - 2, level) for level in range(1, length + 1)]


def hand_built_run():
    """Four steps over sd chains of 4: accepted 0, 2, 4 and 1 draft tokens, then one step with no candidates
    (a pld step without a match): 1 + 3 + 5 + 2 + 1 = 12 tokens in 5 target forwards."""
    steps = [step(0, chain(4), [], [7]), step(1, chain(4), [0, 1], [7, 7, 7]),
             step(2, chain(4), [0, 1, 2, 3], [7] * 5), step(3, chain(4), [0], [7, 7]), step(4, [], [], [7])]
    return RunTrace(method="sd", config={}, pair="x", draft_label="", lossless=True, prompt="", prompt_ids=[1],
                    steps=steps, new_token_ids=[7] * 12)


def test_per_position_acceptance_from_hand_built_traces():
    acceptance = acceptance_of(hand_built_run().steps)
    assert acceptance.histogram == [1, 1, 1, 0, 1]  # drafts that accepted 0-4 tokens; the empty step is no draft
    assert (acceptance.proposed, acceptance.accepted) == (16, 7)
    # position 1 reached by 3 of 4 drafts, position 2 by 2, 3 by 1, 4 by 1
    assert acceptance.per_position == per_position_acceptance(acceptance.histogram) == [0.75, 0.5, 0.25, 0.25]
    assert per_position_acceptance([]) == []
    # conditional: position 1 tried by 4 drafts (3 passed), 2 by 3 (2), 3 by 2 (1), 4 by 1 (1)
    assert (acceptance.reached, acceptance.passed) == ([4, 3, 2, 1], [3, 2, 1, 1])
    assert acceptance.conditional == [0.75, 2 / 3, 0.5, 1.0]


def test_target_rooted_levels_are_not_draft_positions():
    """A ti-mcsd step: the target's own roots are not proposed tokens; the accepted path root + 2 draft tokens
    reaches draft positions 1 and 2."""
    roots = [node(-1, 1, "target_root"), node(-1, 1, "target_root")]
    drafts = [node(0, 2), node(1, 2), node(2, 3), node(3, 3)]
    run = RunTrace(method="ti-mcsd", config={}, pair="x", draft_label="", lossless=False, prompt="", prompt_ids=[1],
                   steps=[step(0, roots + drafts, [1, 3, 5], [7, 7, 7])], new_token_ids=[7] * 3)
    acceptance = acceptance_of(run.steps)
    assert (acceptance.histogram, acceptance.proposed, acceptance.accepted) == ([0, 0, 1], 4, 2)
    assert acceptance.per_position == [1.0, 1.0]
    assert acceptance.conditional == [1.0, 1.0]  # the chosen root's chain: both its draft positions passed


def test_conditional_acceptance_stops_where_the_tree_ends():
    """A tree whose accepted path reaches a leaf: the next position had no candidate, so it was not tried (the
    bonus token is the target's, not a position)."""
    tree = [node(-1, 1), node(-1, 1), node(0, 2)]
    run = RunTrace(method="mcsd", config={}, pair="x", draft_label="", lossless=True, prompt="", prompt_ids=[1],
                   steps=[step(0, tree, [1], [7, 7]), step(1, tree, [0, 2], [7, 7, 7])], new_token_ids=[7] * 5)
    acceptance = acceptance_of(run.steps)
    assert (acceptance.reached, acceptance.passed) == ([2, 1], [2, 1])


def test_histograms_add_up_across_runs():
    assert add_histograms([[1, 2], [0, 0, 3], []]) == [1, 2, 3]


def test_mean_acceptance_length_is_tokens_per_target_forward_and_vllms_formula_when_every_step_drafts():
    run = hand_built_run()
    records = [{"method": "sd", "base_method": "sd", "temperature": 0.0, "category": "c", "prompt_id": 1,
                "new_tokens": 12, "seconds": 1.0, "target_forwards": 5, "attempted_draft_levels": 16,
                "accepted_draft_levels": 7, "draft_forward_seconds": 0.0, "target_forward_seconds": 0.0,
                "compared_tokens": 0, "identical_to_ar": None, "lossless": True, "differing_share": None,
                "acceptance_histogram": acceptance_of(run.steps).histogram, "draft_tokens_proposed": 16,
                "draft_tokens_accepted": 7}]
    row = next(r for r in summary.summarize(records) if r["category"] == "all")
    assert row["mean_acceptance_length"] == row["tokens_per_target_forward"] == 12 / 5
    assert row["draft_token_acceptance"] == 7 / 16
    # vLLM's 1 + accepted per draft: over the four drafting steps alone (11 tokens in 4 forwards), the same
    drafting = 1 + sum(row["per_position_acceptance"])
    assert drafting == pytest.approx((12 - 1) / 4)


def test_real_runs_report_the_standard_names(tiny_pair, tmp_path):
    import json

    from dynasd.cli import main

    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["Who wrote Hamlet?"]}) + "\n")
    assert main(["bench", "--pair", "tiny-random", "--prompts", str(prompts), "--methods", "ar,sd,mcsd:k=2,2,1",
                 "--max-new-tokens", "16", "--warmup-tokens", "2", "--out", str(tmp_path / "out"), "--no-progress",
                 "--no-report"]) == 0
    rows = json.loads((tmp_path / "out" / "summary.json").read_text())
    for row in rows:
        assert row["mean_acceptance_length"] == row["tokens_per_target_forward"]
        if row["method"] == "ar":
            assert row["per_position_acceptance"] is None and row["draft_tokens_proposed"] is None
            continue
        rates = row["per_position_acceptance"]
        assert len(rates) <= (4 if row["method"] == "sd" else 3)  # draft positions: gamma 4, or the tree's depth
        assert all(a >= b for a, b in zip(rates, rates[1:]))  # reaching k + 1 passes k first
        assert 0 <= row["draft_tokens_accepted"] <= row["draft_tokens_proposed"]
        # every step of these methods drafts, so the standard formula gives the same mean acceptance length up to
        # the last step's tokens cut by the budget
        drafts = sum(row["acceptance_histogram"])
        assert drafts == row["target_forwards"]
        assert 1 + sum(rates) >= row["mean_acceptance_length"] - 1e-9
