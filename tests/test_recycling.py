"""Token Recycling (dynasd/sources/recycling.py) and the joined candidate tree (dynasd/sources/candidate_tree.py).

The table's update rule and its walk on hand-built logits; that a step records every verified row, accepted or
not, as the target computes it; how proposals of several sources merge into one tree and how the walk tests them;
and, on synthetic distributions, that testing candidates of several sources at one node, duplicates included, is
exact while a wrong residual is not.
"""
import pytest
import torch
from scipy.stats import chisquare

from dynasd.decoders import make_decoder
from dynasd.decoders.speculative import TreeDecoder
from dynasd.options import DecoderOptions
from dynasd.sampling import Draws, mcss_walk
from dynasd.sources import CandidateTree, DraftRows, Proposal, StepOutcome, TargetReading, TokenRecycling
from dynasd.sources.recycling import top_k_rows
from dynasd.tree import ROOT, TreeShape

VOCAB = 10


def recycler(branching=(2, 1)) -> TokenRecycling:
    source = TokenRecycling(TreeShape(branching), VOCAB, torch.device("cpu"))
    source.start([0], None, torch.Generator())
    return source


def logits_ranking(*orders: list[int]) -> torch.Tensor:
    """One row per order: the listed token ids get descending logits, every other id a lower one."""
    rows = torch.full((len(orders), VOCAB), -10.0)
    for row, order in zip(rows, orders):
        for rank, token in enumerate(order):
            row[token] = 5.0 - rank
    return rows


def test_a_row_holds_the_targets_top_k_after_the_token_it_read():
    source = recycler((3, 1))
    source.record([4, 7], logits_ranking([1, 2, 3], [9, 8, 0]), committed_rows=[0, 1])
    assert source.table[4].tolist() == [1, 2, 3]  # largest first
    assert source.table[7].tolist() == [9, 8, 0]
    assert (source.table[:VOCAB][[0, 1, 2, 3, 5, 6, 8, 9]] == -1).all(), "tokens never read have no row"
    source.record([4], logits_ranking([5, 6, 1]), committed_rows=[])
    assert source.table[4].tolist() == [5, 6, 1], "a later reading replaces the row, committed or not"


def test_a_token_read_twice_in_one_forward_keeps_its_committed_row_else_its_last():
    source = recycler((2,))
    # token 3 fed rows 0, 1 and 2; row 1 is on the committed path, row 2 was a rejected node
    source.record([3, 3, 3, 6, 6], logits_ranking([1, 2], [4, 5], [7, 8], [1, 9], [2, 9]), committed_rows=[1])
    assert source.table[3].tolist() == [4, 5]
    assert source.table[6].tolist() == [2, 9]  # neither row committed: the later one
    source.record([3, 3], logits_ranking([1, 2], [7, 8]), committed_rows=[0, 1])
    assert source.table[3].tolist() == [7, 8]  # both committed: the later one


def test_the_walk_follows_the_table_through_the_template_and_drops_unknown_subtrees():
    source = recycler((2, 2))
    source.record([0, 1, 2], logits_ranking([1, 2], [5, 6], [7, 8]), committed_rows=[0, 1, 2])
    proposal = source.propose([9, 0], room=10)
    assert proposal.tokens == [1, 2, 5, 6, 7, 8]
    assert proposal.parents == [ROOT, ROOT, 0, 0, 1, 1] and proposal.levels == [1, 1, 2, 2, 2, 2]
    assert proposal.origins == ["recycled"] * 6 and proposal.drawn_from is None  # deterministic: q one-hot
    assert proposal.mask is not None and proposal.max_nodes == 6 and proposal.max_depth == 2
    source.table[2] = -1  # forget token 2: its children go, token 1's stay
    pruned = source.propose([9, 0], room=10)
    assert pruned.tokens == [1, 2, 5, 6] and pruned.parents == [ROOT, ROOT, 0, 0] and pruned.mask is None
    assert source.propose([9, 3], room=10).tokens == [], "an unread root proposes nothing"


def test_blocked_top_k_equals_torch_top_k():
    torch.manual_seed(0)
    logits = torch.randn(7, 49_152)
    logits[3, 100:110] = 9.0  # ten entries tie at the top
    for k in (1, 2, 4, 8):
        got = top_k_rows(logits, k)
        want = torch.topk(logits, k, dim=-1)
        assert torch.equal(logits.gather(1, got), want.values), k  # the same values, largest first
        assert got[[0, 1, 2, 4, 5, 6]].tolist() == want.indices[[0, 1, 2, 4, 5, 6]].tolist()


