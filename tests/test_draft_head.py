"""A draft whose output layer covers only part of the vocabulary (SubsetHead) still gives a valid q."""
import json

import pytest
import torch

from dynasd.decoders import make_decoder
from dynasd.models import ModelLoadError, SubsetHead, read_head_tokens, tiny_random_pair
from dynasd.sampling import SamplingConfig


def test_subset_head_keeps_the_rows_it_covers_and_blocks_the_rest():
    full = torch.nn.Linear(8, 10, bias=False)
    head = SubsetHead(full.weight, [7, 1, 3, 3])
    hidden = torch.randn(2, 5, 8)
    logits = head(hidden)
    assert logits.shape == (2, 5, 10)
    covered = torch.tensor([1, 3, 7])
    assert torch.allclose(logits[..., covered], full(hidden)[..., covered])
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
    target_only = make_decoder("ar", subset_pair, SamplingConfig())
    for prompt in ("hello there", "What is speculative decoding?"):
        ids = subset_pair.encode_prompt(prompt)
        reference = target_only.generate(ids, 40).new_token_ids
        for method, options in (("sd", dict(gamma=4)), ("mcsd", dict(k_config=(4, 2, 2, 1)))):
            run = make_decoder(method, subset_pair, SamplingConfig(), **options).generate(ids, 40)
            assert run.new_token_ids == reference
            assert all(n.token_id % 2 == 0 for s in run.steps for n in s.nodes), "proposed outside the subset"


def test_sampling_with_a_subset_draft_only_proposes_covered_tokens(subset_pair):
    cfg = SamplingConfig(temperature=1.0)
    run = make_decoder("mcsd", subset_pair, cfg, k_config=(3, 2), seed=3).generate(subset_pair.encode_prompt("hi"), 30)
    drafted = [n for s in run.steps for n in s.nodes if n.status != "padding"]
    assert drafted and all(n.token_id % 2 == 0 and n.q > 0 for n in drafted)
