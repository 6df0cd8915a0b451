"""The lean forward computes what transformers' forward computes, bit for bit, in every call the engine makes."""
import pytest
import torch

from dynasd.cache import CachedModel, Runtime, runtime_of, stock_forward
from dynasd.decoders import make_decoder
from dynasd.kernels import fast_linear
from dynasd.kernels.block_weights import block_kernel, use_draft_blocks
from dynasd.kernels.compile import runnable_variants
from dynasd.kernels.gqa_attention import use_packed_gqa
from dynasd.kernels.inplace_cache import in_place_cache
from dynasd.kernels.lean_forward import (
    _rotary_tables,
    _signed_sin,
    compiled_layers,
    fused_projections,
    lean_forward,
    supports,
)
from dynasd.loading.models import load_pair, tiny_llama, tiny_random_pair
from dynasd.options import DecoderOptions
from dynasd.tree import ROOT, TreeShape, ancestor_mask

# Both on the in-place cache: only the forward function differs.
LEAN = Runtime(forward=lean_forward, new_cache=in_place_cache)
STOCK = Runtime(forward=stock_forward, new_cache=in_place_cache)


def forward_calls(model: torch.nn.Module, runtime: Runtime, need_hidden: bool
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A prefill, a one-token step, a chain + tree verify, a path kept, another verify, a one-node step: the
    engine's calls (a feature draft's with seeded feature rows, the same for every runtime)."""
    cached = CachedModel(model, need_hidden=need_hidden, runtime=runtime)
    rows = torch.Generator().manual_seed(0)
    width = model.config.hidden_size

    def features(count: int) -> dict:
        return {"features": torch.randn(count, width, generator=rows)} if cached.reads_features else {}

    tree = TreeShape((2, 2, 1))
    mask = ancestor_mask(tree.parents)
    outputs = [cached.forward(list(range(3, 40)), [], None, [], keep_logits=4, **features(37))]
    outputs.append(cached.forward([41], [], None, [], keep_logits=1, **features(1)))
    positions = [41 + level for level in tree.levels]
    nodes = list(range(5, 5 + tree.num_nodes))
    outputs.append(cached.forward([42, 43], nodes, mask, positions, keep_logits=2 + tree.num_nodes,
                                  **features(2 + tree.num_nodes)))
    first = tree.children[ROOT][1]  # an accepted path of two nodes, not the first ones: keys/values move down
    path = [first, tree.children[first][0]]
    cached.keep_path(path, 44 + len(path))
    outputs.append(cached.forward([60], [61, 62], mask[:2, :2], [47, 47], keep_logits=2, keep_hidden=3,
                                  **features(3)))
    # a draft's usual step: one node, a child of the second node cached this step (it sees it and itself only)
    outputs.append(cached.forward([], [63], torch.tensor([[False, True, True]]), [48], keep_logits=1,
                                  **features(1)))
    return outputs


def assert_lean_is_bitwise_stock(model: torch.nn.Module) -> None:
    """Logits, and hidden states where asked for, equal in every call of `forward_calls`."""
    for need_hidden in (False, True):
        lean, stock = forward_calls(model, LEAN, need_hidden), forward_calls(model, STOCK, need_hidden)
        for (lean_logits, lean_hidden), (logits, hidden) in zip(lean, stock):
            assert torch.equal(lean_logits, logits)
            if need_hidden:
                assert torch.equal(lean_hidden, hidden)


@pytest.mark.parametrize("fast_kernels", [True, False])
def test_lean_forward_is_bitwise_transformers_forward(fast_kernels):
    pair = load_pair("tiny-random", device="cpu", fast_kernels=fast_kernels)
    for model in (pair.target, pair.draft):
        assert supports(model)
        assert_lean_is_bitwise_stock(model)


@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD"])
def test_lean_forward_with_fused_projections_is_bitwise_transformers_forward(monkeypatch, vendor):
    """Layers wide enough for whole panels (k/v of 64 outputs): q/k/v and gate/up run as one kernel call each
    (on Intel only from 2 rows: the one-token step takes the separate layers)."""
    monkeypatch.setattr(fast_linear, "_cpu_vendor", lambda: vendor)
    model = fast_linear.pretranspose_linears(use_packed_gqa(tiny_llama(300, seed=5, layers=2, hidden=128)))
    if fast_linear.panel_kernel() is None or not fast_linear.kernel_pays_here():
        pytest.skip("no compiled kernel on this CPU: nothing to fuse")
    assert all(qkv is not None and gate_up is not None for qkv, gate_up in fused_projections(model))
    assert_lean_is_bitwise_stock(model)


def with_drawn_norms(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with its RMSNorms' weights drawn in [0.5, 1.5): at their initial ones, an operation moved across a
    norm's weight would round the same, and a comparison would not see it."""
    draws = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith("norm.weight"):
                weight.copy_(torch.rand(weight.shape, generator=draws) + 0.5)
    return model


