"""Early-stop policies for dynamic draft depth.

After each draft level every live tip gets a score from the draft distribution it was drawn from; drafting goes
one level deeper while any score reaches the threshold. Scores use the draft's plain softmax (temperature 1), so
one threshold means the same thing at every sampling temperature.

"cumulative" scores a tip by the predicted probability that its whole chain is accepted: the product of the
per-level acceptance predictions (a decision model's, or the draft's top probability without one) from level 1 to
the tip. Drafting deeper pays only while some chain is still likely to survive verification; a per-token score
keeps drafting behind a chain that is already likely to have failed. The product needs to know where a tree
starts: the decoder calls `start_tree()` before each draft (a no-op for the stateless policies); without that call
the policy also restarts after every stop.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..loading.models import ASSETS_DIR
from .decision_models import DecisionModel

STOP_POLICIES = ("none", "confidence", "decision", "cumulative")


# The threshold of DynaSD's hard decision model (Lu et al. 2024), and the options table's default (options.py).
DEFAULT_THRESHOLD = 0.4


@dataclass
class StopPolicy:
    """`name`: none | confidence | decision | cumulative. `decision` needs a `decision_model`; `cumulative` uses
    one when given, else the draft's top probability."""

    name: str = "none"
    threshold: float = DEFAULT_THRESHOLD
    decision_model: DecisionModel | None = None
    # cumulative: chain acceptance of each row of the previous call (the parents of this call's rows)
    _chain: list[float] | None = field(default=None, init=False, repr=False, compare=False)

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

    def start_tree(self) -> None:
        """A new draft tree begins: forget the chain products of the last one."""
        self._chain = None

    def scores(self, parent_probs: torch.Tensor, parent_hidden: torch.Tensor | None) -> list[float]:
        """One score per parent row; `parent_probs` (n, V) is the softmax the row's children are drawn from.
        Rows come parent-major, each row a node of the previous level (the first call: the root)."""
        if self.name == "confidence":
            return parent_probs.max(dim=-1).values.tolist()
        if self.name == "decision":
            return self.decision_model.score(parent_probs, parent_hidden).tolist()
        if self.name == "cumulative":
            if self.decision_model is not None:
                step = self.decision_model.score(parent_probs, parent_hidden).tolist()
            else:
                step = parent_probs.max(dim=-1).values.tolist()
            n, prev = len(step), self._chain
            if prev is None or n % len(prev):
                path = [1.0] * n
            else:  # row i of this call is child i // k of the previous call's rows (parent-major, k per parent)
                k = n // len(prev)
                path = [prev[i // k] for i in range(n)]
            self._chain = [a * b for a, b in zip(path, step)]
            return list(self._chain)
        return []

    def keep_drafting(self, scores: list[float]) -> bool:
        keep = self.name == "none" or max(scores, default=0.0) >= self.threshold
        if not keep:
            self._chain = None
        return keep

    def snapshot(self) -> dict:
        """The policy's state as data (decoders/snapshot.py): the chain products of the last tree. Every tree
        starts them again (`start_tree`), so between steps they matter to nothing yet; kept so that a resumed
        policy is this one exactly."""
        return {"chain": None if self._chain is None else list(self._chain)}

    def restore(self, state: dict) -> None:
        chain = state.get("chain")
        self._chain = None if chain is None else [float(v) for v in chain]


READS_DECISION_MODEL = ("decision", "cumulative")
SHIPPED_DECISION_PREFIX = "decision-"
DEFAULT_DECISION_MODEL = "decision-smollm2-hard"


def shipped_decision_models() -> list[str]:
    """Names of the decision models shipped in assets (a name is a folder there)."""
    return sorted(p.name for p in ASSETS_DIR.glob(SHIPPED_DECISION_PREFIX + "*") if (p / "decision.json").is_file())


def decision_model_folder(reference: str | Path | None) -> Path:
    """A shipped model's name is its folder in assets; anything else is a folder path. None: the default."""
    if reference is None:
        return ASSETS_DIR / DEFAULT_DECISION_MODEL
    if str(reference) in shipped_decision_models():
        return ASSETS_DIR / str(reference)
    return Path(reference)


def load_decision_model(name: str, reference: str | Path | None = None) -> DecisionModel | None:
    """The decision model stop policy `name` reads: decision needs one (the shipped default unless `reference`
    names another); cumulative uses the named one, else the shipped default where it exists; the others none.
    Loading builds a module, which draws from torch's global RNG (callers sharing a process may need a lock)."""
    if name not in READS_DECISION_MODEL:
        return None
    folder = decision_model_folder(reference)
    if name == "cumulative" and reference is None and not (folder / "decision.json").is_file():
        return None
    try:
        return DecisionModel.load(folder)
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from exc


def make_stop_policy(name: str, threshold: float = DEFAULT_THRESHOLD, decision_path: str | Path | None = None,
                     decision_model: DecisionModel | None = None,
                     device: torch.device | str | None = None) -> StopPolicy:
    """A stop policy; `decision_model`, when given, is used instead of loading the one `decision_path` names.
    `device`: where the draft's probabilities will be (the pair's device); the decision model is moved there, so it
    scores them where they are (a model loaded on the host cannot read a GPU's tensors)."""
    if decision_model is None or name not in READS_DECISION_MODEL:
        decision_model = load_decision_model(name, decision_path)
    if decision_model is not None and device is not None:
        decision_model.to(device)
    return StopPolicy(name=name, threshold=threshold, decision_model=decision_model)