def test_a_step_records_every_verified_row_as_the_target_computes_it(tiny_pair):
    """After a step, the row of every token the target read (rejected nodes included) is the top k of the
    target's own logits after that node's context, as a plain forward over the context computes them."""
    ids = tiny_pair.encode_prompt("the cat sat on the mat. the cat")
    decoder = make_decoder(tiny_pair, DecoderOptions(method="recycle", recycle=(3, 2)))
    decoder.start(ids, 16)
    [source] = decoder.sources
    checked_rejected = 0
    while not decoder.done and checked_rejected < 3:
        context = list(decoder.committed)
        step = decoder.step()
        for i, node in enumerate(step.nodes):
            path, j = [], i
            while j != ROOT:
                path.append(step.nodes[j].token_id)
                j = step.nodes[j].parent
            with torch.inference_mode():
                logits = tiny_pair.target(torch.tensor([context + path[::-1]])).logits[0, -1]
            read = [context[-1]] + [n.token_id for k, n in enumerate(step.nodes) if k != i]
            if node.token_id not in read:  # a token read twice keeps one of its rows (tested above)
                assert source.table[node.token_id].tolist() == torch.topk(logits, 3).indices.tolist()
                checked_rejected += node.status == "rejected"
    assert checked_rejected >= 3


# -- the joined tree ------------------------------------------------------------------------------------------------

def draft_proposal(tokens, parents, q_rows: dict[int, torch.Tensor]) -> Proposal:
    rows = DraftRows()
    contexts = sorted(q_rows)
    rows.add_block(contexts, torch.stack([q_rows[c].log() for c in contexts]),
                   torch.stack([q_rows[c] for c in contexts]))
    levels = [1 if p == ROOT else 2 for p in parents]
    return Proposal(tokens, parents, levels, ["draft"] * len(tokens), len(tokens), max(levels), drawn_from=rows)


