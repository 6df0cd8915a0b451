"""From logits to distributions, drawing candidates, and the acceptance rules.

The same `SamplingConfig` warps target and draft logits: the acceptance ratio p/q is only lossless when q is the
distribution the candidate was actually drawn from. At temperature 0 everything reduces to argmax comparisons.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .ranges import Float, Int
from .tree import ROOT

# The ranges of the sampling settings: SamplingConfig checks them, and the options table (options.py) offers them.
TEMPERATURE = Float(0.0, 10.0)
TOP_P = Float(0.0, 1.0, open_low=True)
TOP_K = Int(0)


@dataclass(frozen=True)
class SamplingConfig:
    """How a distribution is warped before it is sampled. Its ranges are the options table's (the same objects), so a
    config made in code is checked as the CLI and the app check theirs."""

    temperature: float = 0.0
    top_k: int = 0      # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self) -> None:
        for kind, value, title in ((TEMPERATURE, self.temperature, "temperature"), (TOP_P, self.top_p, "top-p"),
                                   (TOP_K, self.top_k, "top-k")):
            problem = kind.problem(value, title)
            if problem:
                raise ValueError(problem)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """The argmax of every row of (n, V) logits, the first index on ties, as `torch.argmax`.

    Why numpy on CPU: torch's CPU argmax over a 49,152-wide row takes ~140 us (it returns indices without
    vectorizing), numpy's ~5 us; every step takes one per verified row and greedy drafting one per drafted node.
    """
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return logits.detach().numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def logits_to_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) on the last axis; float32 probabilities."""
    logits = logits.float()
    if cfg.temperature != 1.0:  # dividing by 1 changes no value: one tensor op fewer per warp at T = 1
        logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if cfg.top_p < 1.0:
        probs = nucleus(probs, cfg.top_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


NUCLEUS_CANDIDATES = 256


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """`probs` with every token outside the nucleus set to 0 (not renormalised): per row, the smallest
    most-probable prefix whose mass reaches top_p is kept.

    A full sort of a 49k vocabulary costs ~10 ms a row on a CPU; the nucleus almost always lies within the top few
    hundred tokens, so sort those (topk) and fall back to the full sort only for rows they do not cover. When they
    are the whole vocabulary they cover every row, and no host read asks.
    """
    k = min(NUCLEUS_CANDIDATES, probs.shape[-1])
    top_probs, order = torch.topk(probs, k, dim=-1)
    kept = _keep_prefix(top_probs, order, top_p, probs)
    if k < probs.shape[-1]:
        uncovered = top_probs.sum(dim=-1) < top_p
        if bool(uncovered.any()):
            rows = probs[uncovered]
            kept[uncovered] = _keep_prefix(*torch.sort(rows, dim=-1, descending=True), top_p, rows)
    return kept


def _keep_prefix(sorted_probs: torch.Tensor, order: torch.Tensor, top_p: float, like: torch.Tensor) -> torch.Tensor:
    """Rows like `like`: the entries of `sorted_probs` (at vocabulary positions `order`) whose predecessors' mass
    is below top_p, every other entry 0."""
    outside = (torch.cumsum(sorted_probs, -1) - sorted_probs) >= top_p
    return torch.zeros_like(like).scatter(-1, order, sorted_probs.masked_fill(outside, 0.0))


def draw_candidates(probs: torch.Tensor, k: int, replacement: bool, generator: torch.Generator) -> torch.Tensor:
    """k candidates per row of `probs` (rows, V), in draw order.

    Without replacement this is literal sequential sampling: each draw comes from q with the earlier draws removed
    (k small multinomial draws; exponential races would need a random number per vocabulary entry).
    Rows with fewer than k non-zero entries get padding candidates of probability 0; the walk skips them.
    """
    if replacement or k == 1:  # one draw per row is the same with or without replacement (and the same uniforms)
        return inverse_cdf(probs, k, generator)
    # Every uniform at once, laid out (draw, row) as k rounds of one uniform per row would have drawn them.
    uniforms = _uniforms((k,) + probs.shape[:-1], generator, probs.device).unsqueeze(-1)
    # A draw never picks a zero entry and removes the entry it picks, so a row with n non-zero entries runs out
    # after n draws: one host read says from which draw on some row needs padding.
    nonzero = (probs > 0).sum(dim=-1)
    first_exhausted = int(nonzero.min()) if nonzero.numel() else k
    remaining = probs
    picks: list[torch.Tensor] = []
    for draw in range(k):
        weights = remaining
        if draw >= first_exhausted:  # rare: pad with zero-probability tokens not drawn yet
            exhausted = nonzero <= draw
            weights = remaining.clone()
            unseen = (probs[exhausted] == 0).to(probs.dtype)
            for earlier in picks:
                unseen.scatter_(-1, earlier[exhausted], 0.0)
            weights[exhausted] = unseen
        pick = _search(weights, uniforms[draw])
        picks.append(pick)
        if draw + 1 < k:  # the first removal copies `probs`, later ones write into that copy
            remaining = remaining.scatter(-1, pick, 0.0) if draw == 0 else remaining.scatter_(-1, pick, 0.0)
    return picks[0] if k == 1 else torch.cat(picks, dim=-1)


def draw_children(logits: torch.Tensor, probs: torch.Tensor | None, k: int, replacement: bool,
                  generator: torch.Generator) -> list[int]:
    """k candidates per row, parent-major: the top k of `logits` at temperature 0 (`probs` None), else k draws
    from the warped `probs`."""
    if probs is None:
        return argmax_rows(logits) if k == 1 else torch.topk(logits, k, dim=-1).indices.flatten().tolist()
    return draw_candidates(probs, k, replacement, generator).flatten().tolist()


def inverse_cdf(weights: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """k independent draws per row from unnormalised non-negative weights (rows, V) -> (rows, k).

    torch.multinomial draws a random number per vocabulary entry when asked for one sample; one uniform per
    draw and a binary search over the cumulative sum is ~10x cheaper for a 49k vocabulary.
    """
    return _search(weights, _uniforms(weights.shape[:-1] + (k,), generator, weights.device))


def _uniforms(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Uniforms in (0, 1]: a target of 0 would find a leading zero-weight entry."""
    return 1.0 - torch.rand(shape, generator=generator, device=device)


def _search(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the entry at each of `uniforms` (rows, k) times the row's total weight, by the cumulative sum."""
    cumulative = torch.cumsum(weights, dim=-1)
    targets = uniforms * cumulative[..., -1:]
    # the first index whose cumulative weight reaches the target: never a zero-weight entry
    return torch.searchsorted(cumulative, targets).clamp_(max=weights.shape[-1] - 1)


def probs_at(table: torch.Tensor, rows: list[int], tokens: list[int]) -> list[float]:
    """table[rows[i], tokens[i]] for every i, in one gather and one host read (rows are 0 for a 1-D table)."""
    return values_at(table, rows, tokens).tolist()


def values_at(table: torch.Tensor, rows: list[int], tokens: list[int]) -> torch.Tensor:
    """table[rows[i], tokens[i]] for every i, gathered where the table lies (no host read)."""
    width = table.shape[-1]
    flat = torch.tensor([row * width + token for row, token in zip(rows, tokens)], device=table.device)
    return torch.take(table, flat)


def sample_one(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(inverse_cdf(probs, 1, generator).item())


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)); falls back to p when p <= q everywhere (then rejection had probability 0)."""
    diff = torch.clamp(p - q, min=0.0)
    total = float(diff.sum())
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


@dataclass
class Draws:
    """Candidates at one context drawn in order from one distribution `q`; without replacement, each from q with
    the earlier ones removed. A deterministic candidate is a group of its own with a one-hot q."""

    nodes: list[int]
    q: torch.Tensor
    without_replacement: bool = True


def _read_at(q: torch.Tensor, p: torch.Tensor, x: int) -> tuple[float, float]:
    """q(x) and p(x) in one host read: one synchronisation per tested candidate on a GPU instead of two."""
    if q.device == p.device and q.dtype == p.dtype:
        qx, px = torch.stack((q[x], p[x])).tolist()
        return qx, px
    return float(q[x]), float(p[x])


# The acceptance test as every figure and text states it. p′ and q′ are the p and q the test used: for the first
# candidate under a node the target's and the draft's distributions; after rejected siblings, the residual
# norm(max(p - q, 0)) and (drawn without replacement) q without them, renormalised.
ACCEPT_RULE = "u < min(1, p′/q′)"
REJECT_RULE = "u ≥ min(1, p′/q′)"


def passes(u: float, p_test: float, q_test: float) -> bool:
    """Whether a candidate passes its test, ACCEPT_RULE: u in [0, 1) below min(1, p′/q′), i.e. u q′ < p′ (no
    division: a candidate with q′ = 0 is never tested, one with p′ = 0 never passes)."""
    return u * q_test < p_test


def mcss_walk(start: int, draws: Callable[[int], list[Draws]], tokens: list[int],
              target_probs: Callable[[int], torch.Tensor], generator: torch.Generator) -> WalkResult:
    """Multi-candidate speculative sampling (Yang et al. 2024), lossless for i.i.d. or sequential draws.

    At each node try the candidates in order: accept x with probability min(1, p(x)/q(x)), q being the
    distribution x was drawn from; after a rejection p <- norm(max(p - q, 0)) and, when the group was drawn without
    replacement, also q(x) <- 0, q <- norm(q). Candidates from several groups (sources) at one node are tried one
    group after the other: every test is against its own q and every rejection updates p, which keeps it exact.
    """
    result = WalkResult(path=[], final_context=start)
    node = start
    while True:
        groups = draws(node)
        p = target_probs(node)
        match = None
        for group in groups:
            q = group.q
            for kid in group.nodes:
                x = tokens[kid]
                qx, px = _read_at(q, p, x)
                if qx <= 0.0:  # padding: this candidate could not have been drawn
                    continue
                u = float(torch.rand((), generator=generator, device=generator.device))
                ok = passes(u, px, qx)  # probability min(1, px/qx), and never a token of residual p = 0
                result.tests.append(NodeTest(kid, ok, p=px, q=qx, u=u))
                if ok:
                    match = kid
                    break
                p = residual(p, q)
                if group.without_replacement:
                    q = q.clone()
                    q[x] = 0.0
                    mass = float(q.sum())
                    if mass <= 0:
                        break
                    q = q / mass
            if match is not None:
                break
        if match is None:
            result.final_context, result.final_had_children = node, any(group.nodes for group in groups)
            result.final_probs = p
            return result
        result.path.append(match)
        node = match
