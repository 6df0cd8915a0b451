"""Tree attention through transformers, and KV-cache compaction, against full recomputation: on stock
transformers (a DynamicCache) and on the accelerated pair (the in-place cache, the lean forward)."""
import pytest
import torch
from conftest import pair_on

from dynasd.cache import CachedModel
from dynasd.kernels.inplace_cache import InPlaceLayer
from dynasd.tree import TreeShape, ancestor_mask, path_to


@pytest.fixture(scope="module", params=["accelerated", "stock"])
def any_pair(request, device):
    """tiny-random on each device under test, accelerated as users load it and on stock transformers."""
    return pair_on("tiny-random", device, fast_kernels=request.param == "accelerated")


def full_logits(model, ids: list[int]) -> torch.Tensor:
    """Next-token logits after `ids`, computed from scratch with a plain causal forward."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids], device=model.device)).logits[0, -1].float()


def random_tree_tokens(shape: TreeShape, vocab: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (shape.num_nodes,), generator=gen).tolist()


@pytest.mark.parametrize("branching", [(4, 2, 2, 1), (3, 1, 2), (1, 1, 1), (2, 3)])
def test_every_tree_node_sees_exactly_its_path(any_pair, branching):
    model = any_pair.target
    prompt = any_pair.encode_prompt("tree attention")
    shape = TreeShape(branching)
    tokens = random_tree_tokens(shape, any_pair.vocab_size, seed=len(branching))
    runner = CachedModel(model)
    runner.prefill(prompt[:-1])
    positions = [len(prompt) + level - 1 for level in shape.levels]
    logits, _ = runner.forward(prompt[-1:], tokens, ancestor_mask(shape.parents), positions,
                               keep_logits=1 + shape.num_nodes)
    assert torch.allclose(logits[0], full_logits(model, prompt), atol=1e-4)
    for node in range(shape.num_nodes):
        path_tokens = [tokens[i] for i in path_to(node, shape.parents)]
        assert torch.allclose(logits[1 + node], full_logits(model, prompt + path_tokens), atol=1e-4), node


@pytest.mark.parametrize("accepted_leaf", [0, 5, 11, 43])
def test_keeping_the_accepted_path_matches_recomputation(any_pair, accepted_leaf):
    model = any_pair.target
    prompt = any_pair.encode_prompt("compaction")
    shape = TreeShape((4, 2, 2, 1))
    tokens = random_tree_tokens(shape, any_pair.vocab_size, seed=accepted_leaf)
    runner = CachedModel(model)
    runner.prefill(prompt[:-1])
    positions = [len(prompt) + level - 1 for level in shape.levels]
    runner.forward(prompt[-1:], tokens, ancestor_mask(shape.parents), positions, keep_logits=1)
    path = path_to(accepted_leaf, shape.parents)
    committed = prompt + [tokens[i] for i in path]
    runner.keep_path(path, len(committed))
    assert runner.cached_len == len(committed) and runner.cache.get_seq_length() == len(committed)
    # the next token after the kept path: cached forward vs. recomputing everything
    next_token = 7
    cached = runner.prefill([next_token])[-1]
    assert torch.allclose(cached, full_logits(model, committed + [next_token]), atol=1e-4)


def test_rejecting_everything_drops_all_tree_entries(any_pair):
    runner = CachedModel(any_pair.target)
    prompt = any_pair.encode_prompt("reject")
    runner.prefill(prompt[:-1])
    shape = TreeShape((2, 2))
    runner.forward(prompt[-1:], [5, 6, 7, 8, 9, 10], ancestor_mask(shape.parents),
                   [len(prompt)] * 2 + [len(prompt) + 1] * 4, keep_logits=1)
    runner.keep_path([], len(prompt))
    assert runner.cache.get_seq_length() == len(prompt) == runner.cached_len
    assert torch.allclose(runner.prefill([11])[-1], full_logits(any_pair.target, prompt + [11]), atol=1e-4)


def test_cache_grows_in_place_and_stays_exact_across_regrowth(tiny_pair):
    """Keys/values live in a buffer with spare room: a forward writes only its new tokens (the buffer stays the same
    object until it is full), and results stay exact across growth, tree steps, kept paths and crops."""
    model = tiny_pair.target
    gen = torch.Generator().manual_seed(3)
    committed = torch.randint(3, tiny_pair.vocab_size, (40,), generator=gen).tolist()
    runner = CachedModel(model)
    runner.prefill(committed[:-1])
    layer = runner.cache.layers[0]
    assert isinstance(layer, InPlaceLayer)
    buffers = [layer.key_buffer.data_ptr()]
    shape = TreeShape((2, 2, 1))
    for step in range(120):
        tokens = random_tree_tokens(shape, tiny_pair.vocab_size, seed=step)
        positions = [len(committed) + level - 1 for level in shape.levels]
        runner.forward(committed[runner.cached_len:], tokens, ancestor_mask(shape.parents), positions,
                       keep_logits=1)
        path = path_to(step % shape.num_nodes, shape.parents)
        committed += [tokens[i] for i in path]
        runner.keep_path(path, len(committed))
        if layer.key_buffer.data_ptr() != buffers[-1]:
            buffers.append(layer.key_buffer.data_ptr())
        assert layer.keys.data_ptr() == layer.key_buffer.data_ptr()
    assert len(committed) > 300 and 2 <= len(buffers) <= 4  # it grew, a few times, not every step
    cached = runner.prefill([5])[-1]
    assert torch.allclose(cached, full_logits(model, committed + [5]), atol=1e-4)


def test_the_cache_goes_in_under_the_name_the_installed_transformers_reads():
    """transformers 5.21 renamed the forward's `past_key_values` to `cache`; Python 3.10 gets 5.20 at most, where
    a `cache=` keyword would vanish into **kwargs and every forward would run without its cache."""
    from transformers import LlamaForCausalLM

    from dynasd.cache import cache_keyword

    class Before521:
        def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs):
            """The signature transformers 5.20 gives a causal LM."""

    assert cache_keyword(Before521) == "past_key_values"
    assert cache_keyword(LlamaForCausalLM) == "cache"


def test_a_short_runs_cache_reserves_little_empty_room(tiny_pair):
    """A buffer gets half its filled length, at least MIN_ROOM, of spare room: enough for a step's tree, not the
    hundreds of empty positions per layer that every session of the app would hold for a short run."""
    from dynasd.kernels.inplace_cache import MIN_ROOM

    runner = CachedModel(tiny_pair.target)
    runner.prefill(list(range(3, 43)))
    layer = runner.cache.layers[0]
    assert layer.key_buffer.shape[-2] == 40 + MIN_ROOM and MIN_ROOM <= 64


def test_a_layers_length_moves_in_its_buffers_and_a_tensor_from_elsewhere_takes_their_place():
    """A compiled forward's `reserve`/`filled_to` and a crop only move the filled length (the keys read are the
    buffer's prefix, the same bytes); keys and values assigned from elsewhere replace the buffers, and the next
    update starts new ones holding them."""
    gen = torch.Generator().manual_seed(0)
    states = torch.randn(2, 1, 3, 12, 8, generator=gen)
    layer = InPlaceLayer()
    layer.update(states[0, :, :, :5], states[1, :, :, :5])
    buffer = layer.key_buffer
    assert layer.reserve(4) == 5 and layer.key_buffer is buffer
    buffer[:, :, 5:9], layer.value_buffer[:, :, 5:9] = states[0, :, :, 5:9], states[1, :, :, 5:9]
    layer.filled_to(9)
    assert layer.get_seq_length() == 9 and layer.keys.data_ptr() == buffer.data_ptr()
    assert torch.equal(layer.keys, states[0, :, :, :9]) and torch.equal(layer.values, states[1, :, :, :9])
    layer.crop(-3)
    assert layer.get_seq_length() == 6 and torch.equal(layer.keys, states[0, :, :, :6])
    layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
    assert layer.key_buffer is None and layer.value_buffer is None and layer.get_seq_length() == 6
    keys, values = layer.update(states[0, :, :, 6:7], states[1, :, :, 6:7])
    assert layer.key_buffer is not None and layer.get_seq_length() == 7
    assert torch.equal(keys, states[0, :, :, :7]) and torch.equal(values, states[1, :, :, :7])
