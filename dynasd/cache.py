"""A model with its KV cache and the bookkeeping speculative decoding needs.

The cache always holds a prefix of the committed tokens (`cached_len` of them), possibly followed by tree nodes of
the current step. Keys/values of the tree nodes on the accepted path are moved down in place, the rest is cropped,
so the prefix is never recomputed and never copied as a whole.

How a model is run (its forward function and the KV cache it fills) is its `Runtime`: stock transformers unless
something attached another to the model (dynasd/kernels/ does, at load). This file never knows which kernels run.
"""
from __future__ import annotations

import copy
import functools
import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

from .loading.feature_model import draft_inputs, is_feature_draft

# forward(model, input_ids, attention_mask, position_ids, cache, logits_to_keep, need_hidden, inputs_embeds,
#         hidden_to_keep) -> (logits of the last `logits_to_keep` inputs, final hidden states or None)
ForwardFunction = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
# direct_forward(model, cache, tokens, positions, past, n_chain, tree_mask, keep_logits, need_hidden, features,
#                keep_hidden) -> CachedModel.forward's (logits, hidden states or None), or None where it does not run
DirectForwardFunction = Callable[..., tuple[torch.Tensor, torch.Tensor | None] | None]


def stock_forward(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  position_ids: torch.Tensor, cache: Cache, logits_to_keep: int, need_hidden: bool = False,
                  inputs_embeds: torch.Tensor | None = None, hidden_to_keep: int = 0
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' own forward with a 4D additive mask and explicit positions; the hidden states returned are
    the final normed ones of every input (the caller keeps the last `hidden_to_keep`)."""
    out = model(input_ids=None if inputs_embeds is not None else input_ids, inputs_embeds=inputs_embeds,
                attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                logits_to_keep=logits_to_keep, output_hidden_states=need_hidden,
                **{cache_keyword(type(model)): cache})
    return out.logits, out.hidden_states[-1] if need_hidden else None


@functools.cache
def cache_keyword(model_class: type) -> str:
    """The name under which a model's forward takes its KV cache: transformers renamed `past_key_values` to `cache`
    in 5.21 (the old name warns until it is removed), and Python 3.10 gets 5.20 at most, where `cache` would be
    swallowed by **kwargs and silently ignored."""
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def stock_cache(model: torch.nn.Module) -> Cache:
    """A new empty DynamicCache laid out for `model`: a copy of one made from its config once.

    Why a copy: DynamicCache(config) reads the layer types out of the config anew (~70 us on a CPU, ~20 us to
    copy an empty one), and every run of a decoder starts two caches, a cost the sampled runs of a tiny pair
    feel (5% of a run)."""
    empty = _EMPTY_CACHES.get(model)
    if empty is None:
        empty = _EMPTY_CACHES[model] = DynamicCache(config=model.config)
    return copy.deepcopy(empty)


_EMPTY_CACHES: weakref.WeakKeyDictionary[torch.nn.Module, Cache] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Runtime:
    """How CachedModel runs one model: its forward function (and, optionally, a direct one that takes its calls
    as they come) and a factory for the KV cache it fills.

    Every runtime must compute what stock transformers computes (same logits, same cache contents); they may differ
    in speed only, which is why the decoders need not know which one runs."""

    forward: ForwardFunction = stock_forward
    new_cache: Callable[[torch.nn.Module], Cache] = stock_cache
    # A forward from CachedModel.forward's own arguments (token and position lists, the tree mask, a feature
    # draft's rows) that makes the mask, ids, positions and a feature draft's input mix itself, as CachedModel
    # would; None where it does not run a call (then CachedModel makes them and calls `forward`). Why: a compiled
    # forward makes them inside its one call, where from Python they cost a dozen small operations.
    direct_forward: DirectForwardFunction | None = None


STOCK_RUNTIME = Runtime()
_RUNTIME_ATTRIBUTE = "dynasd_runtime"


def runtime_of(model: torch.nn.Module) -> Runtime:
    """The runtime attached to `model`, or stock transformers'."""
    return getattr(model, _RUNTIME_ATTRIBUTE, STOCK_RUNTIME)


def attach_runtime(model: torch.nn.Module, runtime: Runtime) -> torch.nn.Module:
    """Make every CachedModel of `model` run on `runtime` from now on."""
    setattr(model, _RUNTIME_ATTRIBUTE, runtime)
    return model


def step_mask(past: int, n_chain: int, q_len: int, tree_mask: torch.Tensor | None, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    """The additive attention mask (q_len, past + q_len) of a forward that feeds `n_chain` committed tokens, then
    tree nodes, after `past` cached positions.

    Chain rows see the committed tokens and the chain causally; tree rows see every committed token and, among
    tree nodes (the last tree_mask.shape[1] columns: the tree nodes cached this step plus the new ones), only those
    `tree_mask` names: their ancestors and themselves. A chain is only fed before any tree node of the step is
    cached: the layout is [committed | tree]. Built as one bool mask, made additive once (a compiled forward makes
    it the same way: block_forward.h)."""
    kv_len = past + q_len
    visible = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    if n_chain:
        visible[:n_chain, past:].tril_()
    if q_len > n_chain:
        visible[n_chain:, kv_len - tree_mask.shape[1]:] = tree_mask
    mask = torch.full((q_len, kv_len), float("-inf"), dtype=dtype, device=device)
    return mask.masked_fill_(visible, 0.0)  # additive: a bool mask is silently wrong with eager attention


class CachedModel:
    """One model, its KV cache, and how many committed tokens and tree nodes the cache holds.

    It runs on the model's attached runtime; `runtime` overrides that (tests and scripts compare runtimes on one
    model). `need_hidden` makes forwards return final hidden states too (stop policies, feature drafts)."""

    def __init__(self, model: torch.nn.Module, need_hidden: bool = False, runtime: Runtime | None = None) -> None:
        self.model = model
        self.runtime = runtime if runtime is not None else runtime_of(model)
        parameter = next(model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.need_hidden = need_hidden
        self.reads_features = is_feature_draft(model)
        self.reset()

    def reset(self) -> None:
        self.cache = self.runtime.new_cache(self.model)
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
        tokens = chain + nodes
        positions = list(range(self.cached_len, self.cached_len + n_chain)) + list(node_positions)
        direct = self.runtime.direct_forward
        outputs = direct(self.model, self.cache, tokens, positions, past, n_chain, tree_mask, keep_logits,
                         self.need_hidden, features, keep_hidden) if direct is not None else None
        if outputs is None:
            outputs = self._forward(tokens, positions, past, n_chain, tree_mask, keep_logits, features, keep_hidden)
        self.forwards += 1
        self.cached_len += n_chain
        self.tree_len += n_nodes
        return outputs

    def _forward(self, tokens: list[int], positions: list[int], past: int, n_chain: int,
                 tree_mask: torch.Tensor | None, keep_logits: int, features: torch.Tensor | None,
                 keep_hidden: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """forward() through the runtime's `forward`: the mask, ids and positions as tensors."""
        mask = step_mask(past, n_chain, len(tokens), tree_mask, self.dtype, self.device)
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        position_ids = torch.tensor([positions], device=self.device)
        embeds = draft_inputs(self.model, ids, features[None]) if features is not None else None
        logits, hidden = self.runtime.forward(self.model, ids, mask[None, None], position_ids, self.cache,
                                              keep_logits, self.need_hidden, inputs_embeds=embeds,
                                              hidden_to_keep=keep_hidden)
        hidden = hidden[0, -max(keep_hidden, keep_logits):] if hidden is not None else None
        logits = logits[0, -keep_logits:]
        return logits if logits.dtype == torch.float32 else logits.float(), hidden

    def prefill(self, tokens: list[int], keep_logits: int = 1) -> torch.Tensor:
        """Cache `tokens` (committed) and return the logits of the last `keep_logits` of them."""
        logits, _ = self.forward(tokens, [], None, [], keep_logits)
        return logits

    def crop(self, length: int) -> None:
        """Forget the committed tokens from position `length` on: text that is no longer committed (a run's tokens
        past its end, before the conversation goes on). Only between steps, with no tree nodes cached."""
        if self.tree_len:
            raise RuntimeError("crop() is for committed text only: tree nodes are still cached")
        if length < self.cached_len:
            self.cache.crop(length - self.cached_len)  # transformers crops by a negative count
            self.cached_len = length

    @torch.inference_mode()
    def keep_path(self, path_nodes: list[int], committed_len: int) -> None:
        """Keep the cached tree nodes in `path_nodes` (increasing node indices) as committed tokens, drop the rest.

        Only nodes that were actually fed this step can be kept; the caller passes the fed prefix of the path.
        """
        base = self.cached_len
        m = len(path_nodes)
        if path_nodes and path_nodes != list(range(m)):
            src = torch.tensor([base + node for node in path_nodes], device=self.device)
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
