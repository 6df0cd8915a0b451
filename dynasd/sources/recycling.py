"""Token Recycling (Luo et al. 2024, arXiv 2408.08696): candidates from the target's own earlier predictions.

Every forward gives the target's distribution after every token it reads, and decoding keeps at most one token of
each. A table keeps, per token id, the target's top k next tokens the last time it read that token; the next time
that token is the last committed one, the table guesses what follows. Every row of every verify counts, accepted
or not: a rejected node's row still says what the target expects after that token (in that context), and text
reuses its tokens in new contexts. The prompt's rows are recorded at prefill; the table lives for one run (the
paper also carries it over from one request to the next).

A step's candidates walk the table from the last committed token through a static template: the root's b1 best
followers, each one's b2 best, and so on (the paper's breadth-first retrieval). Given the table they are
deterministic, so q is one-hot on each and no draft forward is needed. Tokens the target never read have no row
yet; their subtrees are left out.

The table lives on the model's device and is updated there with no host sync; proposing reads the template's
tokens back in one transfer.
"""
from __future__ import annotations

import torch

from ..origins import RECYCLED
from ..tree import ROOT, TreeShape
from .base import CandidateSource, Proposal, StepOutcome, TargetReading, check_kind
from .draft_tree import mask_of

UNKNOWN = -1  # a table entry for a token the target has not read yet
TOP_K_BLOCK = 128


def top_k_rows(logits: torch.Tensor, k: int) -> torch.Tensor:
    """(rows, k) indices of the k largest entries of every row of (rows, V) logits, largest first.

    Why blocks on CPU: torch.topk over a 49,152-wide row takes ~0.3 ms, a max per block of 128 a tenth of that.
    The k largest entries lie in the k blocks with the largest maxima (each of them is at most its block's
    maximum, and fewer than k entries exceed the j-th largest), so a top-k over those k blocks finds them.
    """
    rows, width = logits.shape
    if logits.device.type != "cpu" or width % TOP_K_BLOCK or width < 8 * k * TOP_K_BLOCK:
        return torch.topk(logits, k, dim=-1).indices
    blocks = logits.view(rows, width // TOP_K_BLOCK, TOP_K_BLOCK)
    best_blocks = torch.topk(blocks.amax(dim=-1), k, dim=-1).indices
    inside = blocks.gather(1, best_blocks[:, :, None].expand(rows, k, TOP_K_BLOCK)).reshape(rows, k * TOP_K_BLOCK)
    best = torch.topk(inside, k, dim=-1).indices
    return best_blocks.gather(1, best // TOP_K_BLOCK) * TOP_K_BLOCK + best % TOP_K_BLOCK


class TokenRecycling(CandidateSource):
    reads_prompt_logits = True
    kind = "recycling"
    proposed_by = "candidates from the target's own earlier predictions"

    def __init__(self, template: TreeShape, vocab_size: int, device: torch.device) -> None:
        if template.target_roots:
            raise ValueError("token recycling proposes from the last committed token: no target roots")
        self.template, self.vocab_size, self.device = template, vocab_size, device
        self.width = max(template.branching)  # followers kept per token: the most any node of the template takes
        self.mask, self.mask_rows = mask_of(template, device)
        self.table: torch.Tensor | None = None

    @property
    def max_tokens(self) -> int:
        return self.template.depth

    def start(self, committed: list[int], reading: TargetReading | None, generator: torch.Generator) -> None:
        # One row per token id and a scratch row (`vocab_size`) that absorbs the duplicate writes of `record`.
        self.table = torch.full((self.vocab_size + 1, self.width), UNKNOWN, dtype=torch.long, device=self.device)
        if reading is not None:
            self.record(reading.tokens, reading.logits, list(range(len(reading.tokens))))

    def extend(self, committed: list[int], kept: int, reading: TargetReading | None) -> None:
        # Rows recorded from tokens since dropped stay: they are still the target's predictions in some context,
        # and a proposal is only ever a guess.
        if reading is not None:
            self.record(reading.tokens, reading.logits, list(range(len(reading.tokens))))

    def record(self, tokens: list[int], logits: torch.Tensor, committed_rows: list[int]) -> None:
        """table[the token a row read] = the target's top k after it, for every row of (rows, V) `logits`.

        A token read in several rows of one forward keeps one of them: the latest committed row (the text as it
        stands), else its latest row. The others are written to the scratch row, so the update is one copy on the
        device whatever the duplicates."""
        n = len(tokens)
        if logits.shape[0] != n:
            raise ValueError(f"token recycling needs a logits row per token read: {logits.shape[0]} for {n}")
        committed = set(committed_rows)
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        rank = torch.tensor([i + n * (i in committed) for i in range(n)], device=self.device)
        beaten = ((ids[:, None] == ids[None, :]) & (rank[None, :] > rank[:, None])).any(dim=1)
        rows = torch.where(beaten, torch.full_like(ids, self.vocab_size), ids)
        self.table.index_copy_(0, rows, top_k_rows(logits, self.width).to(self.device))

    def snapshot(self) -> dict:
        """The table's known rows, {token id: its followers} (the scratch row, `vocab_size`, included when
        written). The table records every row of every verify, rejected nodes' too, so the committed text
        cannot rebuild it; the rows the target has read are a few hundred of the vocabulary's, hence a dict."""
        known = (self.table[:, 0] != UNKNOWN).nonzero().flatten()
        rows = torch.cat([known[:, None], self.table[known]], dim=1).tolist()  # one host read
        return {"kind": self.kind, "rows": {row[0]: row[1:] for row in rows}}

    def restore(self, state: dict, committed: list[int]) -> None:
        check_kind(state, self.kind)
        rows = state["rows"]
        if any(not 0 <= token <= self.vocab_size or len(followers) != self.width
               for token, followers in rows.items()):
            raise ValueError(f"a recycling table of other shape than ({self.vocab_size + 1}, {self.width})")
        self.table.fill_(UNKNOWN)
        if rows:
            ids = torch.tensor(list(rows), dtype=torch.long, device=self.device)
            self.table[ids] = torch.tensor(list(rows.values()), dtype=torch.long, device=self.device)

    def propose(self, committed: list[int], room: int) -> Proposal:
        branching = self.template.branching
        frontier = self.table[committed[-1], :branching[0]]
        levels = [frontier]
        for k in branching[1:]:
            # an unknown token reads the scratch row; its children are dropped below
            frontier = self.table[torch.where(frontier < 0, self.vocab_size, frontier), :k].flatten()
            levels.append(frontier)
        found = torch.cat(levels).tolist()  # the one host transfer of a proposal
        kept: dict[int, int] = {}  # template node -> proposal node
        tokens, parents = [], []
        for node, parent in enumerate(self.template.parents):
            if found[node] != UNKNOWN and (parent == ROOT or parent in kept):
                kept[node] = len(tokens)
                tokens.append(found[node])
                parents.append(ROOT if parent == ROOT else kept[parent])
        levels_kept = [self.template.levels[node] for node in kept]
        whole = len(tokens) == self.template.num_nodes
        return Proposal(tokens=tokens, parents=parents, levels=levels_kept, origins=[RECYCLED.name] * len(tokens),
                        max_nodes=self.template.num_nodes, max_depth=self.template.depth,
                        mask=self.mask if whole else None, mask_rows=self.mask_rows if whole else None)

    def update(self, outcome: StepOutcome, accepted: list[int]) -> None:
        self.record(outcome.reading.tokens, outcome.reading.logits, outcome.accepted_rows)
