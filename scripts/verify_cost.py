"""Cost of one target forward over q tree nodes, with plain and with pre-transposed linear layers (CPU).

Why: whether speculation pays on a CPU depends on how fast a verify pass grows with the tree (docs/benchmarks.md).
Both pairs are loaded in one process and timed interleaved, so machine noise falls on both alike.

    .venv/bin/python scripts/verify_cost.py --threads 2 --reps 15
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dynasd.cache import CachedModel  # noqa: E402
from dynasd.models import load_pair  # noqa: E402

SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
CONTEXT = 160  # cached tokens before the tree, a typical prompt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    parser.add_argument("--reps", type=int, default=15, help="timed forwards per size and variant (median shown)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pairs = {"plain": load_pair(args.pair, device="cpu", fast_linears=False),
             "pre-transposed": load_pair(args.pair, device="cpu")}
    text = "Explain how the water cycle works and why it matters for farming in dry regions."
    prompt = (pairs["plain"].encode_prompt(text) * 8)[:CONTEXT]
    models = {name: CachedModel(pair.target) for name, pair in pairs.items()}
    for model in models.values():
        model.prefill(prompt)
    seconds = {(name, q): [] for name in models for q in SIZES}
    for _ in range(args.reps):
        for q in SIZES:
            chain = torch.ones(q, q, dtype=torch.bool).tril()
            for name, model in models.items():
                started = time.perf_counter()
                model.forward([], prompt[:q], chain, list(range(CONTEXT, CONTEXT + q)), keep_logits=q)
                seconds[name, q].append(time.perf_counter() - started)
                model.keep_path([], CONTEXT)  # drop the nodes again: every forward sees the same cache
    print(f"{args.pair} target, {torch.get_num_threads()} threads, {CONTEXT} cached tokens, median of {args.reps}")
    print("| nodes | plain (ms) | pre-transposed (ms) | plain / pre-transposed |")
    print("|---|---|---|---|")
    for q in SIZES:
        plain = statistics.median(seconds["plain", q]) * 1000
        fast = statistics.median(seconds["pre-transposed", q]) * 1000
        print(f"| {q} | {plain:.1f} | {fast:.1f} | {plain / fast:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
