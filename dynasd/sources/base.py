"""The contract between the speculative loop and whatever proposes its candidates.

In the spirit of transformers' candidate generators (`get_candidates`, `update_candidate_strategy`): every step a
source proposes a token tree rooted at the last committed token (`propose`), the target verifies it together with
every other source's in one forward, and the source is told what happened (`update`) so that it can keep its own
state in line with the committed text: a draft model's KV cache, an n-gram index, a table of the target's
predictions. The loop never needs to know which kind of source it is talking to.

A proposal says, besides its tokens and their topology, which distribution q each candidate was drawn from, since
the acceptance test is only exact against that q. Sampled candidates (a draft model's) come with the rows of q
they were drawn from (`DraftRows`); deterministic ones (prompt lookup, token recycling) have a one-hot q, which
the walk builds itself.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from ..sampling import probs_at
from ..trace import LevelScores, TreeGrowth
from ..tree import ROOT, ancestor_mask, children_of


@dataclass
class TargetReading:
    """What one target forward computed: the tokens it read, the first at `first_position`, and per token its
    logits row (float32) and, where a source asked for them, its final hidden state."""

    first_position: int
    tokens: list[int]
    logits: torch.Tensor
    hidden: torch.Tensor | None = None


class DraftRows:
    """The distributions a sampled proposal's candidates were drawn from: for each context (ROOT or a node), the
    row its children came from. Rows arrive in blocks, one per draft forward, and stay there: the trace gathers a
    whole block at once instead of taking a softmax per node."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[int, int]] = {}  # context -> (block index, row)
        self.logits_blocks: list[torch.Tensor] = []
        self.probs_blocks: list[torch.Tensor | None] = []  # warped q; None at temperature 0

    def add_block(self, contexts: list[int], logits: torch.Tensor, probs: torch.Tensor | None) -> None:
        block = len(self.logits_blocks)
        self.logits_blocks.append(logits)
        self.probs_blocks.append(probs)
        for row, context in enumerate(contexts):
            self.rows[context] = (block, row)

    def probs(self, context: int) -> torch.Tensor:
        block, row = self.rows[context]
        return self.probs_blocks[block][row]

    def q_of(self, tokens: list[int], parents: list[int], greedy: bool) -> dict[int, float]:
        """q of every node whose parent has a row: the warped q it was drawn from (plain softmax at T = 0)."""
        q: dict[int, float] = {}
        for block, logits in enumerate(self.logits_blocks):
            kids = [i for i, parent in enumerate(parents) if self.rows.get(parent, (None,))[0] == block]
            if kids:
                table = torch.softmax(logits, -1) if greedy else self.probs_blocks[block]
                rows = [self.rows[parents[i]][1] for i in kids]
                q.update(zip(kids, probs_at(table, rows, [tokens[i] for i in kids])))
        return q


@dataclass
class Proposal:
    """One source's candidates for one step: a token tree under the step's root, parents before children.

    `drawn_from` None means every candidate is deterministic given the text so far (q one-hot on it); otherwise
    the children of a context were drawn, in node order, from its row, without replacement when
    `without_replacement`. `mask`/`mask_rows` are the tree's ancestor mask when the source has it at hand (a slice
    of a mask built once); `max_nodes`/`max_depth` are the largest tree the source could have proposed.
    """

    tokens: list[int]
    parents: list[int]
    levels: list[int]
    origins: list[str]
    max_nodes: int
    max_depth: int
    drawn_from: DraftRows | None = None
    without_replacement: bool = True
    mask: torch.Tensor | None = None
    mask_rows: list[str] | None = None
    stop_scores: list[LevelScores] = field(default_factory=list)
    draft_forwards: int = 0
    # A target-rooted tree (ti-mcsd): level 1 holds the target's own picks from the distribution it computed at the
    # root in the last step (kept here, as warped probabilities and logits, since the verify has no root row).
    target_rooted: bool = False
    root_logits: torch.Tensor | None = None
    root_probs: torch.Tensor | None = None
    growth: TreeGrowth | None = None  # how a dynamic tree grew (dynamic_tree.py), in this proposal's node indices

    @property
    def depth(self) -> int:
        return max(self.levels, default=0)

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self) -> dict[int, list[int]]:
        """Children of ROOT and of every node, in node (= drawing) order."""
        return children_of(self.parents)

    def ancestor_mask(self, device: torch.device) -> tuple[torch.Tensor, list[str]]:
        if self.mask is None:
            mask = ancestor_mask(self.parents)
            self.mask = mask.to(device)
            self.mask_rows = ["".join("1" if v else "0" for v in row) for row in mask.tolist()]
        return self.mask, self.mask_rows


def levels_of(parents: list[int]) -> list[int]:
    levels: list[int] = []
    for parent in parents:
        levels.append(1 if parent == ROOT else levels[parent] + 1)
    return levels


@dataclass
class StepOutcome:
    """What one step decided, as every source is told it.

    `reading` is the verify: the committed tokens the target had not cached (root rows), then every tree node;
    `accepted_rows` are its rows that are now committed text. `next_logits`/`next_probs` are the target's
    distribution after the last accepted node (after this step's rejections, when sampling): the final token of a
    draft-rooted step was drawn from it, a target-rooted tree draws its next roots from it.
    """

    committed: list[int]
    reading: TargetReading
    root_rows: int
    accepted_rows: list[int]
    next_logits: torch.Tensor
    next_probs: torch.Tensor | None


