"""Linear layers for cheap few-row products on CPU: the weight in two more layouts, picked by row count.

Why: a verify pass multiplies a handful of rows (the tree's nodes) by every weight matrix, and reading the weights
from memory is the real cost, the same for 1 row as for 16. MKL's `F.linear(x, W)` runs near that bound for one
row (and up to 3) but jumps from 4 rows on (a different kernel); `x @ W.T` on a contiguous transposed copy grows
slowly with the rows and is the fastest layout for 32 rows and more (prefill). For 2-24 rows the compiled kernel
in panel_linear.cpp, which streams the weight once whatever the row count, beats both; one pass over the weights
takes up to 14 rows with AVX-512. Those row limits hold on Intel CPUs, for which MKL is tuned; on other CPUs the
kernel takes every row count (`mkl_is_tuned_here`). docs/benchmarks.md holds the measurements.

The kernel also takes float16 panels (summing in float32): a draft's layers that are not blocks
(block_weights.use_draft_blocks) use them for every row count, reading half the bytes, and keep nothing else (no
float32 weight, no transpose). A draft only proposes, so rounding its weights can change its proposals and never
a lossless method's output (a lossy one, ti-mcsd wider than 1, follows its draft's proposals).

The kernel is compiled on first use or by `dynasd build-kernels` (compile.py, cached under ~/.cache/dynasd/kernels);
without a compiler, ninja or float32 weights with a multiple of 32 outputs, on a CPU with neither AVX-512 nor AVX2
(`kernel_pays_here`), or with DYNASD_COMPILE=0, layers keep the two torch layouts. The price is memory: up to two
more copies of the linear weights. The layouts change speed only: the values are the same products up to float
rounding (the draft's fp16 panels aside). MKL's packed weights (`torch.ops.mkl._mkl_linear`) were measured and not
adopted (docs/benchmarks.md).
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

from .compile import kernel_once, kernel_variant

SMALL_ROWS = 3  # up to this many rows F.linear is as fast as it gets (measured, see above)
PANEL = 32  # output columns per panel, fixed by panel_linear.cpp
PANEL_ROWS = range(2, 25)  # row counts the compiled kernel takes where MKL is tuned (measured, see above)
ALL_ROWS = range(1, sys.maxsize)  # ... and where it is not
KERNEL_NAME = "dynasd_panel_linear"
KERNEL_SOURCE = Path(__file__).with_name("panel_linear.cpp")


def panel_kernel(variant: str | None = None):
    """The compiled `panel_linear(x, panels)` op in `variant` (default: the one this process uses,
    compile.kernel_variant), or None where there is none or it cannot be built here (warned once)."""
    return kernel_once(KERNEL_NAME, KERNEL_SOURCE, lambda name: getattr(torch.ops, f"dynasd_{name}").panel_linear,
                       variant)


@functools.cache  # asked once per linear layer at load: read /proc/cpuinfo once
def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            line = next((line for line in info if line.startswith("vendor_id")), "")
    except OSError:
        return ""
    return line.partition(":")[2].strip()


def mkl_is_tuned_here() -> bool:
    """Whether torch's MKL products run at full speed here: on Intel CPUs only.

    Why: MKL takes slower code paths on other vendors' CPUs: on an AMD EPYC the kernel was 1.4-3x faster than
    F.linear at every row count, while on an Intel Xeon MKL was the faster for one row and from 32 rows on, hence
    PANEL_ROWS there (docs/benchmarks.md, kernel variants)."""
    return _cpu_vendor() == "GenuineIntel"


def kernel_pays_here() -> bool:
    """Whether this process has a kernel variant for its CPU (compile.kernel_variant: x86 with AVX-512 or AVX2).

    Why not elsewhere: the kernel is written for AVX-512's and AVX2's registers; on ARM the layers keep the two
    torch layouts."""
    return kernel_variant() is not None


def to_panels(weight: torch.Tensor) -> torch.Tensor:
    """(out, in) weight -> (out / PANEL, in, PANEL): panel p holds output columns p*PANEL.. as in-by-PANEL rows."""
    out_features, in_features = weight.shape
    return weight.detach().reshape(out_features // PANEL, PANEL, in_features).transpose(1, 2).contiguous()


class PretransposedLinear(torch.nn.Module):
    """An nn.Linear that also holds `weight_t`, the contiguous (in, out) transpose of its weight, and, where the
    compiled kernel is available, `panels`: 2-24 rows (any count where MKL is not tuned, and with `half_panels`,
    which keep only the panels) go to the kernel, other inputs of at most SMALL_ROWS rows to F.linear on the
    original weight, larger ones to `x @ weight_t`."""

    def __init__(self, linear: torch.nn.Linear, kernel=None, half_panels: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = linear.bias
        self.kernel = None
        self.register_buffer("panels", None, persistent=False)
        if kernel is not None and linear.weight.dtype == torch.float32 and self.out_features % PANEL == 0:
            self.kernel = kernel
            # Rounded before the layout is made: no float32 copy of a draft's weight in between.
            self.panels = to_panels(linear.weight.detach().to(torch.float16) if half_panels else linear.weight)
        if self.kernel is not None and half_panels:
            # The kernel takes every row count (a draft's prefill too): the float32 weight and its transpose would
            # be two more copies of what the panels hold (the embedded draft: ~150 MB of its ~190).
            self.weight, self.weight_t, self.kernel_rows = None, None, ALL_ROWS
            return
        self.weight = linear.weight  # shared, not copied (it may be the tied input embedding)
        self.weight_t = torch.nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)
        self.kernel_rows = PANEL_ROWS if mkl_is_tuned_here() else ALL_ROWS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if self.kernel is not None and (rows in self.kernel_rows or self.weight is None) and x.dtype == torch.float32:
            y = self.kernel(x, self.panels)
        elif rows <= SMALL_ROWS:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        else:
            y = torch.matmul(x, self.weight_t)
        return y if self.bias is None else y + self.bias


def pretranspose_linears(model: torch.nn.Module, compiled: bool = True, half_panels: bool = False,
                         variant: str | None = None) -> torch.nn.Module:
    """Swap every nn.Linear of an inference model for a PretransposedLinear, in place (CPU inference only:
    training code and exported weights expect plain nn.Linear modules). `compiled=False` leaves the compiled
    kernel out (the benchmark's `kernels=torch`), as does a CPU without AVX-512 or AVX2 (`kernel_pays_here`);
    `half_panels` gives it float16 panels (drafts); `variant` names the kernel's variant (default: the process's)."""
    kernel = panel_kernel(variant) if compiled and kernel_pays_here() else None
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, PretransposedLinear(child, kernel, half_panels))
    return model


def panels_back_to_back(layers: list[torch.nn.Module]) -> torch.Tensor:
    """The `panels` of `layers` (stacked along their first dimension) in one tensor, each layer's own becoming a
    view of its part: one kernel call multiplies them all, and no copy is kept twice (FusedProjections,
    block_weights.FusedBlocks)."""
    fused = torch.cat([layer.panels for layer in layers])
    start = 0
    for layer in layers:
        count = layer.panels.shape[0]
        layer.panels = fused[start:start + count]
        start += count
    return fused


class FusedProjections:
    """Linear layers that read the same input (q/k/v, gate/up) as one kernel call over their panels back to back.

    Why: each kernel call has a fixed cost (thread fork/join, an output tensor) that a one-token forward pays 7
    times per layer; fused, 4 times. Each output is still summed by one accumulator in the same order, so the
    results are bitwise those of the separate layers. The layers' own panels become views of the fused ones (no
    extra memory) and keep working alone."""

    def __init__(self, linears: list[PretransposedLinear]) -> None:
        first = linears[0]
        self.linears = linears
        self.sizes = [layer.out_features for layer in linears]
        self.in_features, self.kernel, self.kernel_rows = first.in_features, first.kernel, first.kernel_rows
        self.panels = panels_back_to_back(linears)

    @staticmethod
    def of(linears: list[torch.nn.Module]) -> "FusedProjections | None":
        """Fused layers, or None where they cannot be (no kernel, a bias, different inputs or panel types)."""
        first = linears[0]
        if not all(isinstance(layer, PretransposedLinear) and layer.kernel is not None and layer.bias is None
                   and layer.in_features == first.in_features and layer.panels.dtype == first.panels.dtype
                   and layer.kernel_rows == first.kernel_rows for layer in linears):
            return None
        return FusedProjections(list(linears))

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        if x.numel() // self.in_features in self.kernel_rows and x.dtype == torch.float32:
            return list(self.kernel(x, self.panels).split(self.sizes, dim=-1))
        return [layer(x) for layer in self.linears]