def block_llama(kv_heads: int, variant: str) -> torch.nn.Module:
    """A small Llama on the packed attention whose layers are 8-bit blocks (as a draft's are), in `variant`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=300, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv_heads, initializer_range=0.2,
                         tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(kv_heads)
    model = use_packed_gqa(with_drawn_norms(LlamaForCausalLM(config).eval()))
    kernel = block_kernel(variant)
    if kernel is None:
        pytest.skip(f"no {variant} block kernel here (no compiler)")
    use_draft_blocks(model, kernel)
    fused_projections(model)
    return model


@pytest.mark.parametrize("variant", runnable_variants() or [pytest.param(None, marks=pytest.mark.skip(
    reason="no kernel variant runs on this CPU"))])
@pytest.mark.parametrize("kv_heads", [2, 4])  # grouped queries (packed), and one query head per KV head
def test_the_compiled_layers_are_bitwise_transformers_forward(variant, kv_heads):
    """Where every projection is a block layer, the layers run as one compiled call (block_linear.cpp's
    block_layers): every call of the engine but the first (which shapes the cache) goes through it, and logits and
    hidden states stay bitwise transformers' own."""
    model = block_llama(kv_heads, variant)
    compiled = compiled_layers(model, fused_projections(model))
    assert compiled is not None
    calls = []
    op = compiled.op
    compiled.op = lambda *args: calls.append(args[0].shape[1]) or op(*args)
    assert_lean_is_bitwise_stock(model)
    verify = 2 + TreeShape((2, 2, 1)).num_nodes  # forward_calls' chain and tree
    assert calls == [1, verify, 3, 1] * 2, "the one-token step, the verifies and the one-node step, twice"


def test_lean_forward_with_eager_attention_is_bitwise_transformers_forward():
    """Eager attention adds the float mask to the scores itself: the lean path hands it the same mask."""
    pair = tiny_random_pair()
    pair.target.set_attn_implementation("eager")
    assert supports(pair.target)
    assert_lean_is_bitwise_stock(pair.target)


def test_models_of_other_structures_keep_transformers_forward():
    pair = tiny_random_pair()
    pair.target.train()  # a model in training mode, for one
    assert not supports(pair.target)
    assert not supports(torch.nn.Linear(2, 2))


def test_decoders_on_the_lean_forward_stay_greedy_identical():
    pair = load_pair("tiny-random", device="cpu")
    assert all(runtime_of(model).forward is lean_forward for model in (pair.target, pair.draft, pair.feature_draft))
    ids = pair.encode_prompt("What is speculative decoding?")
    reference = make_decoder(pair, DecoderOptions(method="ar")).generate(ids, 30).new_token_ids
    for method, options in (("sd", dict(gamma=4)), ("mcsd", dict(k_config=(3, 2, 1)))):
        assert make_decoder(pair, DecoderOptions(method=method, **options)).generate(ids, 30).new_token_ids == reference


def test_rotary_tables_hold_exactly_what_the_rotary_embedding_computes():
    """The lean forward indexes tables made once instead of calling the rotary embedding: for any positions, in any
    order and count, the values are bitwise the embedding's own (a draft and its target share one table)."""
    pair = tiny_random_pair()
    rotary = pair.target.model.rotary_emb
    like = torch.zeros(1, dtype=torch.float32)
    cos_table, sin_table = _rotary_tables(rotary, like)
    assert _rotary_tables(pair.draft.model.rotary_emb, like)[0] is cos_table
    gen = torch.Generator().manual_seed(0)
    for count in (1, 3, 16, 300):
        positions = torch.randint(0, rotary.max_seq_len_cached, (1, count), generator=gen)
        cos, sin = rotary(like, position_ids=positions)
        assert torch.equal(cos_table[positions], cos) and torch.equal(sin_table[positions], _signed_sin(sin))


def test_rotary_embeddings_that_change_between_calls_get_no_table():
    pair = tiny_random_pair()
    rotary = pair.target.model.rotary_emb
    rotary.rope_type = "dynamic"
    assert _rotary_tables(rotary, torch.zeros(1)) is None
