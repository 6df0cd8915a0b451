"""From logits to distributions, drawing candidates, and the acceptance rules.

The same `SamplingConfig` warps target and draft logits: the acceptance ratio p/q is only lossless when q is the
distribution the candidate was actually drawn from. At temperature 0 everything reduces to argmax comparisons.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .tree import ROOT


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_k: int = 0      # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self) -> None:
        if not (0.0 <= self.temperature <= 10.0):
            raise ValueError(f"temperature must lie in [0, 10], got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top-p must lie in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top-k must be 0 (off) or positive, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def logits_to_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) on the last axis; float32 probabilities."""
    logits = logits.float() / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if cfg.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= cfg.top_p  # keep the smallest prefix whose mass reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def draw_candidates(probs: torch.Tensor, k: int, replacement: bool, generator: torch.Generator) -> torch.Tensor:
    """k candidates per row of `probs` (rows, V), in draw order.

    Without replacement this is sequential sampling (each draw from q with earlier draws removed), done at once
    with exponential races: the order of `q / E` with E ~ Exp(1) is the sequential draw order.
    Rows with fewer than k non-zero entries get padding candidates of probability 0; the walk skips them.
    """
    if replacement:
        return torch.multinomial(probs, k, replacement=True, generator=generator)
    races = torch.empty_like(probs).exponential_(generator=generator)
    keys = probs / races
    return torch.topk(keys, k, dim=-1).indices


def sample_one(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator).item())


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)); falls back to p when p <= q everywhere (then rejection had probability 0)."""
    diff = torch.clamp(p - q, min=0.0)
    total = diff.sum()
    return diff / total if total > 0 else p


# ---------------------------------------------------------------------------------------------------------------
# Acceptance walks: start at a context, try its children, descend into the first accepted one.

@dataclass
class NodeTest:
    """One acceptance test, as the trace records it."""

    node: int
    accepted: bool
    p: float | None = None      # target probability used in the test (after earlier residual updates)
    q: float | None = None      # draft probability used in the test (after earlier removals)
    u: float | None = None      # the uniform draw


@dataclass
class WalkResult:
    path: list[int]                       # accepted node indices, top-down
    tests: list[NodeTest] = field(default_factory=list)
    final_context: int = ROOT             # where the walk stopped
    final_had_children: bool = False      # True: every child was rejected (correction); False: leaf (bonus)
    final_probs: torch.Tensor | None = None  # the distribution the next token must come from (sampling only)


def greedy_walk(start: int, children: Callable[[int], list[int]], tokens: list[int],
                target_argmax: Callable[[int], int]) -> WalkResult:
    """Temperature 0: a child is accepted iff it is the target's argmax at its parent; identical to greedy."""
    result = WalkResult(path=[], final_context=start)
    node = start
    while True:
        kids = children(node)
        best = target_argmax(node)
        match = None
        for kid in kids:
            ok = tokens[kid] == best
            result.tests.append(NodeTest(kid, ok))
            if ok:
                match = kid
                break
        if match is None:
            result.final_context, result.final_had_children = node, bool(kids)
            return result
        result.path.append(match)
        node = match


def mcss_walk(start: int, children: Callable[[int], list[int]], tokens: list[int],
              target_probs: Callable[[int], torch.Tensor], draft_probs: Callable[[int], torch.Tensor],
              without_replacement: bool, generator: torch.Generator) -> WalkResult:
    """Multi-candidate speculative sampling (Yang et al. 2024), lossless for i.i.d. or sequential draws.

    At each node try the children in draw order: accept x with probability min(1, p(x)/q(x)); after a rejection
    p <- norm(max(p - q, 0)) and, when the children were drawn without replacement, also q(x) <- 0, q <- norm(q).
    """
    result = WalkResult(path=[], final_context=start)
    node = start
    while True:
        kids = children(node)
        p = target_probs(node)
        q = draft_probs(node) if kids else None
        match = None
        for kid in kids:
            x = tokens[kid]
            qx = float(q[x])
            if qx <= 0.0:  # padding: this candidate could not have been drawn
                continue
            px = float(p[x])
            u = float(torch.rand((), generator=generator, device=generator.device))
            ok = u * qx <= px
            result.tests.append(NodeTest(kid, ok, p=px, q=qx, u=u))
            if ok:
                match = kid
                break
            p = residual(p, q)
            if without_replacement:
                q = q.clone()
                q[x] = 0.0
                mass = q.sum()
                if mass <= 0:
                    break
                q = q / mass
        if match is None:
            result.final_context, result.final_had_children = node, bool(kids)
            result.final_probs = p
            return result
        result.path.append(match)
        node = match
