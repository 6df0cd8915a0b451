"""Linear layers that keep their weight transposed, for cheap few-row products on CPU.

Why: a verify pass multiplies a handful of rows (the tree's nodes) by every weight matrix. With the MKL build of
torch on this CPU, `F.linear(x, W)` costs about as much for 1-3 rows as for one, but jumps 2-3x from 4 rows on (a
different kernel), while `x @ W.T` on a contiguous transposed copy grows slowly with the rows, but is ~10%
slower for 2-3 rows. Measured on a 1536x576 layer, one thread: 4 rows 283 -> 159 us, 8 rows 439 -> 172 us; on the
whole target, two threads: 4 nodes 84 -> 58 ms, 16 nodes 138 -> 71 ms, 2-3 nodes 47 -> 53 ms. So each layer keeps
both layouts and picks by row count: the price is a second copy of the linear weights (~430 MB for the target).
The swap changes speed only; the values are the same products up to float rounding.
MKL's packed weights (`torch.ops.mkl._mkl_linear`) were tried too: faster only when the row count equals the
packed size, no gain for the 2-9 rows the fastest methods verify (docs/benchmarks.md, session 8).
"""
from __future__ import annotations

import torch

SMALL_ROWS = 3  # up to this many rows F.linear is as fast as it gets (measured, see above)


class PretransposedLinear(torch.nn.Module):
    """An nn.Linear that also holds `weight_t`, the contiguous (in, out) transpose of its weight: inputs of at
    most SMALL_ROWS rows use F.linear on the original weight, larger ones `x @ weight_t`."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # shared, not copied (it may be the tied input embedding)
        self.bias = linear.bias
        self.weight_t = torch.nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() <= SMALL_ROWS * self.in_features:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        y = torch.matmul(x, self.weight_t)
        return y if self.bias is None else y + self.bias


def pretranspose_linears(model: torch.nn.Module) -> torch.nn.Module:
    """Swap every nn.Linear of an inference model for a PretransposedLinear, in place (CPU inference only:
    training code and exported weights expect plain nn.Linear modules)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, PretransposedLinear(child))
    return model