class CandidateSource(ABC):
    """A source of candidate tokens for the speculative loop."""

    lossless = True             # False: the loop's output may differ from the target's (ti-mcsd with width > 1)
    target_rooted = False       # level 1 comes from the target itself: it must read the whole prompt at prefill
    reads_target_hidden = False  # needs the target's final hidden states with every reading
    reads_prompt_logits = False  # needs the target's logits at every prompt position, not just the last
    reads_draft_model = False    # runs the pair's draft model: a run's "draft:" label names it only then
    proposed_by = "no draft model runs"  # what proposes the candidates, said where no draft model runs
    kind = "source"             # names it in its snapshot, so that a state is never given to another kind

    @property
    @abstractmethod
    def max_tokens(self) -> int:
        """The most candidates on one path (what a step may add beyond the committed text, less one)."""

    def start(self, committed: list[int], reading: TargetReading | None, generator: torch.Generator) -> None:
        """A run begins: `reading` is the target's prefill over the prompt (None for a one-token prompt)."""

    def extend(self, committed: list[int], kept: int, reading: TargetReading | None) -> None:
        """A conversation goes on (Decoder.continue_with): of `committed`, the first `kept` tokens are the text this
        source has followed, the rest are new prompt tokens; `reading` is the target's forward over the committed
        tokens it had not cached (None when there were none). A source forgets what it holds past `kept` (tokens
        a step committed past the run's end) and reads the new tokens as `start` reads a prompt. A source whose
        state is only a function of what it is given each step needs nothing."""

    @abstractmethod
    def propose(self, committed: list[int], room: int) -> Proposal:
        """Candidates for the next step; `room` is how many new tokens the run may still commit."""

    def update(self, outcome: StepOutcome, accepted: list[int]) -> None:
        """The step is done: `accepted` are this source's own nodes on the committed path, top-down (empty when
        it proposed nothing or nothing of it was accepted)."""

    # A decoder's state as data (decoders/snapshot.py): between two steps, in another process.
    def snapshot(self) -> dict:
        """This source's state between two steps as plain data (no tensors): what `start` over the committed text
        cannot rebuild. A source whose state is only a function of the committed text (caches, an index of it)
        and of what the target reads keeps nothing here."""
        return {"kind": self.kind}

    def restore(self, state: dict, committed: list[int]) -> None:
        """Take back what `snapshot` gave, on a fresh source that has just `start`ed over `committed` (the
        decoder's prefill of the committed text, which rebuilt the caches)."""
        check_kind(state, self.kind)


def check_kind(state: dict, kind: str) -> None:
    if not isinstance(state, dict) or state.get("kind") != kind:
        found = state.get("kind") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"a source state of kind {found!r} given to a {kind!r} source")


class Fallback(CandidateSource):
    """The first source with candidates proposes alone this step.

    Why: prompt lookup before the draft model. A lookup costs microseconds and, when the text repeats itself, is
    usually right; the draft model's tree costs a forward per level, so a step with a match skips it."""

    kind = "fallback"

    def __init__(self, *sources: CandidateSource) -> None:
        self.sources = sources
        self.lossless = all(s.lossless for s in sources)
        self.target_rooted = any(s.target_rooted for s in sources)
        self.reads_target_hidden = any(s.reads_target_hidden for s in sources)
        self.reads_prompt_logits = any(s.reads_prompt_logits for s in sources)
        self.reads_draft_model = any(s.reads_draft_model for s in sources)
        self.chosen: CandidateSource | None = None

    @property
    def max_tokens(self) -> int:
        return max(s.max_tokens for s in self.sources)

    def start(self, committed: list[int], reading: TargetReading | None, generator: torch.Generator) -> None:
        for source in self.sources:
            source.start(committed, reading, generator)

    def extend(self, committed: list[int], kept: int, reading: TargetReading | None) -> None:
        for source in self.sources:
            source.extend(committed, kept, reading)

    def propose(self, committed: list[int], room: int) -> Proposal:
        for source in self.sources:
            proposal = source.propose(committed, room)
            if proposal.tokens or source is self.sources[-1]:
                self.chosen = source
                return proposal
        raise AssertionError("unreachable")

    def update(self, outcome: StepOutcome, accepted: list[int]) -> None:
        for source in self.sources:
            source.update(outcome, accepted if source is self.chosen else [])

    def snapshot(self) -> dict:
        # `chosen` lives from one propose to the next update, within a step: not state between steps.
        return {"kind": self.kind, "sources": [source.snapshot() for source in self.sources]}

    def restore(self, state: dict, committed: list[int]) -> None:
        check_kind(state, self.kind)
        if len(state["sources"]) != len(self.sources):
            raise ValueError(f"a fallback of {len(self.sources)} sources given {len(state['sources'])} states")
        for source, own in zip(self.sources, state["sources"]):
            source.restore(own, committed)
