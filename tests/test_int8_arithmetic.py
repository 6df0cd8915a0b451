"""The 8-bit-activation arithmetic (block_int8.h, exact_attention.h): every row's result is bitwise what the same
row gets alone, whatever rows share the forward (1 to 64, a tree's masked siblings between its ancestors, grouped
attention), so every lossless method is identical to ar in it; and its products are the arithmetic it defines."""
from __future__ import annotations

import pytest
import torch
from test_block_weights import quantized, small_llama, write_gguf

from dynasd.cache import CachedModel
from dynasd.kernels import accelerate_model, plan_for
from dynasd.kernels.block_weights import BLOCK, INT8, Q4_1, Q8_0, BlockLinear, dequantize, kernel_library


def rows_alone_and_together(product, x: torch.Tensor) -> list[int]:
    """The rows of `x` whose result in one call differs bitwise from the same row's result alone."""
    together = product(x)
    return [row for row in range(x.shape[0]) if not torch.equal(together[row], product(x[row:row + 1])[0])]


def quantized_rows(x: torch.Tensor) -> torch.Tensor:
    """x as the arithmetic reads it: per row and block of 32, d = max |x| / 127 and q = nearest(x / d)."""
    blocks = x.reshape(x.shape[0], -1, BLOCK)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    return (torch.round(blocks / d) * d).reshape(x.shape)


@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
def test_the_products_are_the_quantized_rows_times_the_weights(kernel, kind):
    gen = torch.Generator().manual_seed(0)
    raw = quantized(kind, torch.randn(96, 128, generator=gen))
    layer = BlockLinear(kind, raw, kernel, INT8)
    x = torch.randn(13, 128, generator=gen)
    exact = quantized_rows(x).double() @ dequantize(kind, raw).double().T
    torch.testing.assert_close(layer(x).double(), exact, rtol=1e-5, atol=1e-4)
    assert not torch.allclose(layer(x), x @ dequantize(kind, raw).T, atol=1e-3)  # it is not the float32 product


@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
def test_a_rows_product_is_bitwise_the_same_with_1_to_64_rows(kernel, kind):
    gen = torch.Generator().manual_seed(1)
    layer = BlockLinear(kind, quantized(kind, torch.randn(64, 96, generator=gen)), kernel, INT8)
    x = torch.randn(64, 96, generator=gen) * torch.rand(64, 1, generator=gen) * 10
    assert rows_alone_and_together(layer, x) == []
    together = layer(x)
    for rows in range(1, 65):
        assert torch.equal(layer(x[:rows]), together[:rows]), rows


def test_the_row_check_catches_a_product_whose_rows_share_a_scale(kernel):
    """The check above can fail: rows quantized with one scale for the whole call depend on each other."""
    gen = torch.Generator().manual_seed(2)
    layer = BlockLinear(Q4_1, quantized(Q4_1, torch.randn(32, 64, generator=gen)), kernel, INT8)
    x = torch.randn(8, 64, generator=gen) * torch.arange(1, 9)[:, None]

    def shared_scale(rows: torch.Tensor) -> torch.Tensor:
        scale = rows.abs().max()
        return layer(torch.round(rows / scale * 127) * scale / 127)

    assert rows_alone_and_together(shared_scale, x) != []


