"""Named method configurations: the papers' settings and the fastest ones measured on a CPU, one click away.

Why: the explorer has a dozen method controls, and the configurations worth seeing first (MCSD's static tree, the
DynaSD paper's target-initialized fork with and without a decision model, plain speculative sampling, prompt lookup,
and the fastest lossless settings in docs/benchmarks.md) are combinations a newcomer would not find alone. A recipe
is a dict of decoder-option overrides (dynasd/options.py names, typed values) that shape the method; the model pair,
prompt and sampling settings (the options of group "sampling") stay as they are.
"""
from __future__ import annotations

from ..options import MCSD_TREE, Shape
from ..stopping import DEFAULT_THRESHOLD  # DynaSD's hard decision threshold

# The base of every recipe but the fastest: full depth, no stop policy, no prompt lookup; each overrides what it needs.
_STATIC = dict(dynamic_depth=False, stop="none", lookup=0, draft_kind="tokens")

RECIPES: dict[str, dict] = {
    # docs/benchmarks.md: the fastest lossless method with float32 weights (1.27x ar), not with the GGUF blocks
    "Narrow tree for a CPU: two draft chains, prompt lookup, decision-model stop (fastest with float32 weights)":
        dict(method="mcsd", k_config=(2, 1, 1, 1), dynamic_depth=True, stop="decision", threshold=DEFAULT_THRESHOLD,
             lookup=8, draft_kind="tokens"),
    f"MCSD (Yang et al. 2024): a static {Shape.text(MCSD_TREE)} tree from the draft":
        dict(_STATIC, method="mcsd", k_config=MCSD_TREE),
    "DynaSD (Lu et al. 2024): target-initialized fork, 4 chains of 4 (lossy)":
        dict(_STATIC, method="ti-mcsd", width=4, depth=4),
    "DynaSD with dynamic depth: the fork, a decision model ends the chains (lossy)":
        dict(_STATIC, method="ti-mcsd", width=4, depth=4, dynamic_depth=True, stop="decision",
             threshold=DEFAULT_THRESHOLD),
    "Speculative sampling: one draft chain of 4":
        dict(_STATIC, method="sd", gamma=4),
    # docs/benchmarks.md: the fastest lossless method with the GGUF blocks (1.02x ar)
    "Prompt lookup decoding: no draft model (fastest with the GGUF blocks)":
        dict(_STATIC, method="pld", lookup=8),
}


def recipe_values(name: str) -> dict:
    """The option values a recipe sets; raises ValueError with the known names for an unknown one."""
    try:
        return dict(RECIPES[name])
    except KeyError:
        raise ValueError(f"unknown recipe '{name}' (known: {'; '.join(RECIPES)})") from None
