"""Target-initialised roots (ti-mcsd, Lu et al. 2024): level 1 holds the target's own next tokens.

The verify of the last step already computed the target's distribution after the committed text, so its top w
tokens (T = 0) or w draws without replacement (T > 0) need no test: they become w roots, and the draft extends
each. The walk tests every root's chain and the longest accepted one is committed, root included. Choosing among
w of the target's tokens by what follows them is what makes the method lossy for w > 1 (method.md, section 4);
with w = 1 it is a draft chain that starts one token later.

Cache invariant between steps: the target holds every committed token (its distribution after them is kept
here), so a verify has no root row.
"""
from __future__ import annotations

import torch

from ..origins import TARGET_ROOT
from ..sampling import SamplingConfig, draw_children, logits_to_probs
from .base import CandidateSource, Proposal, StepOutcome, TargetReading, check_kind
from .draft_tree import DraftTree


def vector_bytes(vector: torch.Tensor | None) -> bytes | None:
    """A float32 vector as bytes (a snapshot holds no tensors)."""
    return None if vector is None else vector.detach().float().cpu().numpy().tobytes()


def vector_from(data: bytes | None, device: torch.device) -> torch.Tensor | None:
    return None if data is None else torch.frombuffer(bytearray(data), dtype=torch.float32).to(device)


class TargetRootedTree(CandidateSource):
    target_rooted = True
    kind = "target_roots"

    def __init__(self, draft: DraftTree, sampling: SamplingConfig) -> None:
        if draft.shape.depth < 2:
            raise ValueError("a target-initialized tree needs at least one draft level after its roots")
        self.draft, self.sampling = draft, sampling
        self.width = draft.shape.branching[0]
        self.lossless = self.width == 1
        self.reads_target_hidden = draft.reads_target_hidden
        self.reads_draft_model = draft.reads_draft_model
        self.root_logits: torch.Tensor | None = None  # the target's distribution after the committed text
        self.root_probs: torch.Tensor | None = None   # warped, after the last step's rejections (T > 0)
        self.generator: torch.Generator | None = None

    @property
    def max_tokens(self) -> int:
        return self.draft.max_tokens

    def _keep_root_distribution(self, logits: torch.Tensor, residual: torch.Tensor | None) -> None:
        self.root_logits = logits
        if not self.sampling.greedy:
            self.root_probs = residual if residual is not None else logits_to_probs(logits, self.sampling)

    def start(self, committed: list[int], reading: TargetReading | None, generator: torch.Generator) -> None:
        self.generator = generator
        self._keep_root_distribution(reading.logits[-1], None)  # the target read the whole prompt
        self.draft.start(committed, reading, generator)

    def extend(self, committed: list[int], kept: int, reading: TargetReading | None) -> None:
        self._keep_root_distribution(reading.logits[-1], None)  # the target read every new token
        self.draft.extend(committed, kept, reading)

    def snapshot(self) -> dict:
        """The root distribution as float32 bytes (2 x 4 bytes per vocabulary entry when sampling). The prefill
        of a resume gives the logits again only to float rounding, and the warped probabilities not at all: after
        rejections they are the walk's residual, which only this step's draws knew."""
        return {"kind": self.kind, "root_logits": vector_bytes(self.root_logits),
                "root_probs": vector_bytes(self.root_probs), "draft": self.draft.snapshot()}

    def restore(self, state: dict, committed: list[int]) -> None:
        check_kind(state, self.kind)
        device = self.root_logits.device
        self.root_logits = vector_from(state["root_logits"], device)
        self.root_probs = vector_from(state["root_probs"], device)
        self.draft.restore(state["draft"], committed)

    def propose(self, committed: list[int], room: int) -> Proposal:
        probs = None if self.sampling.greedy else self.root_probs[None]
        roots = draw_children(self.root_logits[None], probs, self.width, False, self.generator)
        proposal = self.draft.propose(committed, room, roots=roots)
        proposal.origins[:self.width] = [TARGET_ROOT.name] * self.width
        proposal.target_rooted = True
        proposal.root_logits, proposal.root_probs = self.root_logits, self.root_probs
        return proposal

    def update(self, outcome: StepOutcome, accepted: list[int]) -> None:
        self._keep_root_distribution(outcome.next_logits, outcome.next_probs)
        self.draft.update(outcome, accepted)