def test_exact_attention_is_attention_and_ignores_masked_keys(kernel):
    attention = kernel_library(kernel).exact_attention
    gen = torch.Generator().manual_seed(3)
    for heads, kv_heads, head_dim in [(9, 3, 64), (4, 2, 16), (2, 2, 8), (6, 3, 24)]:
        q = torch.randn(1, heads, 5, head_dim, generator=gen)
        k, v = (torch.randn(1, kv_heads, 40, head_dim, generator=gen) for _ in range(2))
        mask = torch.zeros(1, 1, 5, 40)
        mask[..., 30:] = float("-inf")
        mask[0, 0, torch.arange(5), 30 + 2 * torch.arange(5)] = 0  # each row sees the context and one key of its own
        groups = heads // kv_heads
        reference = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), attn_mask=mask, scale=0.3)
        out = attention(q, k, v, mask, 0.3)
        torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
        # each row alone, over exactly the keys it sees (no masked key in the cache): bitwise the same
        for row in range(5):
            seen = list(range(30)) + [30 + 2 * row]
            alone = attention(q[:, :, row:row + 1], k[:, :, seen], v[:, :, seen], torch.zeros(1, 1, 1, 31), 0.3)
            assert torch.equal(alone[:, :, 0], out[:, :, row]), (heads, kv_heads, row)
        # one query head at a time (the shared-key path for three heads against the general one)
        for h in range(heads):
            single = attention(q[:, h:h + 1], k[:, h // groups:h // groups + 1], v[:, h // groups:h // groups + 1],
                               mask, 0.3)
            assert torch.equal(single[:, 0], out[:, h]), (heads, h)


def test_every_variant_gives_bitwise_the_same_attention():
    """The AVX-512 build sums each output of three query heads over a 64-wide head in 16-float registers
    (exact_attention.h: weighted_sums_of_three), the AVX2 build in 8-float halves: the same sums in the same key
    order, so the same bits, with masked keys, rows 1 to 45 and key counts off the register widths."""
    from dynasd.kernels.block_weights import block_kernel, exact_attention_op
    from dynasd.kernels.compile import runnable_variants

    variants = runnable_variants()
    if len(variants) < 2 or any(block_kernel(variant) is None for variant in variants):
        pytest.skip("this CPU executes one kernel variant at most")
    attentions = [exact_attention_op(variant) for variant in variants]
    gen = torch.Generator().manual_seed(6)
    for heads, kv_heads, head_dim in [(9, 3, 64), (6, 3, 24), (4, 2, 16)]:
        for rows, keys in [(1, 17), (5, 40), (45, 145), (13, 203)]:
            q = torch.randn(1, heads, rows, head_dim, generator=gen)
            k, v = (torch.randn(1, kv_heads, keys, head_dim, generator=gen) for _ in range(2))
            mask = torch.zeros(1, 1, rows, keys)
            mask[..., keys - rows:] = float("-inf")
            mask[0, 0, torch.arange(rows), keys - rows + torch.arange(rows)] = 0  # the context and itself
            mask[0, 0, :, 3] = float("-inf")  # a masked key inside the context
            results = [attention(q, k, v, mask, 0.125) for attention in attentions]
            assert all(torch.equal(results[0], other) for other in results[1:]), (heads, head_dim, rows, keys)


def small_model_in_blocks(tmp_path, arithmetic: str):
    model = small_llama(seed=4)
    write_gguf(model, tmp_path / "small.gguf")
    model.dynasd_gguf_file = tmp_path / "small.gguf"
    plan = plan_for(torch.device("cpu"), arithmetic=arithmetic)
    if not plan.gguf_blocks:
        pytest.skip("no kernel variant here: no block weights")
    return accelerate_model(model, plan)


def differing_rows_of_a_tree_verify(model) -> list[int]:
    """A verify of a committed token and a tree (a and b at level 1, c under a, d under b): the rows whose logits
    differ bitwise from those of their path fed one token at a time, as ar would feed it."""
    context, chain = [5, 17, 90, 3, 44, 61, 8, 12, 33], [70]
    a, b, c, d = 11, 22, 33, 44
    tree_mask = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1]], dtype=torch.bool)
    verify = CachedModel(model)
    verify.prefill(context)
    start = len(context) + 1
    logits, _ = verify.forward(chain, [a, b, c, d], tree_mask, [start, start, start + 1, start + 1], 5)
    paths = {0: chain, 1: chain + [a], 2: chain + [b], 3: chain + [a, c], 4: chain + [b, d]}
    differing = []
    for row, path in paths.items():
        alone = CachedModel(model)
        alone.prefill(context)
        for token in path:
            last, _ = alone.forward([token], [], None, [], 1)
        if not torch.equal(logits[row], last[0]):
            differing.append(row)
    return differing


def test_a_tree_verifys_rows_are_bitwise_what_each_path_gets_alone(tmp_path):
    """In 8-bit activations no row differs, though b lies between a and c in the cache and grouped attention packs
    the heads; with torch's own float32 products and attention (blocked by the shape of the call) rows do differ by
    rounding, which shows the check can fail. (The blocks' float32 arithmetic may or may not differ: its products
    are row-independent and only torch's attention is not, which on some CPUs happens to agree on this tree.) A
    chain of 1 to 12 rows at once gives each row what it gets alone too."""
    model = small_model_in_blocks(tmp_path, INT8)
    assert differing_rows_of_a_tree_verify(model) == []
    assert differing_rows_of_a_tree_verify(small_llama(seed=4)) != []
    context = [5, 17, 90, 3, 44, 61, 8, 12, 33]
    for rows in (1, 2, 5, 12):
        together = CachedModel(model)
        together.prefill(context)
        tokens = list(range(20, 20 + rows))
        all_rows, _ = together.forward(tokens, [], None, [], rows)
        single = CachedModel(model)
        single.prefill(context)
        for i, token in enumerate(tokens):
            assert torch.equal(single.forward([token], [], None, [], 1)[0][0], all_rows[i]), (rows, i)


def test_greedy_decoding_is_identical_to_ar_in_8_bit_activations(tmp_path):
    """Every lossless method, through trees of every shape, writes ar's tokens in the same arithmetic."""
    from dataclasses import replace

    from dynasd.decoders import make_decoder
    from dynasd.loading.models import load_pair
    from dynasd.options import DecoderOptions

    target = small_model_in_blocks(tmp_path, INT8)
    (tmp_path / "draft").mkdir()
    draft = small_model_in_blocks(tmp_path / "draft", "float32")  # the same weights: long accepted paths
    pair = replace(load_pair("tiny-random", device="cpu"), target=target, draft=draft, feature_draft=None)
    ids = [5, 17, 90, 3, 44]

    def tokens(method, **options):
        return make_decoder(pair, DecoderOptions(method=method, **options)).generate(ids, 20).new_token_ids

    reference = tokens("ar")
    accepted = make_decoder(pair, DecoderOptions(method="mcsd", k_config=(4, 2, 2, 1))).generate(ids, 20)
    assert max(len(step.committed) for step in accepted.steps) >= 3  # trees were accepted deep, not only rejected
    for method, options in [("sd", {}), ("mcsd", {"k_config": (4, 2, 2, 1)}), ("pld", {"lookup": 4}),
                            ("dynamic", {})]:
        assert tokens(method, **options) == reference, method
