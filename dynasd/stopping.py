"""Early-stop policies for dynamic draft depth.

After each draft level every live tip gets a score from the draft distribution it was drawn from; drafting goes
one level deeper while any score reaches the threshold. Scores use the draft's plain softmax (temperature 1), so
one threshold means the same thing at every sampling temperature.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .decision import DecisionModel

STOP_POLICIES = ("none", "confidence", "decision")


@dataclass
class StopPolicy:
    """`name`: none | confidence | decision. `decision_model` is needed for the last."""

    name: str = "none"
    threshold: float = 0.4
    decision_model: DecisionModel | None = None

    def __post_init__(self) -> None:
        if self.name not in STOP_POLICIES:
            raise ValueError(f"unknown stop policy '{self.name}' (use {', '.join(STOP_POLICIES)})")
        if not (0.0 <= self.threshold <= 1.0):
            raise ValueError(f"threshold must lie in [0, 1], got {self.threshold}")
        if self.name == "decision" and self.decision_model is None:
            raise ValueError("the decision stop policy needs a decision model")

    @property
    def needs_hidden(self) -> bool:
        return self.decision_model is not None and self.decision_model.kind == "soft"

    def scores(self, parent_probs: torch.Tensor, parent_hidden: torch.Tensor | None) -> list[float]:
        """One score per tip; `parent_probs` (n, V) is the softmax each tip was drawn from."""
        if self.name == "confidence":
            return parent_probs.max(dim=-1).values.tolist()
        if self.name == "decision":
            return self.decision_model.score(parent_probs, parent_hidden).tolist()
        return []

    def keep_drafting(self, scores: list[float]) -> bool:
        return self.name == "none" or max(scores, default=0.0) >= self.threshold


def make_stop_policy(name: str, threshold: float = 0.4, decision_path: str | Path | None = None) -> StopPolicy:
    model = None
    if name == "decision":
        from .models import ASSETS_DIR

        path = Path(decision_path) if decision_path else ASSETS_DIR / "decision-smollm2-hard"
        try:
            model = DecisionModel.load(path)
        except FileNotFoundError as exc:
            raise ValueError(str(exc)) from exc
    return StopPolicy(name=name, threshold=threshold, decision_model=model)
