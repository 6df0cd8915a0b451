"""KV caches that grow in place: a forward copies only its new keys/values, never the layer's whole cache.

Why: transformers' DynamicLayer concatenates on every update, i.e. copies the layer's whole cache on every
forward, a cost that grows with the context: growing in place saved 1-3% of a forward at 160 cached tokens and
2-11% at 800 (embedded pair on CPU, 2026-11-30, docs/benchmarks.md). The cached values are the same; only where
they live changes.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..cache import stock_cache

# Spare room a buffer gets beyond half its filled length, at least: room for a step's tree, without reserving
# memory a short run never uses (256 held ~12 MB of empty keys/values per embedded-target cache, every app session).
MIN_ROOM = 64


class InPlaceLayer(DynamicLayer):
    """A cache layer that writes new keys/values into spare room instead of concatenating.

    `keys`/`values` are views of the filled prefix of a buffer that grows by half when full, so a forward copies
    only its new tokens, cropping shortens the views, and writes through the views (keeping a tree path) land in
    the buffer.
    """

    def __init__(self) -> None:
        super().__init__()
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        filled = self.keys.shape[-2] if self.keys.dim() == 4 else 0
        needed = filled + key_states.shape[-2]
        buffer = self.key_buffer
        if buffer is None or needed > buffer.shape[-2] or self.keys.data_ptr() != buffer.data_ptr():
            self._grow(key_states, value_states, filled, needed + max(needed // 2, MIN_ROOM))
        self.key_buffer[:, :, filled:needed] = key_states
        self.value_buffer[:, :, filled:needed] = value_states
        self.keys = self.key_buffer[:, :, :needed]
        self.values = self.value_buffer[:, :, :needed]
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, filled: int, capacity: int) -> None:
        batch, heads, _, key_dim = key_states.shape
        keys = key_states.new_empty(batch, heads, capacity, key_dim)
        values = value_states.new_empty(batch, heads, capacity, value_states.shape[-1])
        if filled:
            keys[:, :, :filled] = self.keys
            values[:, :, :filled] = self.values
        self.key_buffer, self.value_buffer = keys, values

    def reset(self) -> None:
        self.key_buffer = self.value_buffer = None
        super().reset()


def in_place_cache(model: torch.nn.Module) -> DynamicCache:
    """A model's DynamicCache whose plain layers grow in place (layers of other kinds, e.g. sliding-window ones,
    stay transformers' own)."""
    cache = stock_cache(model)
    cache.layers = [InPlaceLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
