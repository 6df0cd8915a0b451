"""A module one model uses from another without owning it: a draft reading its target's embedding.

Why a wrapper and not the module itself: hooks and ownership. A forward hook on a module fires for whichever model
calls it, and the bench's ForwardClock (dynasd/bench/measure.py) tells the target's forwards from the draft's by
hooks on each model's input embedding: with one module object in both models every draft forward counted as the
target's too. And a module that is not registered as a child stays out of the draft's `.to()`, `parameters()` and
`state_dict()`: the target alone owns (and converts) those weights.
"""
from __future__ import annotations

import torch


class SharedModule(torch.nn.Module):
    """Calls `module.forward` directly (so `module`'s own hooks, the target's, do not fire); hooks on this wrapper
    are the borrowing model's."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "shared", module)  # not a child: see the module docstring

    def forward(self, *args, **kwargs):
        return self.shared.forward(*args, **kwargs)

    @property
    def weight(self) -> torch.Tensor:
        return self.shared.weight
