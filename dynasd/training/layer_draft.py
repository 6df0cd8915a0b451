"""A draft's starting point: K of the target's own layers, in order, with its final norm, sharing its embedding and
head; or an exported draft (`export.export_draft`) rebuilt on the target.

Why: a draft made of the target's layers starts far closer to the target than a random one (keeping the last layer,
which feeds the head, starts far better than keeping the first K), and sharing the frozen embedding and head means
only the K layers (+ norm) are trained and stored. The token draft's train stage and the feature draft both start
here.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from .agreement import agreement
from .sequences import Sequence


def parse_layers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def draft_from_target(target, layers: list[int]):
    """A draft made of the target's `layers` (in that order) + its final norm; embedding and head are the
    target's own tensors (shared, never trained)."""
    n = target.config.num_hidden_layers
    if not layers or any(not 0 <= i < n for i in layers):
        raise ValueError(f"draft layers must be indices in 0..{n - 1}, got {layers}")
    config = target.config.__class__.from_dict(target.config.to_dict())
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in layers]
    config.dynasd_source_layers = list(layers)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    dtype = target.model.embed_tokens.weight.dtype
    draft = target.__class__(config).to(dtype)
    with torch.no_grad():
        for new, old in enumerate(layers):
            source = dict(target.model.layers[old].named_modules())
            for name, module in draft.model.layers[new].named_modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.copy_(plain_weight(source[name], module.in_features, dtype))
                    if module.bias is not None:
                        module.bias.copy_(source[name].bias)
                elif not list(module.children()) and hasattr(module, "weight"):  # norms
                    module.weight.copy_(source[name].weight)
        draft.model.norm.weight.copy_(target.model.norm.weight)
    draft.model.embed_tokens.weight = target.model.embed_tokens.weight
    if config.tie_word_embeddings:
        draft.lm_head.weight = draft.model.embed_tokens.weight
    else:
        draft.lm_head.weight = target.lm_head.weight
    for name, param in draft.named_parameters():
        param.requires_grad_(not name.startswith(("model.embed_tokens", "lm_head")))
    return draft


def plain_weight(module: torch.nn.Module, in_features: int, dtype: torch.dtype) -> torch.Tensor:
    """The (out, in) weight a linear layer applies, also when it is stored packed (a GGUF-quantized layer keeps
    uint8 blocks and may permute its input): read off by applying the layer to the identity."""
    if isinstance(module, torch.nn.Linear) and module.weight.is_floating_point():
        return module.weight.detach().to(dtype)
    eye = torch.eye(in_features, dtype=dtype)
    out = module(eye)
    if getattr(module, "bias", None) is not None:
        out = out - module.bias
    return out.T.contiguous()


def draft_from_export(target, folder: str | Path):
    """An exported draft (config.json with `dynasd_source_layers` + model.safetensors) on `target`: its layers
    rebuilt from the target, then its trained weights loaded (in fp32, whatever dtype they were stored in)."""
    config = json.loads((Path(folder) / "config.json").read_text())
    draft = draft_from_target(target, list(config["dynasd_source_layers"]))
    state = load_file(str(Path(folder) / "model.safetensors"))
    draft.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    return draft


def best_untrained_layers(target, candidates: list[list[int]], labelled: list[Sequence], context: list[Sequence],
                          pad_id: int) -> tuple[list[int], dict[tuple[int, ...], float]]:
    """The candidate layer list whose untrained draft agrees with the target most often on `context` (`labelled`:
    the target's argmax there), and every candidate's agreement. Layer indices the target does not have are
    dropped from a candidate; a candidate left empty is skipped."""
    scores = {}
    for candidate in candidates:
        layers = [i for i in candidate if i < target.config.num_hidden_layers]
        if layers:
            scores[tuple(layers)] = agreement(draft_from_target(target, layers), labelled, context, pad_id)
    return list(max(scores, key=scores.get)), scores
