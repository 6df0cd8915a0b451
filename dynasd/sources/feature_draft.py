"""The feature draft's tree: the draft-model tree, with the draft also reading the target's hidden states.

A feature draft (dynasd/loading/feature_model.py) takes with each token the target's final hidden state at the position
before it. Committed tokens get the target's own states: every verify returns them, and those of the tokens that
were committed are kept here (`TargetFeatures`) until the draft has read them. Tree nodes get their parent's state
from the draft itself, since the target has not read their parents yet; the roots of a target-rooted tree get the
target's state at the last committed token. The draft never keeps the tree nodes it read with its own states: the
next step's first forward reads the accepted ones again with the target's, which are better.
"""
from __future__ import annotations

import torch

from .base import StepOutcome, TargetReading
from .draft_tree import DraftTree


class FeatureDraftTree(DraftTree):
    reads_target_hidden = True
    kind = "feature_draft_tree"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.features: TargetFeatures | None = None

    def start(self, committed: list[int], reading: TargetReading | None, generator: torch.Generator) -> None:
        self.features = TargetFeatures(self.pair.target.config.hidden_size, self.pair.dtype, self.pair.device)
        if reading is not None:  # before the draft's prefill, which reads them
            self.features.append(reading.first_position, reading.hidden)
        super().start(committed, reading, generator)

    def extend(self, committed: list[int], kept: int, reading: TargetReading | None) -> None:
        # The buffer ends where the target's cache ended; the target's cache was cut back to `kept` at most, and
        # `reading` starts there.
        end = reading.first_position if reading is not None else min(kept, self.features.end)
        self.features.cut_at(end)
        if reading is not None:
            self.features.append(reading.first_position, reading.hidden)
        # The draft re-reads from the buffer's first row at the earliest (rows before it were dropped).
        self.cache.crop(min(kept, self.features.first + 1))
        self.fed_nodes = 0
        self._catch_up(committed)
        self.features.drop_before(self.cache.cached_len - 1)

    def restore(self, state: dict, committed: list[int]) -> None:
        """The buffer needs no state of its own: `start` refilled it with the target's states from the prefill of
        the committed text (the same values as the verifies gave, to float rounding) and the draft read them.
        What is left is trimmed as after a step: rows before the draft's cache end are never read again."""
        super().restore(state, committed)
        self.features.drop_before(self.cache.cached_len - 1)

    def _chain_features(self, first: int, count: int) -> torch.Tensor:
        return self.features.inputs_for(first, count)

    def _node_features(self, level: int, base_pos: int, pending: int, parent_hidden: torch.Tensor | None,
                       k: int, target_rooted: bool) -> torch.Tensor:
        # Children are parent-major, k per parent: each reads its parent's state.
        parents = self.features.inputs_for(base_pos, 1) if level == 1 and target_rooted else parent_hidden
        return torch.cat([self.features.inputs_for(self.cache.cached_len, pending),
                          parents.repeat_interleave(k, dim=0)])

    def update(self, outcome: StepOutcome, accepted: list[int]) -> None:
        reading = outcome.reading
        rows = torch.tensor(outcome.accepted_rows, dtype=torch.long, device=reading.hidden.device)
        self.features.append(reading.first_position, reading.hidden.index_select(0, rows))
        self.cache.keep_path([], len(outcome.committed))
        self.features.drop_before(self.cache.cached_len - 1)
        self.fed_nodes = 0


class TargetFeatures:
    """The target's final hidden states of the committed tokens a feature draft has not read yet.

    Positions are absolute; rows before the draft's cache end are dropped as it catches up, so the buffer stays a
    few rows long however long the text gets."""

    def __init__(self, hidden_size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.first = 0  # position of rows[0]
        self.rows = torch.zeros(0, hidden_size, dtype=dtype, device=device)

    @property
    def end(self) -> int:
        return self.first + self.rows.shape[0]

    def append(self, position: int, rows: torch.Tensor) -> None:
        if position != self.end:
            raise ValueError(f"target features must be appended in order: expected position {self.end}, "
                             f"got {position}")
        self.rows = torch.cat([self.rows, rows.to(self.rows.dtype)]) if self.rows.numel() else rows.clone()

    def inputs_for(self, first_token: int, count: int) -> torch.Tensor:
        """Features that go with the tokens at positions first_token .. first_token + count - 1: the target state
        one position earlier (a zero row for position 0, which has no predecessor)."""
        if count == 0:
            return self.rows[:0]
        start, zeros = first_token - 1, 0
        if start < 0:
            start, zeros = 0, 1
        if start < self.first or start + count - zeros > self.end:
            raise ValueError(f"no target features for positions {first_token - 1}..{first_token + count - 2} "
                             f"(have {self.first}..{self.end - 1})")
        rows = self.rows[start - self.first:start - self.first + count - zeros]
        return torch.cat([rows.new_zeros(zeros, rows.shape[1]), rows]) if zeros else rows

    def cut_at(self, position: int) -> None:
        """Forget the rows from `position` on (text that is no longer committed)."""
        self.rows = self.rows[:max(0, position - self.first)]

    def drop_before(self, position: int) -> None:
        """Forget the rows before `position` (the draft has read every token that needed them)."""
        cut = max(0, min(position - self.first, self.rows.shape[0]))
        if cut:
            self.rows = self.rows[cut:]
            self.first += cut
