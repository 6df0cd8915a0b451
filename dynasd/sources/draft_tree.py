"""The draft model's token tree: a static shape drawn level by level, one draft forward per level.

Nodes are numbered level-major (dynasd/tree.py), so a tree that stops early is the first levels of the largest
one and its mask a top-left slice of a mask built once. With dynamic depth a stop policy scores the tips of every
level and drafting goes one level deeper only while one of them reaches its threshold.

Cache invariant between steps: the draft holds every committed token but the last one, or fewer (a step whose
candidates came from elsewhere leaves it behind; the next draft forward catches up).
"""
from __future__ import annotations

import torch

from ..cache import CachedModel
from ..loading.models import ModelPair, head_token_ids
from ..origins import DRAFT
from ..sampling import SamplingConfig, draw_children, logits_to_probs
from ..stopping.policies import StopPolicy
from ..trace import LevelScores
from ..tree import ROOT, TreeShape, ancestor_mask
from .base import CandidateSource, DraftRows, Proposal, StepOutcome, TargetReading, check_kind


def mask_of(shape: TreeShape, device: torch.device) -> tuple[torch.Tensor, list[str]]:
    """The ancestor mask of a static shape on the device, and its rows as '0'/'1' strings for the trace."""
    mask = ancestor_mask(shape.parents)
    return mask.to(device), ["".join("1" if v else "0" for v in row) for row in mask.tolist()]


class DraftTree(CandidateSource):
    kind = "draft_tree"
    reads_draft_model = True

    def __init__(self, pair: ModelPair, model: torch.nn.Module, shape: TreeShape, sampling: SamplingConfig,
                 without_replacement: bool = True, dynamic_depth: bool = False,
                 stop: StopPolicy | None = None) -> None:
        self.pair, self.model, self.shape, self.sampling = pair, model, shape, sampling
        self.without_replacement = without_replacement
        self.dynamic_depth = dynamic_depth
        self.stop = stop or StopPolicy()
        self.max_mask, self.max_mask_rows = mask_of(shape, pair.device)
        # With a reduced output layer (models.SubsetHead) the stop policy reads the softmax over its tokens only.
        self.head_ids = head_token_ids(model)
        self.cache: CachedModel | None = None
        self.generator: torch.Generator | None = None
        self.fed_nodes = 0  # nodes of the last proposal the draft has read (their keys/values are cached)

    @property
    def max_tokens(self) -> int:
        return self.shape.depth

    def start(self, committed: list[int], reading: TargetReading | None, generator: torch.Generator) -> None:
        self.generator = generator
        # A feature draft reads its own hidden states too: tree nodes get their parent's as features.
        self.cache = CachedModel(self.model, need_hidden=self.stop.needs_hidden or self.reads_target_hidden)
        self.fed_nodes = 0
        self._catch_up(committed)

    def extend(self, committed: list[int], kept: int, reading: TargetReading | None) -> None:
        self.cache.crop(kept)
        self.fed_nodes = 0
        self._catch_up(committed)

    def snapshot(self) -> dict:
        # The draft's cache is rebuilt by `start` over the committed text (every token but the last, which is
        # what the cache holds after a step at most); the stop policy's chain is the rest.
        return {"kind": self.kind, "stop": self.stop.snapshot()}

    def restore(self, state: dict, committed: list[int]) -> None:
        check_kind(state, self.kind)
        self.stop.restore(state["stop"])

    def _catch_up(self, committed: list[int]) -> None:
        """Cache every committed token but the last (the next step's root), as `start` does for a prompt."""
        pending = committed[self.cache.cached_len:-1]
        if pending:
            self.cache.forward(pending, [], None, [], keep_logits=1,
                               features=self._chain_features(self.cache.cached_len, len(pending)))

    # What a draft that reads the target's hidden states adds (feature_draft.py); a token draft reads none.
    def _chain_features(self, first: int, count: int) -> torch.Tensor | None:
        return None

    def _node_features(self, level: int, base_pos: int, pending: int, parent_hidden: torch.Tensor | None,
                       k: int, target_rooted: bool) -> torch.Tensor | None:
        return None

    def _warp(self, logits: torch.Tensor) -> torch.Tensor | None:
        return None if self.sampling.greedy else logits_to_probs(logits, self.sampling)

    def _stop_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's plain softmax for the stop policy. With a reduced head, over its tokens only: the others
        have probability 0, and the policies read the largest probabilities and the entropy, so the scores are
        the same (to float rounding) at a third of the cost (~0.3-0.6 ms per draft call for 49,152 -> 16,384)."""
        if self.head_ids is not None:
            logits = logits.index_select(-1, self.head_ids)
        return torch.softmax(logits, dim=-1)

    def propose(self, committed: list[int], room: int, roots: list[int] | None = None) -> Proposal:
        """The draft's tree; with `roots` (a target-rooted tree) level 1 is given and drafting starts below it."""
        shape = self.shape
        rows = DraftRows()
        tokens: list[int] = []
        stop_scores: list[LevelScores] = []
        forwards_before = self.cache.forwards
        self.fed_nodes = depth = 0
        self.stop.start_tree()
        base_pos = len(committed)  # position of every level-1 node
        pending = committed[self.cache.cached_len:]
        replacement = not self.without_replacement
        parent_logits = parent_hidden = None
        if roots is None:
            parent_logits, parent_hidden = self.cache.forward(
                pending, [], None, [], keep_logits=1,
                features=self._chain_features(self.cache.cached_len, len(pending)))
            rows.add_block([ROOT], parent_logits, self._warp(parent_logits))
            pending = []
        for level in range(1, shape.depth + 1):
            k = shape.branching[level - 1]
            if level == 1 and roots is not None:
                tokens += roots
            else:
                tokens += draw_children(parent_logits, rows.probs_blocks[-1], k, replacement, self.generator)
            depth = level
            if level == shape.depth:
                break
            if self.dynamic_depth and parent_logits is not None:
                parent_scores = self.stop.scores(self._stop_probs(parent_logits), parent_hidden)
                tip_scores = [s for s in parent_scores for _ in range(k)]
                keep = self.stop.keep_drafting(tip_scores)
                stop_scores.append(LevelScores(level, tip_scores, keep))
                if not keep:
                    break
            nodes = shape.nodes_at(level)
            features = self._node_features(level, base_pos, len(pending), parent_hidden, k, roots is not None)
            parent_logits, parent_hidden = self.cache.forward(
                pending, tokens[nodes.start:nodes.stop], self.max_mask[nodes.start:nodes.stop, :nodes.stop],
                [base_pos + level - 1] * len(nodes), keep_logits=len(nodes), features=features)
            pending = []
            self.fed_nodes = nodes.stop
            rows.add_block(list(nodes), parent_logits, self._warp(parent_logits))
        live = shape.level_starts[depth]
        return Proposal(tokens=tokens, parents=list(shape.parents[:live]), levels=list(shape.levels[:live]),
                        origins=[DRAFT.name] * live, max_nodes=shape.num_nodes, max_depth=shape.depth,
                        drawn_from=rows, without_replacement=self.without_replacement,
                        mask=self.max_mask[:live, :live], mask_rows=[r[:live] for r in self.max_mask_rows[:live]],
                        stop_scores=stop_scores, draft_forwards=self.cache.forwards - forwards_before)

    def update(self, outcome: StepOutcome, accepted: list[int]) -> None:
        """Keep the accepted nodes the draft has read as committed text, drop the rest."""
        self.cache.keep_path([i for i in accepted if i < self.fed_nodes], len(outcome.committed))
        self.fed_nodes = 0