def test_proposals_merge_into_one_tree_with_their_tests_kept_per_proposal():
    q = torch.full((VOCAB,), 0.1)
    draft = draft_proposal([4, 5, 7], [ROOT, ROOT, 0], {ROOT: q, 0: q})
    lookup = Proposal([5, 8], [ROOT, 0], [1, 2], ["lookup"] * 2, 2, 2)
    recycled = Proposal([4, 7, 9], [ROOT, 0, 0], [1, 2, 2], ["recycled"] * 3, 3, 2)
    tree = CandidateTree([draft, lookup, recycled], VOCAB, torch.device("cpu"))
    # 4 (draft + recycled), 5 (draft + lookup), 7 under 4 (draft + recycled), 8 under 5, 9 under 4
    assert tree.tokens == [4, 5, 7, 8, 9] and tree.parents == [ROOT, ROOT, 0, 1, 0]
    assert tree.origins == ["draft", "draft", "draft", "lookup", "recycled"]
    assert tree.mask.tolist() == [[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [1, 0, 1, 0, 0], [0, 1, 0, 1, 0],
                                  [1, 0, 0, 0, 1]]
    assert tree.children(ROOT) == [0, 1] and tree.children(0) == [2, 4]  # each node once
    groups = tree.draws(ROOT)  # the draft's siblings drawn from one q, then each deterministic candidate alone
    assert [g.nodes for g in groups] == [[0, 1], [1], [0]]
    assert torch.equal(groups[0].q, q) and groups[1].q.tolist() == [float(i == 5) for i in range(VOCAB)]
    assert [g.nodes for g in tree.draws(0)] == [[2], [2], [4]]
    assert tree.q_of(greedy=False) == pytest.approx({0: 0.1, 1: 0.1, 2: 0.1, 3: 1.0, 4: 1.0})
    # each source hears its own nodes on the committed path
    assert tree.accepted_of(0, [0, 2]) == [0, 2] and tree.accepted_of(2, [0, 2]) == [0, 1]
    assert tree.accepted_of(1, [0, 2]) == [] and tree.accepted_of(1, [1, 3]) == [0, 1]
    assert tree.accepted_of(0, [1, 3]) == [1]
    assert tree.max_nodes == 8 and tree.max_depth == 2 and tree.depth == 2


P = torch.tensor([0.35, 0.25, 0.15, 0.1, 0.08, 0.05, 0.02, 0.0])
Q = torch.tensor([0.05, 0.1, 0.3, 0.2, 0.2, 0.1, 0.0, 0.05])


def joined_walk_counts(samples: int, seed: int, draft_first: bool, skip_duplicates: bool = False) -> torch.Tensor:
    """One level: two draft siblings drawn from Q without replacement and two deterministic candidates (the
    context's continuation, token 0, and a recycled guess, token 2, which the draft often draws too)."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(len(P))
    for _ in range(samples):
        races = torch.empty_like(Q).exponential_(generator=gen)
        drafted = torch.topk(Q / races, 2).indices.tolist()  # two draws without replacement
        draft = draft_proposal(drafted, [ROOT, ROOT], {ROOT: Q})
        others = [Proposal([t], [ROOT], [1], ["recycled"], 1, 1) for t in (0, 2)]
        tree = CandidateTree([draft] + others if draft_first else others + [draft], len(P), torch.device("cpu"))
        draws = tree.draws
        if skip_duplicates:  # the mutation: a node tested once is not tested again, so that residual update is lost
            def draws(node, tree=tree):
                seen, kept = set(), []
                for group in tree.draws(node):
                    nodes = [n for n in group.nodes if n not in seen]
                    seen.update(nodes)
                    if nodes:
                        kept.append(Draws(nodes, group.q, group.without_replacement))
                return kept
        result = mcss_walk(ROOT, draws, tree.tokens, lambda n: P, gen)
        token = tree.tokens[result.path[0]] if result.path else int(torch.multinomial(result.final_probs, 1,
                                                                                     generator=gen))
        counts[token] += 1
    return counts


def p_value_against_p(counts: torch.Tensor) -> float:
    keep = P > 0
    assert counts[~keep].sum() == 0, "a token of target probability 0"
    return chisquare(counts[keep].numpy(), (P[keep] * counts.sum()).numpy())[1]


@pytest.mark.parametrize("draft_first", [True, False])
def test_candidates_of_several_sources_at_one_node_are_exact_duplicates_included(draft_first):
    counts = joined_walk_counts(12_000, seed=1, draft_first=draft_first)
    assert p_value_against_p(counts) > 1e-3, counts


def test_a_wrong_residual_at_a_duplicate_is_caught():
    """Deterministic candidates first: after token 2 failed its one-hot test, the draft's own 2 must still be
    tested (it fails surely) for its residual update with the draft's q; skipping it biases the output."""
    counts = joined_walk_counts(12_000, seed=1, draft_first=False, skip_duplicates=True)
    assert p_value_against_p(counts) < 1e-4, counts


def test_a_recycled_step_tells_the_table_through_update():
    source = recycler((2,))
    reading = TargetReading(0, [1, 4], logits_ranking([2, 3], [6, 7]))
    outcome = StepOutcome(committed=[1, 4, 6], reading=reading, root_rows=1, accepted_rows=[0],
                          next_logits=reading.logits[0], next_probs=None)
    source.update(outcome, accepted=[])
    assert source.table[1].tolist() == [2, 3] and source.table[4].tolist() == [6, 7]


def test_recycling_is_refused_with_target_roots(tiny_pair):
    """The options' own check, made wherever a decoder is made (TreeDecoder keeps none of its own)."""
    with pytest.raises(ValueError, match="ti-mcsd takes no"):
        TreeDecoder(tiny_pair, DecoderOptions(method="ti-mcsd", recycle=(2, 1)))
    with pytest.raises(ValueError, match="ti-mcsd takes no"):
        make_decoder(tiny_pair, DecoderOptions(method="ti-mcsd", recycle=(2, 1)))


def test_a_recycle_run_records_its_template_and_origins(tiny_pair):
    from dynasd.trace import run_from_dict, run_to_dict

    ids = tiny_pair.encode_prompt("the cat sat on the mat. the cat sat on the mat. the cat")
    decoder = make_decoder(tiny_pair, DecoderOptions(method="recycle", recycle=(2, 1, 1), lookup=4))
    run = decoder.generate(ids, 30)
    assert run.config["options"]["recycle"] == "2,1,1" and decoder.shape.branching == (2, 1, 1) and run.lossless
    assert decoder.max_step_tokens() == 5  # the lookup chain is the longer
    assert all(step.draft_forwards == 0 for step in run.steps), "no draft model runs"
    origins = {o for step in run.steps for o in step.committed_origins}
    assert "recycled" in origins
    assert run.summary()["acceptance_rate"] > 0
    assert run_from_dict(run_to_dict(run)).steps[-1].nodes == run.steps[-1].nodes
