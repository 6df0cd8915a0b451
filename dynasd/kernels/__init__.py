"""Acceleration applied to a loaded pair from outside: the decoders never know which kernels run.

`accelerate(pair)` gives every model of the pair (target, draft, feature draft)
  - on CPU, for a target loaded from a GGUF file, its linear layers and tied embedding in the file's own
    quantized blocks (block_weights.py: Q4_1 and Q8_0, ~96 MB instead of ~540 MB of float32 for the embedded
    target), the drafts sharing that embedding,
  - packed grouped-query attention for tree verifies (gqa_attention.py),
  - KV caches that grow in place (inplace_cache.py) and the lean forward (lean_forward.py; the layers of a model
    in blocks as one compiled call, and its whole forward, from the mask on, where its embedding, output layer and
    a feature draft's mixer are blocks too), attached as the model's runtime (dynasd/cache.py), which every
    CachedModel of it then uses,
  - on CPU only, linear layers with few-row weight layouts and, where it pays, the compiled kernel
    (fast_linear.py); the drafts' layers in 8-bit blocks, their output layer in 4-bit ones, where a kernel
    variant runs (block_weights.py), their other layers in half-precision panels;
  - block layers computing in 8-bit activations (`arithmetic="int8"`, the default: block_int8.h, each row
    quantized to blocks of 32 and multiplied in exact integers) with the exact attention that goes with them
    (exact_attention.py), so a verify row is bitwise what the same token gets alone; `arithmetic="float32"`
    multiplies the expanded weights by the float rows instead.
Which of these a model gets is decided in one place, `plan_for`, from its device; which variant of the compiled
kernels (AVX-512, AVX2, or none: ARM gets float32 weights and torch's products) in another, compile.kernel_variant,
from the CPU's features. `kernels_in_use(model)` names the outcome in a few words.

What changes: the GGUF blocks expand to exactly the float32 weights (checked per layer at load); in float32
arithmetic only the order of sums changes (~1e-5), in 8-bit activations the rounding of each row's inputs too
(the embedded target's next-token distributions ~0.006 nats from float32's, tests/test_block_weights.py); the
target's logits in float32 arithmetic equal stock transformers' within float rounding (packed
attention and the linear layouts block their sums differently; ~1e-5 on the tiny pair, tests/test_kernels.py),
the lean forward and the in-place cache change nothing bitwise; the drafts' blocks and half-precision panels
round their weights, which may change their proposals, never a lossless method's output.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cache import Runtime, attach_runtime, stock_cache, stock_forward
from ..loading.shared_module import SharedModule
from .block_weights import (
    ARITHMETICS,
    FLOAT32,
    INT8,
    Q4_1,
    Q8_0,
    BlockLinear,
    block_kernel,
    exact_attention_op,
    use_draft_blocks,
    use_gguf_blocks,
)
from .compile import VARIANT_LABELS, kernel_variant, multiplies_with_vnni
from .exact_attention import use_exact_attention
from .fast_linear import PretransposedLinear, pretranspose_linears
from .gqa_attention import use_packed_gqa
from .inplace_cache import in_place_cache
from .lean_forward import direct_forward, fused_projections, lean_forward, supports
from .memory import return_freed_memory

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
    gguf_blocks: bool = False  # a GGUF model's weights stay in the file's quantized blocks (block_weights.py)
    draft_blocks: bool = False  # a draft's layers quantized to blocks (block_weights.use_draft_blocks)
    variant: str | None = None  # the compiled kernels' variant (compile.kernel_variant), None: torch's products
    arithmetic: str = FLOAT32  # block layers' products: "int8" (8-bit activation blocks) or "float32"


def plan_for(device: torch.device, compiled_kernel: bool = True, decides_output: bool = True,
             weights: str = "gguf", dtype: torch.dtype = torch.float32, arithmetic: str = INT8) -> KernelPlan:
    """The plan for a model on `device`: the CPU layouts and kernels on CPU only, stock PyTorch ops elsewhere.

    `decides_output` is True for the target, whose panels stay float32; a draft's layers become blocks (8-bit, its
    output layer 4-bit) where a kernel variant runs (and their shape fits), float16 panels otherwise. `weights="gguf"`
    keeps a float32 target's GGUF blocks where a variant of their kernel runs (x86 with AVX-512 or AVX2; elsewhere
    the float32 weights and torch's products). `arithmetic` is what block layers compute in (block_weights.py):
    "int8" by default, where every row's products are exact integers and cheap; "float32" multiplies the expanded
    weights by the float inputs. Models without block layers compute in float32 whatever it says."""
    if arithmetic not in ARITHMETICS:
        raise ValueError(f"arithmetic must be one of {', '.join(ARITHMETICS)}, got {arithmetic!r}")
    on_cpu = torch.device(device).type == "cpu"
    variant = kernel_variant() if on_cpu and compiled_kernel else None
    gguf_blocks = variant is not None and decides_output and weights == "gguf" and dtype == torch.float32
    draft_blocks = variant is not None and not decides_output and dtype == torch.float32
    return KernelPlan(linear_layouts=on_cpu, compiled_kernel=on_cpu and compiled_kernel,
                      half_panels=on_cpu and not decides_output, gguf_blocks=gguf_blocks, draft_blocks=draft_blocks,
                      variant=variant, arithmetic=arithmetic if gguf_blocks or draft_blocks else FLOAT32)


def accelerate_model(model: torch.nn.Module, plan: KernelPlan) -> torch.nn.Module:
    """Apply `plan` to `model` in place. Again with the same plan it does nothing; with another it refuses, since
    swapped layers cannot be swapped back."""
    applied = getattr(model, _PLAN_ATTRIBUTE, None)
    if applied is not None:
        if applied == plan:
            return model
        raise ValueError(f"this model is already accelerated ({applied}); load it again for {plan}")
    if plan.gguf_blocks and getattr(model, "dynasd_gguf_file", None) is not None \
            and block_kernel(plan.variant) is not None:
        use_gguf_blocks(model, model.dynasd_gguf_file, block_kernel(plan.variant), plan.arithmetic)
    if plan.draft_blocks and block_kernel(plan.variant) is not None:
        use_draft_blocks(model, block_kernel(plan.variant), plan.arithmetic)
    if plan.packed_gqa:
        use_packed_gqa(model)
    if any(getattr(module, "arithmetic", None) == INT8 for module in model.modules()):
        use_exact_attention(model, exact_attention_op(plan.variant))
    if plan.linear_layouts:
        pretranspose_linears(model, compiled=plan.compiled_kernel, half_panels=plan.half_panels,
                             variant=plan.variant)
    # Decided after the attention switch: the lean forward knows "sdpa", "eager" and the packed attention.
    forward = lean_forward if plan.lean_forward and supports(model) else stock_forward
    attach_runtime(model, Runtime(forward=forward, new_cache=in_place_cache if plan.in_place_cache else stock_cache,
                                  direct_forward=direct_forward if forward is lean_forward else None))
    if forward is lean_forward:
        fused_projections(model)
    setattr(model, _PLAN_ATTRIBUTE, plan)
    return model


def accelerate(pair, compiled_kernel: bool = True, weights: str = "gguf", arithmetic: str = INT8):
    """Accelerate every model of `pair` (a dynasd.loading.models.ModelPair, which calls this from load_pair: hence
    no import of it here) in place and return the pair; `compiled_kernel=False` leaves the compiled
    kernels out (the benchmark's `kernels=torch`), `weights="fp32"` the GGUF blocks. Training code, which needs
    plain nn.Linear modules, must not accelerate its pair."""
    drafts = [model for model in (pair.draft, pair.feature_draft) if model is not None]
    target_plan = plan_for(pair.device, compiled_kernel, True, weights, pair.dtype, arithmetic)
    sharing = []
    if target_plan.gguf_blocks:  # which drafts can read the target's block embedding (asked before it is swapped)
        target_embedding = pair.target.get_input_embeddings().weight
        sharing = [draft for draft in drafts if _same_values(draft.get_input_embeddings().weight, target_embedding)]
    # The drafts first, their shared embedding let go meanwhile: each draft's float32 weights become blocks
    # and are freed before the target's blocks are made, so the two never add up (a load's peak ~60 MB lower).
    for draft in sharing:
        draft.set_input_embeddings(None)
    for model in drafts:
        accelerate_model(model, plan_for(pair.device, compiled_kernel, decides_output=False,
                                         arithmetic=arithmetic))
        return_freed_memory()
    accelerate_model(pair.target, target_plan)
    embedding = pair.target.get_input_embeddings()
    for draft in sharing:  # the same values, now read from the target's blocks (a float32 copy: 113 MB)
        draft.set_input_embeddings(SharedModule(embedding))
    return_freed_memory()
    return pair


def kernels_in_use(model: torch.nn.Module) -> str:
    """A few words naming what `model`'s linear layers compute with, for a device line: their weights ("GGUF
    blocks", a draft's "8- and 4-bit blocks", "float16 panels" or the model's dtype), products ("AVX2 kernels",
    "AVX-512 kernels" or "torch products") and, where block layers quantize their inputs, "8-bit activations" ("on
    VNNI" where the kernels multiply them with it), e.g. "GGUF blocks, AVX2 kernels, 8-bit activations". An
    embedding shared from another model does not count."""
    layers = [module for path, module in model.named_modules() if "embed_tokens" not in path]
    plan = getattr(model, _PLAN_ATTRIBUTE, None)
    compiled = [module for module in layers if isinstance(module, BlockLinear)
                or getattr(module, "panels", None) is not None and getattr(module, "kernel", None) is not None]
    if any(isinstance(module, BlockLinear) for module in layers):
        kinds = {module.kind for module in layers if isinstance(module, BlockLinear)}
        weights = "GGUF blocks" if plan is not None and plan.gguf_blocks else \
            "8- and 4-bit blocks" if kinds == {Q8_0, Q4_1} else "8-bit blocks" if kinds == {Q8_0} else "4-bit blocks"
    elif compiled and plan is not None and plan.half_panels:
        weights = "float16 panels"
    else:
        weights = str(next(model.parameters()).dtype).removeprefix("torch.")
    variant = plan.variant if plan is not None else None
    products = f"{VARIANT_LABELS[variant]} kernels" if compiled and variant else "torch products"
    arithmetic = {module.arithmetic for module in layers if isinstance(module, BlockLinear)}
    activations = ", 8-bit activations" + (" on VNNI" if compiled and multiplies_with_vnni(variant) else "") \
        if INT8 in arithmetic else ""
    return f"{weights}, {products}{activations}"


def weight_bytes_per_forward(model: torch.nn.Module) -> int:
    """The bytes of weights one forward of `model` reads: every linear layer's weights in the form its product
    reads them (GGUF blocks, float16 or float32 panels, a float32 weight), once each; embeddings look up a few rows
    and count nothing. Why: a forward on a CPU is bound by these reads, so bytes per token times tokens / s is the
    memory bandwidth a method draws, to be read beside the machine's own (the bench prints both)."""
    counted: set[int] = set()
    total = 0
    for path, module in model.named_modules(remove_duplicate=False):
        if "embed_tokens" in path or id(module) in counted:
            continue
        if isinstance(module, BlockLinear):
            read = [module.panels]
        elif isinstance(module, PretransposedLinear):
            read = [module.panels if module.kernel is not None else module.weight, module.bias]
        elif isinstance(module, torch.nn.Linear):
            read = [module.weight, module.bias]
        else:
            continue
        counted.add(id(module))
        total += sum(t.numel() * t.element_size() for t in read if t is not None)
    return total


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b))
