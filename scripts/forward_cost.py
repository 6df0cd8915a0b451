"""Cost of one target forward and one forward of each draft over q tree rows, per kernel variant, side by side (CPU).

Why: a draft pays when its forward costs a small share of the target's for the same rows, and a tree when a row
costs a small share of a forward (docs/benchmarks.md). The embedded pair is loaded once per entry of `--variants`
(a DYNASD_KERNEL_VARIANT, compile.kernel_variant; optionally `:fp32`, the target's float32 weights instead of its
GGUF blocks; optionally `/float32`, the blocks' float32 arithmetic instead of 8-bit activations) in one process, a
prompt cached, then every (variant, model, rows) forward timed in interleaved rounds, so machine noise falls on all
alike; each forward's rows are dropped again, so every one sees the same cache.
`--cpu-time` times one thread's CPU time instead of the wall clock (one thread): on a machine other jobs share, it
leaves out the time the process waited for a core.

    .venv/bin/python scripts/forward_cost.py --threads 2 --rounds 13 --variants avx512,avx2,avx2/float32,avx2:fp32,torch
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from verify_cost import repeated, time_chain_forwards  # this folder (a script's folder is on sys.path)

from dynasd.cache import CachedModel
from dynasd.kernels.compile import VARIANT_ENV
from dynasd.loading.models import DEFAULT_ARITHMETIC, load_pair

ROWS = (1, 2, 4, 8, 16, 32)
ROLES = ("target", "draft", "feature_draft")  # those a pair has: tiny-random and embedded have all three


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="embedded", help="the model pair (tiny-random: a check that it runs)")
    parser.add_argument("--variants", default="avx512,avx2", help="comma-separated kernel variants")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=13)
    parser.add_argument("--context", type=int, default=100, help="cached prompt tokens before the rows")
    parser.add_argument("--cpu-time", action="store_true", help="one thread, its CPU time (a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(1 if args.cpu_time else args.threads)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    variants = args.variants.split(",")
    pairs = {}
    for variant in variants:
        named, _, arithmetic = variant.partition("/")
        os.environ[VARIANT_ENV], _, weights = named.partition(":")
        pairs[variant] = load_pair(args.pair, device="cpu", weights=weights or "gguf",
                                   arithmetic=arithmetic or DEFAULT_ARITHMETIC)
    sentence = pairs[variants[0]].encode_prompt(
        "Explain how the water cycle works and why it matters for farming in dry regions.")
    roles = [role for role in ROLES if getattr(pairs[variants[0]], role) is not None]
    models = {(variant, role): CachedModel(getattr(pair, role)) for variant, pair in pairs.items() for role in roles}
    seconds = time_chain_forwards(models, repeated(sentence, args.context), repeated(sentence, max(ROWS)), ROWS,
                                  args.rounds, clock)
    timing = "CPU time, one thread" if args.cpu_time else f"wall clock, {args.threads} threads"
    print(f"{args.pair} pair, {args.context} cached tokens, {timing}, {args.rounds} rounds: ms, min (median)")
    print("| model, variant | " + " | ".join(f"{rows} row{'s' * (rows > 1)}" for rows in ROWS) + " |")
    print("|---|" + "---|" * len(ROWS))
    for role in roles:
        for variant in variants:
            cells = [f"{min(seconds[(variant, role), rows]) * 1e3:.2f} "
                     f"({statistics.median(seconds[(variant, role), rows]) * 1e3:.2f})" for rows in ROWS]
            print(f"| {_label(role)}, {variant} | " + " | ".join(cells) + " |")
    for role in roles[1:]:
        for variant in variants:
            ratios = [min(seconds[(variant, role), rows]) / min(seconds[(variant, "target"), rows]) for rows in ROWS]
            print(f"| {_label(role)} / target, {variant} | " + " | ".join(f"{ratio:.3f}" for ratio in ratios) + " |")
    return 0


def _label(role: str) -> str:
    return role.replace("_", " ")


if __name__ == "__main__":
    raise SystemExit(main())
