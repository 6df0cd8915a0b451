"""What a trained draft leaves on disk: config.json + model.safetensors without the shared embedding and head,
loaded by `models.load_distilled_draft`, plus its metrics and head tokens.

Why a module of its own: the token draft's and the feature draft's train stages keep their best checkpoint in this
form and copy it to an assets folder the same way; the engine reads exactly these files.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file


def trainable_state(draft) -> dict[str, torch.Tensor]:
    """What a distilled draft stores: everything except the (shared) embedding and head."""
    return {k: v for k, v in draft.state_dict().items()
            if not k.startswith(("model.embed_tokens", "lm_head")) and "rotary" not in k}


def export_draft(draft, folder: str | Path, card: str | None = None, dtype=torch.float16) -> int:
    """Write config.json + model.safetensors (no embeddings, `dtype`); returns the weight file's size in bytes."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in trainable_state(draft).items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    draft.config.to_json_file(str(folder / "config.json"))
    if card is not None:
        (folder / "MODEL_CARD.md").write_text(card)
    return (folder / "model.safetensors").stat().st_size


def keep_if_best(draft, folder: Path, score: float, best: float, metrics: dict, vocab: list[int]) -> float:
    """Export `draft` to `folder` with its `metrics` and head tokens (`vocab`, the training softmax's tokens, which
    the engine's head keeps too) when `score` beats `best`; returns the new best."""
    if not score > best:  # (a NaN score never counts as better)
        return best
    export_draft(draft, folder)
    (folder / "metrics.json").write_text(json.dumps(metrics))
    (folder / "head_tokens.json").write_text(json.dumps({"token_ids": vocab}))
    return score


def export_best(out: Path, export: str | Path) -> None:
    """Copy the best checkpoint's files (`out/best`) to `export`, e.g. an assets folder."""
    if not (out / "best" / "model.safetensors").is_file():
        raise FileNotFoundError(f"no trained draft in {out / 'best'} (run the train stage first)")
    Path(export).mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors", "metrics.json", "head_tokens.json"):
        if (out / "best" / name).is_file():
            shutil.copy(out / "best" / name, Path(export) / name)
    print(f"exported {out / 'best'} to {export}")
