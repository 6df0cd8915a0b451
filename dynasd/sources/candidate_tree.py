"""The one tree a step verifies: every source's proposal under the step's root, with duplicates merged.

A token proposed under the same parent by two proposals (or twice by one, when a draft samples with replacement)
becomes one node: the target reads it once, and once it is accepted its children are those of every proposal
that had it. The tests stay per proposal: at a context the walk tries, in source order, each proposal's candidates
against the q that proposal drew them from, and after every rejection replaces p by the residual
norm(max(p - q, 0)) of that q. That is sequential multi-draft speculative sampling (MCSS) generalised to several
sources, and it is exact for any sequence of candidates each tested against its own distribution given everything
drawn before it: the same argument as for one draft's siblings (method.md, section 3). So a merged node may be
tested twice: after a deterministic source's candidate x was rejected, p(x) is 0 and a second test of x fails,
but its residual update still counts, with the second proposal's q, or the output would be biased.
"""
from __future__ import annotations

import torch

from ..sampling import Draws
from ..tree import ROOT
from .base import Proposal


class CandidateTree:
    def __init__(self, proposals: list[Proposal], vocab_size: int, device: torch.device) -> None:
        self.proposals = proposals
        self.vocab_size, self.device = vocab_size, device
        live = [i for i, p in enumerate(proposals) if p.tokens]
        self.max_nodes = sum(p.max_nodes for p in proposals)
        self.max_depth = max((p.max_depth for p in proposals), default=0)
        self.stop_scores = [s for p in proposals for s in p.stop_scores]
        self.draft_forwards = sum(p.draft_forwards for p in proposals)
        self._children = [p.children() for p in proposals]
        if len(live) <= 1:  # one proposal (or none): its tree as it is, mask included
            only = proposals[live[0]] if live else proposals[0]
            self.tokens, self.parents = list(only.tokens), list(only.parents)
            self.levels, self.origins = list(only.levels), list(only.origins)
            self.local = [list(range(len(p))) if p is only else [] for p in proposals]
            self.members = [[(live[0], i)] for i in range(len(self.tokens))] if live else []
            self.mask, self.mask_rows = only.ancestor_mask(device)
        else:
            self._merge(live)
        target_rooted = [p for p in proposals if p.target_rooted and p.tokens]
        self.target_rooted = bool(target_rooted)
        self.root_logits = target_rooted[0].root_logits if target_rooted else None
        self.root_probs = target_rooted[0].root_probs if target_rooted else None

    def _merge(self, live: list[int]) -> None:
        self.tokens, self.parents, self.levels, self.origins = [], [], [], []
        self.members: list[list[tuple[int, int]]] = []
        self.local = [[] for _ in self.proposals]
        index: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
        for source in live:
            proposal = self.proposals[source]
            local = self.local[source]
            for node, (token, parent) in enumerate(zip(proposal.tokens, proposal.parents)):
                merged_parent = ROOT if parent == ROOT else local[parent]
                merged = index.get((merged_parent, token))
                if merged is None:
                    merged = index[(merged_parent, token)] = len(self.tokens)
                    self.tokens.append(token)
                    self.parents.append(merged_parent)
                    self.levels.append(proposal.levels[node])
                    self.origins.append(proposal.origins[node])  # the first proposal to name it
                    self.members.append([])
                self.members[merged].append((source, node))
                local.append(merged)
        carrier = Proposal(self.tokens, self.parents, self.levels, self.origins, 0, 0)
        self.mask, self.mask_rows = carrier.ancestor_mask(self.device)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        return max(self.levels, default=0)

    def roots(self) -> list[int]:
        return [i for i, level in enumerate(self.levels) if level == 1]

    def _contexts(self, node: int) -> list[tuple[int, int]]:
        """(proposal, its own node) pairs that `node` stands for; ROOT stands for every proposal's root."""
        if node == ROOT:
            return [(i, ROOT) for i, p in enumerate(self.proposals) if p.tokens]
        return self.members[node]

    def children(self, node: int) -> list[int]:
        """The children of a node in test order, each once (what a greedy walk compares with the argmax)."""
        kids: list[int] = []
        for source, own in self._contexts(node):
            local = self.local[source]
            kids += [local[kid] for kid in self._children[source][own] if local[kid] not in kids]
        return kids

    def draws(self, node: int) -> list[Draws]:
        """The candidates at a node, grouped by the distribution each was drawn from, in test order."""
        groups: list[Draws] = []
        for source, own in self._contexts(node):
            proposal, local = self.proposals[source], self.local[source]
            kids = [local[kid] for kid in self._children[source][own]]
            if not kids:
                continue
            if proposal.drawn_from is not None:
                groups.append(Draws(kids, proposal.drawn_from.probs(own), proposal.without_replacement))
            else:
                groups += [Draws([kid], self._one_hot(self.tokens[kid]), False) for kid in kids]
        return groups

    def _one_hot(self, token: int) -> torch.Tensor:
        q = torch.zeros(self.vocab_size, device=self.device)
        q[token] = 1.0
        return q

    def q_of(self, greedy: bool) -> dict[int, float]:
        """Every node's q (as drawn by the first proposal that named it); None-free: target roots have none."""
        q: dict[int, float] = {}
        for source, proposal in enumerate(self.proposals):
            local = self.local[source]
            if not local:
                continue
            if proposal.drawn_from is None:
                own = {i: 1.0 for i in range(len(proposal))}
            else:
                own = proposal.drawn_from.q_of(proposal.tokens, proposal.parents, greedy)
            for node, value in own.items():
                if self.members[local[node]][0] == (source, node):
                    q[local[node]] = value
        return q

    def accepted_of(self, source: int, path: list[int]) -> list[int]:
        """A proposal's own nodes on the committed path, top-down: its deepest node there and that node's
        ancestors (a proposal's nodes have its own nodes as parents, so they are a prefix of the path)."""
        for depth in range(len(path), 0, -1):
            own = [node for s, node in self.members[path[depth - 1]] if s == source]
            if own:
                chain, node = [], own[0]
                while node != ROOT:
                    chain.append(node)
                    node = self.proposals[source].parents[node]
                return chain[::-1]
        return []
