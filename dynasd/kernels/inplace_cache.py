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


class _FilledPrefix:
    """A layer's `keys` (or `values`): the first `filled` positions of its buffer, made into a view only when read.

    Why: a compiled forward writes every layer's new positions into the buffers itself and a kept tree path drops
    the rest, so the cache's length changes twice a step in every layer; two views per layer and change cost ~7 us
    from Python, ~0.25 ms a step for a 30-layer target. Here a change of length is one integer. Anything else
    assigned (transformers' empty start, a reset, another device) is kept as it is and lets the buffer go."""

    def __set_name__(self, owner, name: str) -> None:
        self.buffer, self.plain = f"{name[:-1]}_buffer", f"_{name}"

    def __get__(self, layer, owner=None):
        if layer is None:
            return self
        buffer = getattr(layer, self.buffer)
        return getattr(layer, self.plain) if buffer is None else buffer[:, :, :layer.filled]

    def __set__(self, layer, tensor) -> None:
        buffer = getattr(layer, self.buffer, None)
        if buffer is not None and tensor is not None and _prefix_of(tensor, buffer):
            layer.filled = tensor.shape[2]
        else:
            setattr(layer, self.buffer, None)
            setattr(layer, self.plain, tensor)


def _prefix_of(tensor: torch.Tensor, buffer: torch.Tensor) -> bool:
    """Whether `tensor` is the buffer's first positions (a view that a crop or a read made of it)."""
    return (tensor.dim() == 4 and tensor.data_ptr() == buffer.data_ptr() and tensor.stride() == buffer.stride()
            and tensor.shape[:2] == buffer.shape[:2] and tensor.shape[3] == buffer.shape[3])


class InPlaceLayer(DynamicLayer):
    """A cache layer that writes new keys/values into spare room instead of concatenating.

    `keys`/`values` are the filled prefix of a buffer that grows by half when full (`_FilledPrefix`), so a forward
    copies only its new tokens, cropping shortens the prefix, and writes through them (keeping a tree path) land in
    the buffer.
    """

    keys = _FilledPrefix()
    values = _FilledPrefix()

    def __init__(self) -> None:
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None
        self.filled = 0
        super().__init__()

    @property
    def buffered(self) -> bool:
        """Both keys and values live in buffers (after the first forward)."""
        return self.key_buffer is not None and self.value_buffer is not None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        filled = self.get_seq_length()
        needed = filled + key_states.shape[-2]
        self._make_room(key_states, value_states, filled, needed)
        self.key_buffer[:, :, filled:needed] = key_states
        self.value_buffer[:, :, filled:needed] = value_states
        self.filled_to(needed)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        if self.buffered:
            return self.filled
        return super().get_seq_length()

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' crop (a negative count), as a shorter prefix of the buffers."""
        if not self.buffered or tokens_to_remove > 0:
            return super().crop(tokens_to_remove)
        self.filled = max(self.filled - abs(tokens_to_remove), 0)

    def reserve(self, new: int) -> int | None:
        """Room for `new` more positions, for a compiled forward that writes them into the buffers itself
        (block_linear.cpp's block_layers, which then calls `filled_to`): the positions filled so far, or None where
        this layer cannot take them that way (nothing cached yet: the first forward shapes the buffers)."""
        if not self.buffered:
            return None
        filled = self.filled
        self._make_room(self.key_buffer, self.value_buffer, filled, filled + new)
        return filled

    def filled_to(self, needed: int) -> None:
        """The cached keys/values are the buffers' first `needed` positions (after a compiled forward wrote them)."""
        self.filled = needed

    def _make_room(self, like_keys: torch.Tensor, like_values: torch.Tensor, filled: int, needed: int) -> None:
        if not self.buffered or needed > self.key_buffer.shape[-2]:
            self._grow(like_keys, like_values, filled, needed + max(needed // 2, MIN_ROOM))

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, filled: int, capacity: int) -> None:
        batch, heads, _, key_dim = key_states.shape
        keys = key_states.new_empty(batch, heads, capacity, key_dim)
        values = value_states.new_empty(batch, heads, capacity, value_states.shape[-1])
        if filled:
            keys[:, :, :filled] = self.keys
            values[:, :, :filled] = self.values
        self.key_buffer, self.value_buffer, self.filled = keys, values, filled

    def reset(self) -> None:
        self.key_buffer = self.value_buffer = None
        self.filled = 0
        super().reset()


def in_place_cache(model: torch.nn.Module) -> DynamicCache:
    """A model's DynamicCache whose plain layers grow in place (layers of other kinds, e.g. sliding-window ones,
    stay transformers' own)."""
    cache = stock_cache(model)
    cache.layers = [InPlaceLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
