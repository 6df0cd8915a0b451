"""A model with its KV cache and the bookkeeping speculative decoding needs.

The cache always holds a prefix of the committed tokens (`cached_len` of them), possibly followed by tree nodes of
the current step. Keys/values of the tree nodes on the accepted path are moved down in place, the rest is cropped,
so the prefix is never recomputed and never copied as a whole.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .feature_draft import draft_inputs, is_feature_draft
from .kernels.lean_forward import lean_forward, supports
from .tree import additive


class InPlaceLayer(DynamicLayer):
    """A cache layer that writes new keys/values into spare room instead of concatenating.

    Why: transformers' DynamicLayer concatenates on every update, i.e. copies the layer's whole cache on every
    forward, a cost that grows with the context. Here `keys`/`values` are views of the filled prefix of a buffer
    that grows by half when full, so a forward copies only its new tokens, cropping shortens the views, and writes
    through the views (keeping a tree path) land in the buffer.
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
            self._grow(key_states, value_states, filled, needed + max(needed // 2, 256))
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


class CachedModel:
    def __init__(self, model: torch.nn.Module, need_hidden: bool = False, in_place: bool = True,
                 lean: bool = False) -> None:
        self.model = model
        self.in_place = in_place
        self.lean = lean and supports(model)  # dynasd/lean_forward.py: the same logits, fewer host operations
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.need_hidden = need_hidden
        self.reads_features = is_feature_draft(model)
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        if self.in_place:
            self.cache.layers = [InPlaceLayer() if type(layer) is DynamicLayer else layer
                                 for layer in self.cache.layers]
        self.cached_len = 0   # committed tokens whose keys/values are in the cache
        self.tree_len = 0     # tree nodes of the current step cached after them
        self.forwards = 0

    @torch.inference_mode()
    def forward(self, chain: list[int], nodes: list[int], tree_mask: torch.Tensor | None,
                node_positions: list[int], keep_logits: int, features: torch.Tensor | None = None,
                keep_hidden: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed `chain` (committed tokens not yet cached, causal) then `nodes` (tree nodes whose attention is
        `tree_mask`: rows = the new nodes, columns = all tree nodes cached this step plus the new ones).
        A feature draft (feature_draft.py) also takes one feature row per input in `features`.

        Returns the logits of the last `keep_logits` inputs (float32) and, if asked for, the final hidden states
        of the last max(`keep_hidden`, `keep_logits`) inputs.
        """
        if self.reads_features != (features is not None):
            raise ValueError("a feature draft needs one feature row per input, and only a feature draft takes them")
        past = self.cached_len + self.tree_len
        n_chain, n_nodes = len(chain), len(nodes)
        q_len = n_chain + n_nodes
        kv_len = past + q_len
        mask = torch.zeros(q_len, kv_len, dtype=self.dtype, device=self.device)
        if n_chain:
            chain_block = torch.ones(n_chain, n_chain, dtype=torch.bool, device=self.device).tril()
            mask[:n_chain, past:past + n_chain] = additive(chain_block, self.dtype)
            mask[:n_chain, past + n_chain:] = float("-inf")
        if n_nodes:
            # Tree nodes see every committed token and, among tree nodes, only their ancestors and themselves.
            # A chain is only fed before any tree node of the step is cached: the layout is [committed | tree].
            tree_cols = tree_mask.shape[1]
            mask[n_chain:, kv_len - tree_cols:] = additive(tree_mask.to(self.device), self.dtype)
        positions = list(range(self.cached_len, self.cached_len + n_chain)) + list(node_positions)
        ids = torch.tensor([chain + nodes], dtype=torch.long, device=self.device)
        position_ids = torch.tensor([positions], device=self.device)
        embeds = draft_inputs(self.model, ids, features[None]) if features is not None else None
        if self.lean:
            logits, hidden = lean_forward(self.model, ids, mask[None, None], position_ids, self.cache, keep_logits,
                                          self.need_hidden, inputs_embeds=embeds, hidden_to_keep=keep_hidden)
        else:
            out = self.model(input_ids=None if embeds is not None else ids, inputs_embeds=embeds,
                             attention_mask=mask[None, None], position_ids=position_ids, cache=self.cache,
                             use_cache=True, logits_to_keep=keep_logits, output_hidden_states=self.need_hidden)
            logits, hidden = out.logits, out.hidden_states[-1] if self.need_hidden else None
        self.forwards += 1
        self.cached_len += n_chain
        self.tree_len += n_nodes
        hidden = hidden[0, -max(keep_hidden, keep_logits):] if hidden is not None else None
        return logits[0, -keep_logits:].float(), hidden

    def prefill(self, tokens: list[int], keep_logits: int = 1) -> torch.Tensor:
        """Cache `tokens` (committed) and return the logits of the last `keep_logits` of them."""
        logits, _ = self.forward(tokens, [], None, [], keep_logits)
        return logits

    @torch.inference_mode()
    def keep_path(self, path_nodes: list[int], committed_len: int) -> None:
        """Keep the cached tree nodes in `path_nodes` (increasing node indices) as committed tokens, drop the rest.

        Only nodes that were actually fed this step can be kept; the caller passes the fed prefix of the path.
        """
        base = self.cached_len
        m = len(path_nodes)
        if path_nodes and path_nodes != list(range(m)):
            src = torch.tensor(path_nodes, device=self.device) + base
            for layer in self.cache.layers:
                # Gather first, then write: sources lie at or after their destinations.
                layer.keys[:, :, base:base + m] = layer.keys.index_select(2, src)
                layer.values[:, :, base:base + m] = layer.values.index_select(2, src)
        drop = self.tree_len - m
        if drop:
            self.cache.crop(-drop)
        self.cached_len = base + m
        self.tree_len = 0
        assert self.cached_len <= committed_len
