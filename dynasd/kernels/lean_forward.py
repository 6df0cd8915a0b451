"""The decoder's forward pass for Llama-style models without transformers' per-layer wrappers: same arithmetic.

Why: on a CPU a forward of a few tokens spends a third of its time outside the weight products (2026-12-01, AMD
EPYC, 1-token target forward 27 ms, of which the products 17): every layer goes through keyword-argument plumbing,
deprecation decorators, output capture and mask preprocessing that the engine does not need, since it builds its
own 4D mask and positions. Here the layers run as the plain sequence of the same operations, on the same modules
(projections, rotary embedding, attention function, MLP), in the same order, so the logits are bitwise those of
`model(...)` (tests/test_lean_forward.py). Models of any other structure keep transformers' forward.
"""
from __future__ import annotations

import threading

import torch

from .block_weights import FusedBlocks
from .fast_linear import FusedProjections

# Models whose layers this file knows (Llama's: self_attn q/k/v/o, mlp gate/up/down, two RMSNorms); others use
# model(...).
_SUPPORTED = ("LlamaForCausalLM",)
_SUPPORTED_ATTENTION = ("sdpa", "dynasd_sdpa", "eager")


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
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import eager_attention_forward

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
    attention = _attention_function(model)
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
    hidden = _rms_norm(inner.norm, hidden)
    kept = hidden[:, -logits_to_keep:, :]
    return model.lm_head(kept), (hidden[:, -max(hidden_to_keep, logits_to_keep):] if need_hidden else None)
