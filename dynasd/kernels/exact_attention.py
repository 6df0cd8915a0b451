"""Attention for models whose block layers compute in 8-bit activations: exact_attention.h's, whose every row is
bitwise what the same row gets alone (a verify row as in ar), made the model's own attention implementation.

Why the model's own: lean_forward and the compiled layers call it, and so does every forward that goes through
transformers' modules (transformers' generate, the bench's assisted generation, a test's reference), so one loaded
model computes in one arithmetic whatever runs it.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "dynasd_exact"


def exact_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface over the compiled op: (batch, q, heads, head_dim) out. A missing mask is
    causal over the last q keys; a bool mask (True: seen) becomes 0 / -inf."""
    q_len, kv_len = query.shape[2], key.shape[2]
    if attention_mask is None:
        seen = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
        attention_mask = seen[None, None]
    if attention_mask.dtype == torch.bool:
        attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill_(
            ~attention_mask, float("-inf"))
    scale = module.scaling if scaling is None else scaling
    out = module.dynasd_exact_attention(query, key, value, attention_mask[:, :, :, :kv_len].float(), float(scale))
    return out.transpose(1, 2).contiguous(), None


def use_exact_attention(model: torch.nn.Module, op) -> torch.nn.Module:
    """Make `op` (the block kernel library's exact_attention) the attention of every layer of a Llama model."""
    AttentionInterface.register(NAME, exact_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    for layer in model.model.layers:
        layer.self_attn.dynasd_exact_attention = op
    model.set_attn_implementation(NAME)
    return model
