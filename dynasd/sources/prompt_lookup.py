"""Prompt lookup (Saxena 2023): the continuation of the last n-gram's most recent earlier occurrence, as a chain.

The proposal is a deterministic function of the text, so its q is one-hot: accepting a looked-up token with
probability p(x) and otherwise going on with p minus x keeps speculative sampling exact (method.md, section 2).
The n-gram index itself is dynasd/lookup.py.
"""
from __future__ import annotations

import torch

from ..lookup import NgramIndex
from ..origins import LOOKUP
from ..tree import ROOT, TreeShape
from .base import CandidateSource, Proposal, TargetReading, check_kind
from .draft_tree import mask_of


class PromptLookup(CandidateSource):
    kind = "prompt_lookup"
    proposed_by = "candidates copied from the prompt by lookup"

    def __init__(self, length: int, min_ngram: int, device: torch.device) -> None:
        if length < 1:
            raise ValueError(f"prompt lookup length must be positive, got {length}")
        self.length, self.min_ngram = length, min_ngram
        self.mask, self.mask_rows = mask_of(TreeShape((1,) * length), device)
        self.index: NgramIndex | None = None

    @property
    def max_tokens(self) -> int:
        return self.length

    def start(self, committed: list[int], reading: TargetReading | None, generator: torch.Generator) -> None:
        self.index = NgramIndex(min_ngram=self.min_ngram, max_ngram=max(self.min_ngram, 3))

    def extend(self, committed: list[int], kept: int, reading: TargetReading | None) -> None:
        # The index only grows with the text: if it has read past `kept` (text since dropped), it starts over.
        if self.index.indexed > kept:
            self.start(committed, reading, None)

    def snapshot(self) -> dict:
        # The index is a function of the committed tokens it has read, the first `indexed` of them: that count
        # is its whole state (NgramIndex.of rebuilds it entry for entry).
        return {"kind": self.kind, "indexed": self.index.indexed}

    def restore(self, state: dict, committed: list[int]) -> None:
        check_kind(state, self.kind)
        self.index = NgramIndex.of(committed[:state["indexed"]], self.min_ngram, self.index.max_ngram)

    def propose(self, committed: list[int], room: int) -> Proposal:
        # looked-up tokens past max new tokens would be cut
        tokens = self.index.propose(committed, min(self.length, room))
        n = len(tokens)
        return Proposal(tokens=tokens, parents=[ROOT] + list(range(n - 1)) if n else [],
                        levels=list(range(1, n + 1)), origins=[LOOKUP.name] * n, max_nodes=self.length,
                        max_depth=self.length, mask=self.mask[:n, :n], mask_rows=[r[:n] for r in self.mask_rows[:n]])
