"""Decision models (Lu et al. 2024): predict from the draft's state whether a drafted token will be accepted.

"hard": entropy of the draft softmax + its top-10 probabilities (11 features), MLP 11 -> 44 -> 1.
"soft": the draft's final hidden state (after the final norm), MLP d -> 512 -> 256 -> 1.
Both end in a sigmoid; drafting continues while some tip scores at least the threshold.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

HARD_TOPK = 10


def hard_features(draft_probs: torch.Tensor) -> torch.Tensor:
    """(n, V) draft probabilities -> (n, 11): entropy, then the 10 largest probabilities."""
    probs = draft_probs.float()
    entropy = -(probs * torch.log(probs.clamp_min(1e-12))).sum(-1, keepdim=True)
    top = torch.topk(probs, min(HARD_TOPK, probs.shape[-1]), dim=-1).values
    if top.shape[-1] < HARD_TOPK:
        top = torch.nn.functional.pad(top, (0, HARD_TOPK - top.shape[-1]))
    return torch.cat([entropy, top], dim=-1)


class DecisionModel(nn.Module):
    """An MLP with a sigmoid output; `kind` says which features it reads."""

    def __init__(self, kind: str, in_dim: int) -> None:
        super().__init__()
        if kind not in ("hard", "soft"):
            raise ValueError(f"unknown decision model kind '{kind}' (hard or soft)")
        self.kind, self.in_dim = kind, in_dim
        widths = [in_dim, 44] if kind == "hard" else [in_dim, 512, 256]
        layers: list[nn.Module] = []
        for a, b in zip(widths, widths[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], 1))
        self.net = nn.Sequential(*layers)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Logits (n,); apply a sigmoid for the predicted acceptance probability."""
        return self.net(features.float()).squeeze(-1)

    def features(self, draft_probs: torch.Tensor, draft_hidden: torch.Tensor | None) -> torch.Tensor:
        if self.kind == "hard":
            return hard_features(draft_probs)
        if draft_hidden is None:
            raise ValueError("the soft decision model needs the draft's hidden states")
        return draft_hidden.float()

    @torch.inference_mode()
    def score(self, draft_probs: torch.Tensor, draft_hidden: torch.Tensor | None) -> torch.Tensor:
        return torch.sigmoid(self(self.features(draft_probs, draft_hidden)))

    def save(self, folder: str | Path, extra: dict | None = None) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(folder / "model.safetensors"))
        meta = {"kind": self.kind, "in_dim": self.in_dim, **(extra or {})}
        (folder / "decision.json").write_text(json.dumps(meta, indent=2))

    @classmethod
    def load(cls, folder: str | Path) -> "DecisionModel":
        folder = Path(folder)
        if not (folder / "decision.json").is_file():
            raise FileNotFoundError(f"no decision model in {folder} (expected decision.json + model.safetensors)")
        meta = json.loads((folder / "decision.json").read_text())
        # Built on the meta device, then given the file's tensors: initial weights drawn from torch's global
        # generator would be thrown away, and drawing them would change what a seeded build in another thread
        # draws (dynasd/loading/models.py, SEEDED_BUILD_LOCK).
        with torch.device("meta"):
            model = cls(meta["kind"], int(meta["in_dim"]))
        model.load_state_dict(load_file(str(folder / "model.safetensors")), assign=True)
        return model.eval()
