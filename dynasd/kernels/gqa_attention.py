"""SDPA attention that does not copy the KV cache for a masked multi-token forward of a grouped-query model.

Why: transformers' sdpa path repeats every layer's cached keys and values to all query heads (`repeat_kv`, a real
copy) whenever a forward has more than one query token *and* an explicit mask, which is exactly a tree verify. For
SmolLM2 (9 query heads on 3 KV heads) that copies ~3.7 MB per layer at 800 cached tokens and made a 3-node verify
cost 1.3-1.5x a 1-token step. Here the query heads that share a KV head are stacked as extra query rows instead
(and the mask rows tiled to match), so attention reads the cache as it is. Every other case (one query token, no
mask, no grouping) goes to transformers' own sdpa function unchanged, and masks are built exactly as for "sdpa".
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "dynasd_sdpa"

# Every layer of one forward gets the same mask tensor: tile it once, not once per layer (2-4% of a verify).
# (mask, its in-place version, key length, groups, tiled mask); replaced whole, so concurrent forwards stay correct.
# Inference-mode tensors keep no version counter: the engine and transformers build a new mask per forward.
_last_tile: tuple = (None, -1, 0, 0, None)


def tiled_mask(mask: torch.Tensor, key_len: int, groups: int) -> torch.Tensor:
    """The mask's rows repeated once per query head of a group, matching the stacked query rows."""
    global _last_tile
    source, version, length, n_groups, tiled = _last_tile
    current = -1 if mask.is_inference() else mask._version
    if source is not mask or version != current or length != key_len or n_groups != groups:
        tiled = mask[:, :, :, :key_len].repeat(1, 1, groups, 1)
        _last_tile = (mask, current, key_len, groups, tiled)
    return tiled


def packed_gqa_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    **kwargs) -> tuple[torch.Tensor, None]:
    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, q_len, dim = query.shape
    if groups == 1 or q_len == 1 or attention_mask is None or attention_mask.shape[1] != 1 \
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kv_heads = heads // groups
    # Query heads h*groups .. h*groups+groups-1 read KV head h (repeat_kv's order): stack them as rows.
    stacked = query.reshape(batch, kv_heads, groups * q_len, dim)
    mask = tiled_mask(attention_mask, key.shape[2], groups)
    out = torch.nn.functional.scaled_dot_product_attention(
        stacked, key, value, attn_mask=mask, dropout_p=dropout if module.training else 0.0, scale=scaling)
    out = out.reshape(batch, heads, q_len, dim).transpose(1, 2).contiguous()
    return out, None


def use_packed_gqa(model: torch.nn.Module) -> torch.nn.Module:
    """Switch a model that runs on "sdpa" to this attention (others, and architectures that cannot change their
    attention function, are left as they are)."""
    can_switch = getattr(model, "_can_set_attn_implementation", None)
    if getattr(model.config, "_attn_implementation", None) != "sdpa" or can_switch is None or not can_switch():
        return model
    AttentionInterface.register(NAME, packed_gqa_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return model
