"""Acceleration applied to a loaded pair from outside: the decoders never know which kernels run.

`accelerate(pair)` gives every model of the pair (target, draft, feature draft)
  - packed grouped-query attention for tree verifies (gqa_attention.py),
  - KV caches that grow in place (inplace_cache.py) and the lean forward (lean_forward.py), attached as the
    model's runtime (dynasd/cache.py), which every CachedModel of it then uses,
  - on CPU only, linear layers with few-row weight layouts and, where it pays, the compiled kernel
    (fast_linear.py), the drafts' panels in half precision.
Which of these a model gets is decided in one place, `plan_for`, from its device.

What changes: the target's logits equal stock transformers' within float rounding (packed attention and the
linear layouts block their sums differently; ~1e-5 on the tiny pair, tests/test_kernels.py), the lean forward
and the in-place cache change nothing bitwise; the drafts' half-precision panels round their weights to float16,
which may change their proposals, never the output.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cache import Runtime, attach_runtime, stock_cache, stock_forward
from .fast_linear import pretranspose_linears
from .gqa_attention import use_packed_gqa
from .inplace_cache import in_place_cache
from .lean_forward import lean_forward, supports

_PLAN_ATTRIBUTE = "dynasd_kernel_plan"


@dataclass(frozen=True)
class KernelPlan:
    """What one model gets. Every field but the CPU ones suits any device."""

    packed_gqa: bool = True
    in_place_cache: bool = True
    lean_forward: bool = True
    linear_layouts: bool = False  # few-row weight layouts (CPU: MKL's products, see fast_linear.py)
    compiled_kernel: bool = False  # the compiled few-row kernel, where it pays (fast_linear.kernel_pays_here)
    half_panels: bool = False  # the kernel reads float16 panels (drafts only: they propose, never decide)


def plan_for(device: torch.device, compiled_kernel: bool = True, decides_output: bool = True) -> KernelPlan:
    """The plan for a model on `device`: the CPU layouts and kernel on CPU only, stock PyTorch ops elsewhere.

    `decides_output` is True for the target, whose panels stay float32; a draft's are float16."""
    on_cpu = torch.device(device).type == "cpu"
    return KernelPlan(linear_layouts=on_cpu, compiled_kernel=on_cpu and compiled_kernel,
                      half_panels=on_cpu and not decides_output)


def accelerate_model(model: torch.nn.Module, plan: KernelPlan) -> torch.nn.Module:
    """Apply `plan` to `model` in place. Again with the same plan it does nothing; with another it refuses, since
    swapped layers cannot be swapped back."""
    applied = getattr(model, _PLAN_ATTRIBUTE, None)
    if applied is not None:
        if applied == plan:
            return model
        raise ValueError(f"this model is already accelerated ({applied}); load it again for {plan}")
    if plan.packed_gqa:
        use_packed_gqa(model)
    if plan.linear_layouts:
        pretranspose_linears(model, compiled=plan.compiled_kernel, half_panels=plan.half_panels)
    # Decided after the attention switch: the lean forward knows "sdpa", "eager" and the packed attention.
    forward = lean_forward if plan.lean_forward and supports(model) else stock_forward
    attach_runtime(model, Runtime(forward=forward, new_cache=in_place_cache if plan.in_place_cache else stock_cache))
    setattr(model, _PLAN_ATTRIBUTE, plan)
    return model


def accelerate(pair, compiled_kernel: bool = True):
    """Accelerate every model of `pair` (a dynasd.models.ModelPair, which calls this from load_pair: hence no import
    of it here) in place and return the pair; `compiled_kernel=False` leaves the compiled
    kernel out (the benchmark's `kernels=torch`). Training code, which needs plain nn.Linear modules, must not
    accelerate its pair."""
    drafts = [model for model in (pair.draft, pair.feature_draft) if model is not None]
    for model in [pair.target] + drafts:
        accelerate_model(model, plan_for(pair.device, compiled_kernel, decides_output=model is pair.target))
    return pair
