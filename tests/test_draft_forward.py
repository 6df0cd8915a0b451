"""The compiled whole forward (block_forward.h, from the mask to the logits) computes what CachedModel computes on
lean_forward and on transformers' forward, bit for bit: for a feature draft (the target's block embedding, an
8-bit input mixer, a reduced 4-bit head) and a target (a tied Q8_0 embedding and output layer), in both kernel
variants and both arithmetics, in every call the engine makes."""
import pytest
import torch
from test_lean_forward import LEAN, STOCK, block_llama, forward_calls, with_drawn_norms

from dynasd.cache import Runtime
from dynasd.kernels.block_weights import (
    FLOAT32,
    INT8,
    Q8_0,
    RAW_BYTES,
    BlockEmbedding,
    BlockLinear,
    block_kernel,
    exact_attention_op,
    use_draft_blocks,
)
from dynasd.kernels.compile import runnable_variants
from dynasd.kernels.exact_attention import use_exact_attention
from dynasd.kernels.gqa_attention import use_packed_gqa
from dynasd.kernels.inplace_cache import in_place_cache
from dynasd.kernels.lean_forward import compiled_forward, direct_forward, lean_forward
from dynasd.loading.feature_model import add_feature_input
from dynasd.loading.models import SubsetHead, tiny_llama
from dynasd.loading.shared_module import SharedModule
from dynasd.tree import TreeShape

DIRECT = Runtime(forward=lean_forward, new_cache=in_place_cache, direct_forward=direct_forward)
VOCAB = 320  # whole panels of 32 rows
VARIANTS = runnable_variants() or [pytest.param(None, marks=pytest.mark.skip(reason="no kernel variant runs here"))]
FIRST = (runnable_variants() or (None,))[0]  # None: this process's variant, where block_pair then skips
VERIFY = 2 + TreeShape((2, 2, 1)).num_nodes  # forward_calls' chain and tree


def q8_layer(weight: torch.Tensor, kernel, arithmetic: str) -> BlockLinear:
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    raw = quantize(weight.detach().float().numpy(), GGMLQuantizationType.Q8_0)
    return BlockLinear(Q8_0, torch.from_numpy(raw.reshape(weight.shape[0], -1, RAW_BYTES[Q8_0])), kernel, arithmetic)


def in_blocks(model: torch.nn.Module, kernel, arithmetic: str, variant: str) -> torch.nn.Module:
    """`model` accelerated as load_pair accelerates a draft: packed attention, 8-bit layers (4-bit head), the
    exact attention for 8-bit activations (its norms drawn first: with_drawn_norms)."""
    use_packed_gqa(with_drawn_norms(model))
    use_draft_blocks(model, kernel, arithmetic)
    if arithmetic == INT8:
        use_exact_attention(model, exact_attention_op(variant))
    return model


def block_pair(variant: str, arithmetic: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(target, feature draft): the target's embedding and output layer one Q8_0 layer (a GGUF target's tied
    blocks), the one-layer draft reading that embedding through a SharedModule, its head 64 of the tokens."""
    kernel = block_kernel(variant)
    if kernel is None:
        pytest.skip(f"no {variant} block kernel here (no compiler)")
    target = tiny_llama(VOCAB, seed=11, layers=2, hidden=128)
    draft = add_feature_input(tiny_llama(VOCAB, seed=12, layers=1, hidden=128), state_scale=0.5)
    tokens = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))[:64].tolist()
    draft.lm_head = SubsetHead(draft.lm_head.weight, tokens)
    head = q8_layer(target.model.embed_tokens.weight, kernel, arithmetic)
    in_blocks(target, kernel, arithmetic, variant)
    target.lm_head, target.model.embed_tokens = head, BlockEmbedding(head)
    in_blocks(draft, kernel, arithmetic, variant)
    draft.model.embed_tokens = SharedModule(target.model.embed_tokens)
    assert all(isinstance(layer, BlockLinear) for layer in (draft.model.feature_fc, draft.lm_head.rows))
    return target, draft


def counted(model: torch.nn.Module) -> list[int]:
    """The rows of every block_forward call on `model` from now on."""
    whole = compiled_forward(model)
    assert whole is not None
    calls, op = [], whole.op
    whole.op = lambda tokens, *args: calls.append(len(tokens)) or op(tokens, *args)
    return calls


def assert_direct_is_bitwise_lean_and_stock(model: torch.nn.Module) -> None:
    for need_hidden in (False, True):
        direct = forward_calls(model, DIRECT, need_hidden)
        for reference in (LEAN, STOCK):
            for (logits, hidden), (expected_logits, expected_hidden) in zip(
                    direct, forward_calls(model, reference, need_hidden)):
                assert logits.dtype == torch.float32 and torch.equal(logits, expected_logits)
                assert (hidden is None) == (not need_hidden)
                assert hidden is None or torch.equal(hidden, expected_hidden)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("arithmetic", [INT8, FLOAT32])
def test_the_compiled_forward_is_bitwise_the_python_forward(variant, arithmetic):
    """Every call but the first (which shapes the cache) runs as one block_forward call, for the draft and the
    target, and their logits and hidden states are bitwise those of the Python path around the compiled layers and
    of transformers' forward."""
    for model in block_pair(variant, arithmetic):
        calls = counted(model)
        assert_direct_is_bitwise_lean_and_stock(model)
        assert calls == [1, VERIFY, 3, 1] * 2, "the one-token step, the verifies and the one-node step, twice"


def test_the_hooks_that_time_a_forward_see_what_the_modules_would():
    """The bench's ForwardClock times a forward from the input embedding's pre-hook to the output layer's hook:
    the compiled forward calls them with the ids, the output layer's input and its logits, as the modules do."""
    _, draft = block_pair(FIRST, INT8)
    seen = []
    draft.get_input_embeddings().register_forward_pre_hook(lambda module, args: seen.append(args))
    draft.get_output_embeddings().register_forward_hook(lambda module, args, output: seen.append((*args, output)))
    calls = counted(draft)

    def hooked(runtime: Runtime) -> list[tuple]:
        seen.clear()
        forward_calls(draft, runtime, need_hidden=True)
        return list(seen)

    python, compiled = hooked(LEAN), hooked(DIRECT)
    assert calls == [1, VERIFY, 3, 1] and len(compiled) == len(python) == 2 * 5
    for got, expected in zip(compiled, python):
        assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))


def test_other_hooks_and_other_models_keep_the_python_forward():
    """A hook the compiled forward would not call (here a forward hook on the input embedding) sends a call down
    the Python path, as does a model whose parts are not all blocks (a float32 embedding)."""
    target, _ = block_pair(FIRST, INT8)
    calls = counted(target)
    handle = target.get_input_embeddings().register_forward_hook(lambda *args: None)
    assert_direct_is_bitwise_lean_and_stock(target)
    assert calls == []
    handle.remove()
    assert compiled_forward(block_llama(2, FIRST)) is None
