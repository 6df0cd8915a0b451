"""Token-tree topology: parents, levels, level-major order, ancestor masks and their slices.

Nodes are numbered level-major (all of level 1, then level 2, ...) and parent-major within a level, so the first
`s` levels of a tree are always the node prefix `[0, level_end[s])`. That single fact is what lets one mask built
for the largest tree serve every shallower tree as a top-left slice (the paper's "sliced" mask).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

ROOT = -1  # parent index of level-1 nodes: the step's root position (the last committed token)


@dataclass(frozen=True)
class TreeShape:
    """Static tree shape: `branching[l]` children per node of level l (level 0 = the root position).

    `target_roots=True` means level 1 holds the target's own top-w (or sampled) tokens instead of draft samples:
    the paper's target-initialized tree. A chain is `(1,)*gamma`; the paper's fork is `(w, 1, ..., 1)`.
    """

    branching: tuple[int, ...]
    target_roots: bool = False

    def __post_init__(self) -> None:
        if not self.branching:
            raise ValueError("a tree needs at least one level")
        if any((not isinstance(k, int)) or k < 1 for k in self.branching):
            raise ValueError(f"every branching factor must be a positive integer, got {self.branching}")

    @property
    def depth(self) -> int:
        return len(self.branching)

    @cached_property
    def level_sizes(self) -> tuple[int, ...]:
        sizes, n = [], 1
        for k in self.branching:
            n *= k
            sizes.append(n)
        return tuple(sizes)

    @property
    def num_nodes(self) -> int:
        return sum(self.level_sizes)

    @cached_property
    def level_starts(self) -> tuple[int, ...]:
        """level_starts[l-1] = index of the first node of level l; level_starts[depth] = num_nodes."""
        starts, total = [0], 0
        for size in self.level_sizes:
            total += size
            starts.append(total)
        return tuple(starts)

    @cached_property
    def parents(self) -> tuple[int, ...]:
        parents: list[int] = [ROOT] * self.level_sizes[0]
        for level in range(1, self.depth):
            prev_start = self.level_starts[level - 1]
            k = self.branching[level]
            parents += [prev_start + i // k for i in range(self.level_sizes[level])]
        return tuple(parents)

    @cached_property
    def levels(self) -> tuple[int, ...]:
        return tuple(level + 1 for level in range(self.depth) for _ in range(self.level_sizes[level]))

    @cached_property
    def children(self) -> dict[int, list[int]]:
        """Children of every node and of ROOT, in drafting order."""
        return children_of(self.parents)

    def nodes_at(self, level: int) -> range:
        return range(self.level_starts[level - 1], self.level_starts[level])


def parse_branching(text: str) -> tuple[int, ...]:
    """'2,2,1' -> (2, 2, 1); raises ValueError with a readable message."""
    if not str(text).strip():
        raise ValueError("empty tree shape")
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError as exc:
        raise ValueError(f"tree shape must be comma-separated integers, got '{text}'") from exc
    if any(v < 1 for v in values):
        raise ValueError(f"every branching factor must be at least 1, got '{text}'")
    return values


def ancestor_mask(parents: tuple[int, ...] | list[int]) -> torch.Tensor:
    """Bool (N, N): row i is True at i and at every ancestor of i. Parents precede children (level-major)."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent != ROOT:
            mask[i] = mask[parent]
        mask[i, i] = True
    return mask


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where attention is allowed, -inf elsewhere (a bool mask is silently wrong with eager attention)."""
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill_(~mask, float("-inf"))


def path_to(node: int, parents: tuple[int, ...] | list[int]) -> list[int]:
    """Node indices from level 1 down to `node`."""
    path = []
    while node != ROOT:
        path.append(node)
        node = parents[node]
    return path[::-1]


def children_of(parents) -> dict[int, list[int]]:
    """Children of ROOT and of every node of a tree given by its parent list, in node order."""
    kids: dict[int, list[int]] = {ROOT: []}
    for node, parent in enumerate(parents):
        kids.setdefault(node, [])
        kids[parent].append(node)
    return kids
