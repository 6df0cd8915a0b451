"""Packed grouped-query attention (dynasd/kernels/gqa_attention.py) computes what stock attention computes, and only
replaces the case it is for: a masked forward of several query tokens."""
import pytest
import torch

import dynasd.kernels.gqa_attention as gqa
from dynasd.cache import CachedModel
from dynasd.loading.models import load_pair, tiny_random_pair
from dynasd.tree import ancestor_mask

PARENTS = [-1, -1, 0, 0, 1, 2]  # a branching tree of 6 nodes under the last committed token


def tree_verify_logits(pair) -> torch.Tensor:
    """Logits of one tree verify after a 40-token prefix: the committed token, then the 6 tree nodes."""
    model = CachedModel(pair.target)
    model.prefill([5 + i % 30 for i in range(40)])
    nodes = [7, 9, 11, 13, 15, 17]
    depth = [1, 1, 2, 2, 2, 3]
    logits, _ = model.forward([21], nodes, ancestor_mask(PARENTS), [41 + d - 1 for d in depth], 1 + len(nodes))
    return logits


def test_the_tiny_pair_groups_query_heads():
    config = tiny_random_pair().target.config
    assert config.num_attention_heads // config.num_key_value_heads == 2


def test_tree_verify_logits_match_stock_sdpa_and_eager():
    stock, packed, eager = tiny_random_pair(), tiny_random_pair(), tiny_random_pair()
    gqa.use_packed_gqa(packed.target)
    eager.target.set_attn_implementation("eager")
    assert gqa.use_packed_gqa(eager.target).config._attn_implementation == "eager"  # only sdpa models switch
    assert packed.target.config._attn_implementation == gqa.NAME
    reference = tree_verify_logits(stock)
    # Float rounding only: stacking the heads as rows changes sdpa's blocking (up to 2.4e-6 on an AMD EPYC,
    # 2026-12-01; under 1e-6 on the Intel CPUs before).
    torch.testing.assert_close(tree_verify_logits(packed), reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tree_verify_logits(eager), reference, rtol=1e-5, atol=1e-5)


def test_only_masked_multi_token_forwards_take_the_packed_path(monkeypatch):
    pair = load_pair("tiny-random", device="cpu")
    assert pair.target.config._attn_implementation == gqa.NAME
    # a draft in 8-bit blocks computes in 8-bit activations, with the exact attention that goes with them
    assert pair.draft.config._attn_implementation in (gqa.NAME, "dynasd_exact")
    delegated, stacked = [], []
    real_sdpa, real_fallback = torch.nn.functional.scaled_dot_product_attention, gqa.sdpa_attention_forward

    def fallback(module, query, *args, **kwargs):
        delegated.append(query.shape[2])
        return real_fallback(module, query, *args, **kwargs)

    def sdpa(query, *args, **kwargs):
        stacked.append(query.shape[2])
        return real_sdpa(query, *args, **kwargs)

    monkeypatch.setattr(gqa, "sdpa_attention_forward", fallback)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    layers = pair.target.config.num_hidden_layers
    model = CachedModel(pair.target)
    model.prefill([5, 6, 7, 8])                       # 4 committed tokens under a causal mask
    assert delegated == [] and stacked == [2 * 4] * layers  # the 2 query heads per KV head stacked as rows
    delegated.clear(), stacked.clear()
    model.forward([9], [], None, [], 1)               # one token: transformers' own path
    assert delegated == [1] * layers
    delegated.clear(), stacked.clear()
    model.forward([10], [11, 12], ancestor_mask([-1, 0]), [6, 7], 3)  # a tree verify of 3 query tokens
    assert delegated == [] and stacked == [2 * 3] * layers


@pytest.mark.parametrize("q_len", [1, 4])
def test_unmasked_and_single_token_calls_are_delegated_unchanged(q_len):
    module = tiny_random_pair().target.model.layers[0].self_attn
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(1, 4, q_len, 8, generator=gen)
    key, value = torch.randn(1, 2, 6, 8, generator=gen), torch.randn(1, 2, 6, 8, generator=gen)
    mask = None if q_len > 1 else torch.zeros(1, 1, 1, 6)
    ours, _ = gqa.packed_gqa_sdpa(module, query, key, value, mask, scaling=0.3)
    stock, _ = gqa.sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    assert torch.equal(ours, stock)


def test_batched_padded_generate_matches_stock_modules():
    """transformers builds the same masks for this attention as for sdpa (padding included)."""
    stock, fast = load_pair("tiny-random", device="cpu", fast_kernels=False), load_pair("tiny-random", device="cpu")
    ids = torch.tensor([[2, 2, 2, 5, 6, 7], [5, 9, 11, 13, 15, 17]])  # the first row is left-padded
    mask = (torch.arange(6) >= torch.tensor([[3], [0]])).long()
    outs = [pair.target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8,
                                 pad_token_id=2, eos_token_id=None) for pair in (stock, fast)]
    assert torch.equal(outs[0], outs[1])


def test_the_tiled_mask_is_reused_only_for_the_same_unchanged_mask():
    """One tile per forward serves every layer; a different mask, key length or an in-place edit re-tiles."""
    module = tiny_random_pair().target.model.layers[0].self_attn
    gen = torch.Generator().manual_seed(1)
    query = torch.randn(1, 4, 3, 8, generator=gen)
    key, value = torch.randn(1, 2, 7, 8, generator=gen), torch.randn(1, 2, 7, 8, generator=gen)
    mask = torch.zeros(1, 1, 3, 7)
    mask[0, 0, 0, 5:] = float("-inf")

    def fresh(m):  # stock attention on a copy, so no tile can be reused
        return gqa.sdpa_attention_forward(module, query, key, value, m.clone(), scaling=0.3)[0]

    first = gqa.packed_gqa_sdpa(module, query, key, value, mask, scaling=0.3)[0]
    assert gqa.tiled_mask(mask, 7, 2) is gqa.tiled_mask(mask, 7, 2)
    torch.testing.assert_close(first, fresh(mask), rtol=0, atol=1e-6)
    mask[0, 0, 1, 2] = float("-inf")  # edited in place: the old tile must not be used
    torch.testing.assert_close(gqa.packed_gqa_sdpa(module, query, key, value, mask, scaling=0.3)[0], fresh(mask),
                               rtol=0, atol=1e-6)
    assert gqa.tiled_mask(mask, 6, 2).shape == (1, 1, 6, 6)
