"""Cost of a model's weight products alone, over q rows, per kernel variant, side by side (CPU).

Why: a verify row costs its share of every product plus the attention and the small operations between them
(scripts/forward_cost.py times the whole forward); this times only the products, each block layer of the model
called on q random rows as the forward calls it (fused q/k/v and gate/up as one call), so a change to the integer
products (block_int8.h, block_vnni.h) is measured without the rest. The pair is loaded once per entry of
`--variants` (a DYNASD_KERNEL_VARIANT) in one process and every (variant, rows) timed in interleaved rounds.

    .venv/bin/python scripts/product_cost.py --threads 2 --rounds 7 --variants avx512,avx2
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from dynasd.kernels.block_weights import BLOCK, BlockLinear, FusedBlocks
from dynasd.kernels.compile import VARIANT_ENV
from dynasd.kernels.lean_forward import fused_projections
from dynasd.loading.models import load_pair

ROWS = (1, 2, 4, 8, 16, 32)


def products_of(model: torch.nn.Module) -> list:
    """Each weight product of one forward, as the forward calls it: per layer the fused q/k/v, o, the fused
    gate/up, down (where fused), and the output layer."""
    calls, seen = [], set()
    for layer, (qkv, gate_up) in zip(model.model.layers, fused_projections(model)):
        attn, mlp = layer.self_attn, layer.mlp
        for product, modules in [(qkv, [attn.q_proj, attn.k_proj, attn.v_proj]), (attn.o_proj, [attn.o_proj]),
                                 (gate_up, [mlp.gate_proj, mlp.up_proj]), (mlp.down_proj, [mlp.down_proj])]:
            if isinstance(product, (FusedBlocks, BlockLinear)):
                calls.append(product)
            else:  # not fused: each module that is a block layer
                calls += [module for module in modules if isinstance(module, BlockLinear)]
            seen.update(id(module) for module in modules)
    calls += [module for module in model.modules() if isinstance(module, BlockLinear) and id(module) not in seen]
    return calls


def in_features(product) -> int:
    return product.in_features if isinstance(product, BlockLinear) else product.panels.shape[1] * BLOCK


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="embedded", help="the model pair (tiny-random: a check that it runs)")
    parser.add_argument("--role", default="target", choices=("target", "draft"))
    parser.add_argument("--variants", default="avx512,avx2", help="comma-separated kernel variants")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    variants = args.variants.split(",")
    calls = {}
    for variant in variants:
        os.environ[VARIANT_ENV] = variant
        calls[variant] = products_of(getattr(load_pair(args.pair, device="cpu"), args.role))
    if not calls[variants[0]]:
        print(f"the {args.role} of the {args.pair} pair has no block layers: nothing to time")
        return 0
    gen = torch.Generator().manual_seed(0)
    rows_in = {(k, q): torch.randn(q, k, generator=gen) for product in calls[variants[0]]
               for k in [in_features(product)] for q in ROWS}
    seconds = {(variant, q): [] for variant in variants for q in ROWS}
    for _ in range(args.rounds):
        for q in ROWS:
            for variant in variants:
                started = time.perf_counter()
                for product in calls[variant]:
                    product(rows_in[in_features(product), q])
                seconds[variant, q].append(time.perf_counter() - started)
    print(f"{args.pair} pair, the {args.role}'s {len(calls[variants[0]])} weight products of one forward, wall "
          f"clock, {args.threads} threads, {args.rounds} rounds: ms, min")
    print("| variant | " + " | ".join(f"{q} row{'s' * (q > 1)}" for q in ROWS) + " | extra row (1 -> 32) |")
    print("|---|" + "---|" * (len(ROWS) + 1))
    for variant in variants:
        best = [min(seconds[variant, q]) * 1e3 for q in ROWS]
        extra = (best[-1] - best[0]) / (ROWS[-1] - ROWS[0])
        print(f"| {variant} | " + " | ".join(f"{ms:.2f}" for ms in best) + f" | {extra:.3f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
