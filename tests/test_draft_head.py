"""A draft whose output layer covers only part of the vocabulary (SubsetHead) still gives a valid q."""
import json

import pytest
import torch

from dynasd.decoders import make_decoder
from dynasd.loading.models import ModelLoadError, SubsetHead, read_head_tokens, tiny_random_pair
from dynasd.options import DecoderOptions


def test_subset_head_keeps_the_rows_it_covers_and_blocks_the_rest():
    torch.manual_seed(0)
    full = torch.nn.Linear(8, 10, bias=False)
    head = SubsetHead(full.weight, [7, 1, 3, 3])
    hidden = torch.randn(2, 5, 8)
    logits = head(hidden)
    assert logits.shape == (2, 5, 10)
    covered = torch.tensor([1, 3, 7])
    # a 3-row product and a 10-row one may round differently: float tolerance, not bitwise
    assert torch.allclose(logits[..., covered], full(hidden)[..., covered], atol=1e-6)
    outside = torch.ones(10, dtype=torch.bool)
    outside[covered] = False
    assert torch.isneginf(logits[..., outside]).all()
    probs = torch.softmax(logits, -1)
    assert torch.allclose(probs.sum(-1), torch.ones(2, 5)) and (probs[..., outside] == 0).all()


def test_bad_head_token_files_are_refused(tmp_path):
    assert read_head_tokens(tmp_path) is None
    (tmp_path / "head_tokens.json").write_text(json.dumps({"token_ids": [1, "x"]}))
    with pytest.raises(ModelLoadError, match="integers"):
        read_head_tokens(tmp_path)
    (tmp_path / "head_tokens.json").write_text("{not json")
    with pytest.raises(ModelLoadError):
        read_head_tokens(tmp_path)
    with pytest.raises(ModelLoadError):
        SubsetHead(torch.zeros(10, 4), [3, 10])


@pytest.fixture(scope="module")
def subset_pair():
    pair = tiny_random_pair()
    pair.draft.lm_head = SubsetHead(pair.draft.lm_head.weight, list(range(0, pair.vocab_size, 2)))
    return pair


def test_greedy_identity_with_a_subset_draft(subset_pair):
    target_only = make_decoder(subset_pair, DecoderOptions(method="ar"))
    for prompt in ("hello there", "What is speculative decoding?"):
        ids = subset_pair.encode_prompt(prompt)
        reference = target_only.generate(ids, 40).new_token_ids
        for method, options in (("sd", dict(gamma=4)), ("mcsd", dict(k_config=(4, 2, 2, 1)))):
            run = make_decoder(subset_pair, DecoderOptions(method=method, **options)).generate(ids, 40)
            assert run.new_token_ids == reference
            assert all(n.token_id % 2 == 0 for s in run.steps for n in s.nodes), "proposed outside the subset"


def test_sampling_with_a_subset_draft_only_proposes_covered_tokens(subset_pair):
    options = DecoderOptions(method="mcsd", temperature=1.0, k_config=(3, 2), seed=3)
    run = make_decoder(subset_pair, options).generate(subset_pair.encode_prompt("hi"), 30)
    drafted = [n for s in run.steps for n in s.nodes if n.status != "padding"]
    assert drafted and all(n.token_id % 2 == 0 and n.q > 0 for n in drafted)


@pytest.mark.parametrize("policy", ["confidence", "decision"])
def test_stop_scores_over_the_subset_equal_the_full_vocabulary_ones(subset_pair, policy):
    """With a reduced head the stop policy reads the softmax over the head's tokens only (the others are 0): the
    scores, the stops and the output must be those of the full-vocabulary softmax."""
    from dynasd.stopping.decision_models import HARD_TOPK, DecisionModel

    torch.manual_seed(0)
    model = DecisionModel("hard", 1 + HARD_TOPK).eval() if policy == "decision" else None
    ids = subset_pair.encode_prompt("What is speculative decoding?")
    runs = []
    for subset in (True, False):
        options = DecoderOptions(method="mcsd", k_config=(2, 2, 1, 1), stop=policy, threshold=0.5)
        decoder = make_decoder(subset_pair, options, decision_model=model)
        [draft_tree] = decoder.sources
        assert draft_tree.head_ids is not None
        if not subset:
            draft_tree.head_ids = None  # the full 0-padded softmax, as before
        runs.append(decoder.generate(ids, 40))
    with_subset, full = runs
    assert with_subset.new_token_ids == full.new_token_ids
    levels = [(s.live_depth, [(lv.level, lv.continued) for lv in s.stop_scores]) for s in with_subset.steps]
    assert levels == [(s.live_depth, [(lv.level, lv.continued) for lv in s.stop_scores]) for s in full.steps]
    a = [x for s in with_subset.steps for lv in s.stop_scores for x in lv.scores]
    b = [x for s in full.steps for lv in s.stop_scores for x in lv.scores]
    assert len(a) > 10 and a == pytest.approx(b, abs=1e-5)
    assert any(not went_on for _, lv in levels for _, went_on in lv)  # trees stopped early: the scores decide
