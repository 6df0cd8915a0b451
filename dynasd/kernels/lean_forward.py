"""The decoder's forward pass for Llama-style models without transformers' per-layer wrappers: same arithmetic.

Why: on a CPU a forward of a few tokens spends about a third of its time outside the weight products (figures in
docs/benchmarks.md): every layer goes through keyword-argument plumbing,
deprecation decorators, output capture and mask preprocessing that the engine does not need, since it builds its
own 4D mask and positions. Here the layers run as the plain sequence of the same operations, on the same modules
(projections, rotary embedding, attention function, MLP), in the same order, so the logits are bitwise those of
`model(...)` (tests/test_lean_forward.py). Models of any other structure keep transformers' forward.

Where every projection is a block layer (the embedded target's GGUF blocks, a draft's blocks), the layer loop
runs as one compiled call (`CompiledLayers`: block_linear.cpp's block_layers, the same ATen operations in the same
order, so again bitwise the same): the ~45 small operations of each layer cost ~5 us each from Python, about as much
as the layer's weight products for one token (docs/benchmarks.md, History). Where the embedding, the output layer
and a feature draft's input mixer are block layers too, the whole forward, from CachedModel.forward's token lists
on, is one compiled call (`CompiledForward`: block_forward.h, attached as the runtime's `direct_forward`): what
was left around the layers (mask, ids, positions, lookup, mixer, norm, head, ~20 operations) took a one-layer
feature draft's one-row forward about a quarter of its time (docs/benchmarks.md), far more than the operations cost
on their own: the weights a forward streams push the interpreter out of the core's caches.
"""
from __future__ import annotations

import threading

import torch
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import eager_attention_forward

from ..loading.feature_model import is_feature_draft
from ..loading.shared_module import SharedModule
from .block_weights import BlockEmbedding, BlockLinear, FusedBlocks, kernel_library
from .exact_attention import NAME as EXACT_ATTENTION
from .fast_linear import FusedProjections
from .gqa_attention import NAME as PACKED_GQA
from .inplace_cache import InPlaceLayer

# Models whose layers this file knows (Llama's: self_attn q/k/v/o, mlp gate/up/down, two RMSNorms); others use
# model(...).
_SUPPORTED = ("LlamaForCausalLM",)
_SUPPORTED_ATTENTION = ("sdpa", "dynasd_sdpa", "dynasd_exact", "eager")


