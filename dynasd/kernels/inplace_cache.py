"""KV caches that grow in place: a forward copies only its new keys/values, never the layer's whole cache.

Why: transformers' DynamicLayer concatenates on every update, i.e. copies the layer's whole cache on every
forward, a cost that grows with the context (what growing in place saves: docs/benchmarks.md). The cached values
are the same; only where they live changes.
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
        self._make_room(key_states, value_states, filled, needed)
        self.key_buffer[:, :, filled:needed] = key_states
        self.value_buffer[:, :, filled:needed] = value_states
        self.filled_to(needed)
        return self.keys, self.values

    def reserve(self, new: int) -> int | None:
        """Room for `new` more positions, for a compiled forward that writes them into the buffers itself
        (block_linear.cpp's block_layers, which then calls `filled_to`): the positions filled so far, or None where
        this layer cannot take them that way (nothing cached yet: the first forward shapes the buffers)."""
        if not self.is_initialized or self.keys.dim() != 4:
            return None
        filled = self.keys.shape[-2]
        self._make_room(self.keys, self.values, filled, filled + new)
        return filled

    def filled_to(self, needed: int) -> None:
        """The cached keys/values are the buffers' first `needed` positions (after a compiled forward wrote them)."""
        self.keys = self.key_buffer[:, :, :needed]
        self.values = self.value_buffer[:, :, :needed]

    def _make_room(self, like_keys: torch.Tensor, like_values: torch.Tensor, filled: int, needed: int) -> None:
        buffer = self.key_buffer
        if buffer is None or needed > buffer.shape[-2] or self.keys.data_ptr() != buffer.data_ptr():
            self._grow(like_keys, like_values, filled, needed + max(needed // 2, MIN_ROOM))

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
