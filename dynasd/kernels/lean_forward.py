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
as the layer's weight products for one token (docs/benchmarks.md, History).
"""
from __future__ import annotations

import threading

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import eager_attention_forward

from .block_weights import BlockLinear, FusedBlocks, kernel_library
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
        self.op = kernel_library(fused[0][0].kernel).block_layers  # AttributeError: a library built before it existed
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
        layers, new = cache.layers, hidden.shape[1]
        if getattr(cache, "offloading", False) or len(layers) * 2 != len(self.norms) \
                or not all(type(layer) is InPlaceLayer for layer in layers):
            return None
        filled = {layer.reserve(new) for layer in layers}
        if len(filled) != 1 or None in filled:
            return None
        (past,) = filled
        hidden = self.op(hidden, cos, sin, attention_mask, self.norms, self.panels, self.formats,
                         [layer.key_buffer for layer in layers], [layer.value_buffer for layer in layers],
                         past, self.heads, self.kv_heads, self.head_dim, self.intermediate, self.eps, self.scaling)
        for layer in layers:
            layer.filled_to(past + new)
        return hidden


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