def supports(model: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    return (type(model).__name__ in _SUPPORTED and config is not None
            and getattr(config, "_attn_implementation", None) in _SUPPORTED_ATTENTION
            and getattr(config, "pretraining_tp", 1) == 1 and not model.training)


_fuse_lock = threading.Lock()


def fused_projections(model: torch.nn.Module) -> list[tuple]:
    """Per layer, (q/k/v fused, gate/up fused), each None where the layers cannot be fused; made once per model
    (at load: dynasd/kernels/__init__.py asks, so the layers' panels are copied while the load's memory is handed
    back)."""
    with _fuse_lock:
        if getattr(model, "_dynasd_fused", None) is None:
            model._dynasd_fused = [
                (_fused([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
                 _fused([layer.mlp.gate_proj, layer.mlp.up_proj]))
                for layer in model.model.layers]
        return model._dynasd_fused


class CompiledLayers:
    """A model's decoder layers as one call of the compiled `block_layers` (block_layers.h): the layer loop of
    `lean_forward`, op for op, in C++, so the values are bitwise the same. Made by `compiled_layers` where every
    layer's projections are block layers of one kernel variant, the attention is the packed grouped-query SDPA (or
    the exact attention, for 8-bit activations) and the MLP's activation SiLU."""

    def __init__(self, model: torch.nn.Module, fused: list[tuple]) -> None:
        config, layers = model.config, model.model.layers[: model.config.num_hidden_layers]
        self.kernel = fused[0][0].kernel
        self.op = kernel_library(self.kernel).block_layers  # AttributeError: a library built before it existed
        self.norms, self.panels, self.formats = [], [], []
        for layer, (qkv, gate_up) in zip(layers, fused):
            self.norms += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
            products = (qkv, layer.self_attn.o_proj, gate_up, layer.mlp.down_proj)
            self.panels += [product.panels for product in products]
            self.formats += [product.format for product in products]
        attn = layers[0].self_attn
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.intermediate = attn.head_dim, fused[0][1].sizes[0]
        self.eps, self.scaling = float(layers[0].input_layernorm.variance_epsilon), float(attn.scaling)

    def __call__(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention_mask: torch.Tensor,
                 cache) -> torch.Tensor | None:
        """The last layer's hidden states, with every layer's new keys/values cached; None where the cache cannot
        take them in place (its first forward, another kind of cache), and then nothing was computed or written."""
        new = hidden.shape[1]
        past = self.reserve(cache, new)
        if past is None:
            return None
        layers = cache.layers
        hidden = self.op(hidden, cos, sin, attention_mask, self.norms, self.panels, self.formats,
                         [layer.key_buffer for layer in layers], [layer.value_buffer for layer in layers],
                         past, self.heads, self.kv_heads, self.head_dim, self.intermediate, self.eps, self.scaling)
        for layer in layers:
            layer.filled_to(past + new)
        return hidden

    def reserve(self, cache, new: int) -> int | None:
        """Room for `new` positions in every layer's buffers: the positions they hold so far, or None where the cache
        cannot take them in place (its first forward, another kind of cache)."""
        layers = cache.layers
        if getattr(cache, "offloading", False) or len(layers) * 2 != len(self.norms) \
                or not all(type(layer) is InPlaceLayer for layer in layers):
            return None
        filled = {layer.reserve(new) for layer in layers}
        if len(filled) != 1 or None in filled:
            return None
        (past,) = filled
        return past

    def model_arguments(self) -> tuple:
        """The layers' part of block_forward's arguments (norms to scaling, block_forward.h)."""
        return (self.norms, self.panels, self.formats, self.heads, self.kv_heads, self.head_dim, self.intermediate,
                self.eps, self.scaling)


def compiled_layers(model: torch.nn.Module, fused: list[tuple]) -> CompiledLayers | None:
    """The model's layers as one compiled call, or None where the Python loop runs them (decided once per model;
    `fused`: its fused_projections)."""
    with _fuse_lock:
        if not hasattr(model, "_dynasd_compiled_layers"):
            model._dynasd_compiled_layers = _compiled_layers_of(model, fused)
        return model._dynasd_compiled_layers


def _compiled_layers_of(model: torch.nn.Module, fused: list[tuple]) -> CompiledLayers | None:
    config = model.config
    if config._attn_implementation not in (PACKED_GQA, EXACT_ATTENTION) \
            or getattr(config, "hidden_act", None) != "silu":
        return None
    layers = model.model.layers[: config.num_hidden_layers]
    blocks = all(isinstance(qkv, FusedBlocks) and isinstance(gate_up, FusedBlocks) and len(gate_up.sizes) == 2
                 and isinstance(layer.self_attn.o_proj, BlockLinear) and isinstance(layer.mlp.down_proj, BlockLinear)
                 and type(layer.mlp.act_fn).__name__ in ("SiLUActivation", "SiLU")
                 for layer, (qkv, gate_up) in zip(layers, fused))
    norms = [norm for layer in layers for norm in (layer.input_layernorm, layer.post_attention_layernorm)]
    if not blocks or len({qkv.kernel for qkv, _ in fused}) != 1 or len({norm.variance_epsilon for norm in norms}) != 1 \
            or any(norm.weight.dtype != torch.float32 for norm in norms):
        return None
    try:
        return CompiledLayers(model, fused)
    except AttributeError:  # a kernel library built before block_layers existed
        return None


class CompiledForward:
    """A model's whole forward as one call of the compiled `block_forward` (block_forward.h), from
    CachedModel.forward's own arguments: the mask, ids and positions as cache.py makes them, the embedding lookup
    (and a feature draft's input mixer, feature_draft.draft_inputs), the layers as CompiledLayers runs them, the
    final norm and the output layer (a SubsetHead's rows and their scatter into the full vocabulary), op for op, so
    the values are bitwise those of CachedModel on lean_forward. Made by `compiled_forward` where the layers compile
    and the embedding, the mixer and the output layer are block layers of the same kernel.

    The modules it stands in for are not called, as CompiledLayers' layers are not; but the input embedding's
    forward pre-hooks and the output layer's forward hooks are, around the call, with what the modules would be
    given and give: the bench's ForwardClock times a forward between the two. Where those modules hold hooks of
    other kinds, the forward runs in Python."""

    def __init__(self, model: torch.nn.Module, layers: CompiledLayers, embedding: BlockEmbedding,
                 mixer: BlockLinear | None, head: BlockLinear, head_ids: torch.Tensor | None, vocab_size: int,
                 tables: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.op = kernel_library(head.kernel).block_forward.default  # AttributeError: a library built before it
        self.layers, self.mixes_features = layers, mixer is not None
        self.first, self.last = model.get_input_embeddings(), model.get_output_embeddings()
        norm = model.model.norm
        # block_forward's arguments from `embedding` on: the model's, the same for every call
        self.model_arguments = (embedding.head.panels, embedding.head.format,
                                mixer.panels if mixer is not None else None, mixer.format if mixer is not None else 0,
                                *tables, *layers.model_arguments(), norm.weight, float(norm.variance_epsilon),
                                head.panels, head.format, head_ids, vocab_size)

    def __call__(self, cache, tokens: list[int], positions: list[int], past: int, n_chain: int,
                 tree_mask: torch.Tensor | None, keep_logits: int, need_hidden: bool, features: torch.Tensor | None,
                 keep_hidden: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """CachedModel.forward's (logits, hidden states or None), with every layer's new keys/values cached; None
        where this call cannot run compiled (see the class and CompiledLayers.__call__; a cache that holds other
        than `past` positions), and then nothing was computed, written or called."""
        if (features is not None) != self.mixes_features or not _hooks_it_calls(self.first, self.last):
            return None
        new = len(tokens)
        if self.layers.reserve(cache, new) != past:
            return None
        pre_hooks, hooks = self.first._forward_pre_hooks, self.last._forward_hooks
        if pre_hooks:
            tokens = _call_pre_hooks(self.first, pre_hooks, tokens)
        layers = cache.layers
        logits, hidden, head_input = self.op(tokens, positions, past, n_chain, tree_mask, features,
                                             [layer.key_buffer for layer in layers],
                                             [layer.value_buffer for layer in layers], keep_logits, keep_hidden,
                                             *self.model_arguments)
        for layer in layers:
            layer.filled_to(past + new)
        if hooks:
            logits = _call_hooks(self.last, hooks, head_input, logits)
        return logits, (hidden if need_hidden else None)


def _call_pre_hooks(module: torch.nn.Module, hooks: dict, tokens: list[int]) -> list[int]:
    """The tokens after `module`'s forward pre-hooks, called as its own call would call them on the ids tensor."""
    args = (torch.tensor([tokens], dtype=torch.long),)
    for hook in list(hooks.values()):
        replaced = hook(module, args)
        if replaced is not None:
            args = replaced if isinstance(replaced, tuple) else (replaced,)
    return args[0].reshape(-1).tolist()


def _call_hooks(module: torch.nn.Module, hooks: dict, head_input: torch.Tensor, logits: torch.Tensor
                ) -> torch.Tensor:
    """The logits after `module`'s forward hooks, called as its own call would call them (on the batch's rows)."""
    output = logits[None]
    for hook in list(hooks.values()):
        replaced = hook(module, (head_input,), output)
        if replaced is not None:
            output = replaced
    return output[0]


def _hooks_it_calls(first: torch.nn.Module, last: torch.nn.Module) -> bool:
    """Whether the only hooks on the input embedding and the output layer are those CompiledForward calls: plain
    forward pre-hooks on the one, plain forward hooks on the other, and no global ones."""
    return not (first._forward_hooks or first._forward_pre_hooks_with_kwargs or last._forward_pre_hooks
                or last._forward_hooks_with_kwargs or last._forward_hooks_always_called
                or _global_forward_pre_hooks or _global_forward_hooks)


def direct_forward(model: torch.nn.Module, cache, tokens: list[int], positions: list[int], past: int, n_chain: int,
                   tree_mask: torch.Tensor | None, keep_logits: int, need_hidden: bool,
                   features: torch.Tensor | None, keep_hidden: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """cache.Runtime's direct_forward: the model's compiled forward where it has one and it runs this call, else
    None (CachedModel then runs lean_forward). CachedModel.forward calls it in inference mode."""
    whole = model.__dict__.get(_COMPILED_FORWARD, _NOT_YET)
    if whole is _NOT_YET:
        whole = compiled_forward(model)
    if whole is None:
        return None
    return whole(cache, tokens, positions, past, n_chain, tree_mask, keep_logits, need_hidden, features, keep_hidden)


_COMPILED_FORWARD = "_dynasd_compiled_forward"
_NOT_YET = object()


def compiled_forward(model: torch.nn.Module) -> CompiledForward | None:
    """The model's whole forward as one compiled call, or None where lean_forward runs its parts (decided once per
    model, at its first forward: a draft's shared embedding is set after its layers are made blocks)."""
    layers = compiled_layers(model, fused_projections(model))
    with _fuse_lock:
        if not hasattr(model, _COMPILED_FORWARD):
            setattr(model, _COMPILED_FORWARD, _compiled_forward_of(model, layers) if layers is not None else None)
        return getattr(model, _COMPILED_FORWARD)


def _compiled_forward_of(model: torch.nn.Module, layers: CompiledLayers) -> CompiledForward | None:
    inner = model.model
    embedding = inner.embed_tokens
    embedding = embedding.shared if isinstance(embedding, SharedModule) else embedding
    mixer = getattr(inner, "feature_fc", None) if is_feature_draft(model) else None
    head, head_ids, vocab_size = model.lm_head, None, getattr(model.lm_head, "out_features", 0)
    if type(head).__name__ == "SubsetHead":  # dynasd.loading.models.SubsetHead (which imports this package)
        head, head_ids, vocab_size = head.rows, head.token_ids, head.vocab_size
    if not isinstance(embedding, BlockEmbedding) or not isinstance(head, BlockLinear) \
            or (is_feature_draft(model) and not isinstance(mixer, BlockLinear)) \
            or any(parameter.dtype != torch.float32 for parameter in model.parameters()):  # the mask's dtype too
        return None
    kernels = {embedding.head.kernel, head.kernel, layers.kernel} | ({mixer.kernel} if mixer is not None else set())
    tables = _rotary_tables(inner.rotary_emb, inner.norm.weight.new_zeros(1))
    if len(kernels) != 1 or tables is None:
        return None
    try:
        return CompiledForward(model, layers, embedding, mixer, head, head_ids, vocab_size, tables)
    except AttributeError:  # a kernel library built before block_forward existed
        return None


def _fused(layers: list[torch.nn.Module]):
    return FusedProjections.of(layers) or FusedBlocks.of(layers)


def _rms_norm(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm.forward, op for op; on float32 inputs without its two casts (no-ops then) and with the
    temporaries updated in place (the same values, fewer tensors made)."""
    if x.dtype != torch.float32:
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        return norm.weight * (x * torch.rsqrt(variance + norm.variance_epsilon)).to(dtype)
    variance = x.pow(2).mean(-1, keepdim=True)
    return norm.weight * (x * variance.add_(norm.variance_epsilon).rsqrt_())


def _rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """transformers' `x * cos + rotate_half(x) * sin` with the sign of rotate_half moved onto the sine:
    (-a) * b == a * (-b) exactly, so the values are the same, one operation fewer per call."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * signed_sin


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


# Positions per call of the rotary embedding when its tables are made: 256 x head_dim values stay below torch's
# grain for splitting an elementwise op across threads, so every call computes each value as a forward's call would.
_TABLE_BLOCK = 256
_tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _rotary_tables(rotary: torch.nn.Module, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(cos, signed sine) of every position the model takes, in `like`'s dtype and device, made once by the
    model's own rotary embedding: a forward then indexes them (2 operations) instead of computing them (~20).
    Models of one rotary configuration share them (the embedded target and its drafts: 4 MB). None for rotary
    embeddings whose values change between calls (rope types other than "default")."""
    made = rotary.__dict__.setdefault("_dynasd_tables", {})
    place = (like.dtype, like.device)
    if place not in made:
        made[place] = None
        if getattr(rotary, "rope_type", None) == "default" and hasattr(rotary, "inv_freq"):
            key = (tuple(rotary.inv_freq.tolist()), float(rotary.attention_scaling), rotary.max_seq_len_cached, *place)
            if key not in _tables:
                blocks = [rotary(like, position_ids=torch.arange(start, start + _TABLE_BLOCK, device=like.device)[None])
                          for start in range(0, rotary.max_seq_len_cached, _TABLE_BLOCK)]
                _tables[key] = (torch.cat([cos[0] for cos, _ in blocks]),
                                torch.cat([_signed_sin(sin[0]) for _, sin in blocks]))
            made[place] = _tables[key]
    return made[place]


def _attention_function(model: torch.nn.Module):
    return ALL_ATTENTION_FUNCTIONS.get_interface(model.config._attn_implementation, eager_attention_forward)


@torch.inference_mode()
def lean_forward(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 position_ids: torch.Tensor, cache, logits_to_keep: int, need_hidden: bool = False,
                 inputs_embeds: torch.Tensor | None = None, hidden_to_keep: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits of the last `logits_to_keep` inputs, the final normed hidden states of the last
    max(`hidden_to_keep`, `logits_to_keep`) inputs or None), as model(...) gives them with a 4D additive
    `attention_mask` (1, 1, q, past + q), explicit `position_ids` and `cache` (and `inputs_embeds` instead of
    embedding `input_ids`, for feature drafts)."""
    inner = model.model
    hidden = inner.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
    tables = _rotary_tables(inner.rotary_emb, hidden)
    if tables is not None:
        cos, sin = tables[0][position_ids], tables[1][position_ids]
    else:
        cos, sin = inner.rotary_emb(hidden, position_ids=position_ids)
        sin = _signed_sin(sin)
    # (batch, q, 1, head_dim): applied to the projections before their heads are moved to dim 1, which gives the
    # rotated query and key the very strides transformers' rotation of the moved heads gives them.
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    batch, q_len = input_ids.shape
    fused = fused_projections(model)
    compiled = compiled_layers(model, fused) if attention_mask.dim() == 4 and attention_mask.shape[1] == 1 else None
    after_layers = compiled(hidden, cos, sin, attention_mask, cache) if compiled is not None else None
    if after_layers is not None:
        return _head(model, after_layers, logits_to_keep, need_hidden, hidden_to_keep)
    attention = _attention_function(model)
    for layer, (qkv, gate_up) in zip(inner.layers[: model.config.num_hidden_layers], fused):
        attn = layer.self_attn
        x = _rms_norm(layer.input_layernorm, hidden)
        if qkv is not None:
            query, key, value = qkv(x)
        else:
            query, key, value = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        shape = (batch, q_len, -1, attn.head_dim)
        query = _rotary(query.view(shape), cos, sin).transpose(1, 2)
        key = _rotary(key.view(shape), cos, sin).transpose(1, 2)
        value = value.view(shape).transpose(1, 2)
        key, value = cache.update(key, value, attn.layer_idx)
        out, _ = attention(attn, query, key, value, attention_mask, dropout=0.0, scaling=attn.scaling)
        hidden = hidden + attn.o_proj(out.reshape(batch, q_len, -1).contiguous())
        mlp = layer.mlp
        x = _rms_norm(layer.post_attention_layernorm, hidden)
        gate, up = gate_up(x) if gate_up is not None else (mlp.gate_proj(x), mlp.up_proj(x))
        hidden = hidden + mlp.down_proj(mlp.act_fn(gate) * up)
    return _head(model, hidden, logits_to_keep, need_hidden, hidden_to_keep)


def _head(model: torch.nn.Module, hidden: torch.Tensor, logits_to_keep: int, need_hidden: bool,
          hidden_to_keep: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The final norm and the output layer over the last layer's hidden states."""
    hidden = _rms_norm(model.model.norm, hidden)
    kept = hidden[:, -logits_to_keep:, :]
    return model.lm_head(kept), (hidden[:, -max(hidden_to_keep, logits_to_keep):] if need_hidden else None)
