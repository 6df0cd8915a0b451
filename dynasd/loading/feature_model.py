"""A draft that reads the target's own hidden states: feature drafting (EAGLE, Li et al. 2024, arXiv 2401.15077).

Why: a 3-layer draft that sees only tokens agrees with SmolLM2-135M on ~35% of Spec-Bench answer tokens, too few for
long accepted chains. The target's final hidden state at position t already encodes its whole reading of the
context; a draft given (token t+1, target state at t) only has to take one more step, which a single layer does far
better than a small model starting from tokens alone. Verification is unchanged, so every method stays exactly as
lossless as with any other draft.

The draft is a plain Llama model of one (or a few) layers sharing the target's embedding and output layer, plus one
linear layer `model.feature_fc` that mixes the two inputs: input at position i = fc([embed(token i), feature i-1]).
`feature i-1` is the target's final normed hidden state (what its output layer reads) at position i-1 for committed
tokens, and the draft's own final hidden state for tree nodes (the target has not read their parents yet); training
asks the draft's hidden state to match the target's for exactly that reason.

This file is the model side (building, loading, the input mixer); dynasd/sources/feature_draft.py is how the
speculative loop feeds it the target's states.
"""
from __future__ import annotations

import torch

FEATURE_KEY = "dynasd_feature_draft"  # set in the draft's config.json


def is_feature_draft(model: torch.nn.Module | None) -> bool:
    return model is not None and bool(getattr(getattr(model, "config", None), FEATURE_KEY, False))


def add_feature_input(draft: torch.nn.Module, state_scale: float = 1.0) -> torch.nn.Module:
    """Give a Llama model the input mixer of a feature draft (before its weights are loaded or trained).

    Initialised to token embedding + `state_scale` x the state (weight [I | s I]): training starts from something
    sensible instead of noise. With 0 a trained token draft starts out exactly as it was, and learns to use the
    states from there. No bias: a bias-free linear layer becomes 8-bit blocks in the engine like the draft's other
    projections (block_weights.use_draft_blocks), where a biased one stays in float16 panels at ~3x the time."""
    hidden = draft.config.hidden_size
    fc = torch.nn.Linear(2 * hidden, hidden, bias=False)
    with torch.no_grad():
        eye = torch.eye(hidden)
        fc.weight.copy_(torch.cat([eye, state_scale * eye], dim=1))
    draft.model.feature_fc = fc.to(draft.model.embed_tokens.weight.dtype)
    setattr(draft.config, FEATURE_KEY, True)
    return draft


def draft_inputs(draft: torch.nn.Module, ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """The input embeddings of a feature draft: fc([embed(ids), features]); ids (batch, n), features (batch, n, d)."""
    embeds = draft.model.embed_tokens(ids)
    return draft.model.feature_fc(torch.cat([embeds, features.to(embeds.dtype)], dim=-1))
