"""A dynamic draft tree (method `dynamic`): each step's tree grows where the draft is confident.

Static trees (mcsd's 4,2,2,1) spend the same nodes every step, wherever the draft is sure or lost. EAGLE-2 (Li et
al. 2024) grows the tree by the draft's *cumulative* probability instead (the product of q along a node's path,
an estimate of the chance the target accepts the whole path) and verifies the best N nodes: one token gets many
siblings when the draft hesitates, and a long chain when it does not.

Here the growth runs in `depth` waves, one draft forward each, within a budget of `nodes` candidates:
  wave 1   the root's row is read; the ⌈nodes / depth⌉ most valuable next draws are made;
  wave w   the draft reads the nodes of wave w-1 (one forward), then again the ⌈nodes / depth⌉ most valuable next
           draws anywhere in the tree are made: deeper under a confident node, or one more sibling elsewhere.
A next draw at a context c is "the r-th child of c", valued c's cumulative probability times the r-th largest
probability of c's row (at most `expand` children per context). Nothing drawn is ever dropped: the draws the
budget did not reach are left out before they are made.

Why exact under MCSS (docs/method.md, section 12): at every context the children are sequential draws without
replacement from the row q they are tested against, and whether an r-th child is drawn is decided before it is
drawn, from values of what was drawn earlier and the row's sorted probabilities, never from the child itself.
That is all the walk's exactness argument needs (the number of siblings may be any such stopping rule). A
pruning step after drawing, as EAGLE-2 does at T = 0, would make the kept siblings depend on their own values and
bias the output at T > 0, so there is none. At T = 0 the r-th child is the row's r-th most probable token.

The draft's cache handling is DraftTree's (start, catch-up, keep the accepted path); only the tree differs.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import torch

from ..loading.models import ModelPair
from ..origins import DRAFT
from ..sampling import SamplingConfig, draw_candidates, logits_to_probs
from ..trace import LeftOut, TreeGrowth
from ..tree import ROOT, TreeShape, ancestor_mask
from .base import DraftRows, Proposal, levels_of
from .draft_tree import DraftTree

MAX_LEFT_OUT = 12  # the trace keeps this many of the best draws the budget did not reach


@dataclass
class Context:
    """A node (or the root) whose draft row has been read: its children may be drawn, best ranked first."""

    value: float                          # cumulative draft probability of the node itself (1 at the root)
    ranked_probs: list[float]             # the row's `expand` largest probabilities, in order
    ranked_tokens: list[int]
    row: torch.Tensor | None              # the warped q the children are drawn from (None at T = 0)
    drawn: list[int] = field(default_factory=list)  # child tokens drawn so far, in draw order

    def draw_value(self, rank: int) -> float:
        """The value of this context's child of rank `rank` (0-based): 0 past its ranked tokens, or where its row
        has no token left to draw."""
        return self.value * self.ranked_probs[rank] if rank < len(self.ranked_probs) else 0.0


class DynamicTree(DraftTree):
    kind = "dynamic_tree"

    def __init__(self, pair: ModelPair, model: torch.nn.Module, sampling: SamplingConfig, expand: int, depth: int,
                 nodes: int) -> None:
        # DraftTree's cache and catch-up, with a chain of `depth` as its largest shape (max_tokens, the mask slice
        # of a static tree is not used here)
        super().__init__(pair, model, TreeShape((1,) * depth), sampling)
        self.expand, self.depth, self.budget = expand, depth, nodes
        self.per_wave = math.ceil(nodes / depth)

    def _ranked(self, logits: torch.Tensor) -> tuple[torch.Tensor | None, list[list[float]], list[list[int]]]:
        """Each row's q (warped; None at T = 0) and its `expand` largest probabilities with their tokens. At
        T = 0 the ranking reads the plain softmax, as the trace's q does."""
        probs = logits_to_probs(logits, self.sampling) if not self.sampling.greedy else None
        table = probs if probs is not None else torch.softmax(logits, dim=-1)
        top = torch.topk(table, min(self.expand, table.shape[-1]), dim=-1)
        return probs, top.values.tolist(), top.indices.tolist()

    def _draw(self, context: Context, count: int) -> list[int]:
        """`count` more children of `context`, continuing its sequential draws without replacement."""
        if context.row is None:  # T = 0: the next-ranked tokens
            rank = len(context.drawn)
            return context.ranked_tokens[rank:rank + count]
        remaining = context.row.clone()
        if context.drawn:
            remaining[torch.tensor(context.drawn, device=remaining.device)] = 0.0
        return draw_candidates(remaining[None], count, False, self.generator)[0].tolist()

    def propose(self, committed: list[int], room: int, roots: list[int] | None = None) -> Proposal:
        forwards_before = self.cache.forwards
        self.fed_nodes = 0
        base_pos = len(committed)
        rows = DraftRows()
        logits, _ = self.cache.forward(committed[self.cache.cached_len:], [], None, [], keep_logits=1)
        probs, ranked_probs, ranked_tokens = self._ranked(logits)
        rows.add_block([ROOT], logits, probs)
        contexts = {ROOT: Context(1.0, ranked_probs[0], ranked_tokens[0], None if probs is None else probs[0])}
        tokens: list[int] = []
        parents: list[int] = []
        values: list[float] = []
        waves: list[int] = []
        for wave in range(1, self.depth + 1):
            if wave > 1:  # the draft reads the last wave's nodes: their rows make them contexts
                new = [i for i, w in enumerate(waves) if w == wave - 1]
                if not new:
                    break
                mask = ancestor_mask(parents[:new[-1] + 1])[new[0]:].to(self.pair.device)
                logits, _ = self.cache.forward([], [tokens[i] for i in new], mask,
                                               [base_pos + level - 1 for level in levels_of(parents)[new[0]:]],
                                               keep_logits=len(new))
                self.fed_nodes = new[-1] + 1
                probs, ranked_probs, ranked_tokens = self._ranked(logits)
                rows.add_block(new, logits, probs)
                for row, node in enumerate(new):
                    contexts[node] = Context(values[node], ranked_probs[row], ranked_tokens[row],
                                             None if probs is None else probs[row])
            picks = self._best_draws(contexts, min(self.per_wave, self.budget - len(tokens)))
            if not picks:
                break
            for parent, count in picks.items():
                context = contexts[parent]
                drawn = self._draw(context, count)
                rank = len(context.drawn)
                qs = (context.ranked_probs[rank:rank + count] if context.row is None else
                      context.row[torch.tensor(drawn, device=context.row.device)].tolist())
                context.drawn += drawn
                tokens += drawn
                parents += [parent] * count
                values += [context.value * q for q in qs]
                waves += [wave] * count
        live = len(tokens)
        left_out = self._left_out(contexts)
        growth = TreeGrowth(budget=self.budget, per_wave=self.per_wave, nodes=list(range(live)), values=values,
                            waves=waves, expanded=[node for node in contexts if node != ROOT], left_out=left_out)
        return Proposal(tokens=tokens, parents=parents, levels=levels_of(parents), origins=[DRAFT.name] * live,
                        max_nodes=self.budget, max_depth=self.depth, drawn_from=rows, without_replacement=True,
                        draft_forwards=self.cache.forwards - forwards_before, growth=growth)

    @staticmethod
    def _best_draws(contexts: dict[int, Context], count: int) -> dict[int, int]:
        """How many children to draw at each context this wave: the `count` most valuable next draws, taken one
        at a time (taking a context's r-th child makes its (r+1)-th the next candidate there). Decided before
        anything of this wave is drawn, from values known already. Ties go to the earlier context."""
        heap = [(-c.draw_value(len(c.drawn)), place, node, len(c.drawn))
                for place, (node, c) in enumerate(contexts.items()) if c.draw_value(len(c.drawn)) > 0]
        heapq.heapify(heap)
        picks: dict[int, int] = {}
        for _ in range(count):
            if not heap:
                break
            _, place, node, rank = heapq.heappop(heap)
            picks[node] = picks.get(node, 0) + 1
            value = contexts[node].draw_value(rank + 1)
            if value > 0:
                heapq.heappush(heap, (-value, place, node, rank + 1))
        return picks

    def _left_out(self, contexts: dict[int, Context]) -> list[LeftOut]:
        """The most valuable next draws the budget (or the depth) did not reach, for the figure. Only contexts
        have them: a node of the last wave was never read, so nothing under it was ranked."""
        candidates = []
        for node, context in contexts.items():
            for rank in range(len(context.drawn), len(context.ranked_probs)):
                value = context.draw_value(rank)
                if value > 0:
                    token = context.ranked_tokens[rank] if context.row is None else -1
                    candidates.append((value, node, token))
        candidates.sort(key=lambda c: -c[0])
        shown = candidates[:MAX_LEFT_OUT]
        strings = self.pair.token_strings([t for _, _, t in shown if t >= 0])
        left_out, text = [], iter(strings)
        for value, node, token in shown:
            left_out.append(LeftOut(parent=node, value=value, token_id=token,
                                    token=next(text) if token >= 0 else ""))
        return left_out
