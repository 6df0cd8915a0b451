"""Cost of one target forward over q tree nodes: stock modules, float32 engines, and the engine's (CPU).

Why: whether speculation pays on a CPU depends on how fast a verify pass grows with the tree (docs/benchmarks.md).
All variants are loaded in one process and timed interleaved, so machine noise falls on all alike:
  plain            stock transformers modules and cache
  torch            the engine before the compiled kernel: pre-transposed linears (dynasd/kernels/fast_linear.py
                   without its compiled kernel) + packed grouped-query attention (gqa_attention.py) + a KV cache
                   that grows in place + the lean forward (lean_forward.py)
  concat           fast modules below, but transformers' cache, which concatenates (copies) on every forward
  fp32             torch's + the compiled few-row kernel (panel_linear.cpp) for 2-24 rows (every row count on
                   CPUs other than Intel's: fast_linear.mkl_is_tuned_here), float32 weights: the engine before
                   2026-12-02, `--weights fp32`
  fast             what the engine uses: fp32's, with a GGUF target's weights in the file's 4- and 8-bit blocks
                   (block_linear.cpp; on x86 CPUs with AVX-512 or AVX2)

    .venv/bin/python scripts/verify_cost.py --threads 2 --reps 9 --contexts 160,800
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace

import torch

from dynasd.cache import CachedModel, runtime_of, stock_cache
from dynasd.loading.models import load_pair

SIZES = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, 32)


def repeated(ids: list[int], n: int) -> list[int]:
    """`ids` repeated to exactly n tokens: a prompt, or tree nodes, of any length from one encoded sentence."""
    return (ids * (n // len(ids) + 1))[:n]


def time_chain_forwards(models: dict, prompt: list[int], nodes: list[int], sizes, rounds: int,
                        clock=time.perf_counter) -> dict:
    """Seconds of each model's forward of a chain of q nodes after `prompt` (cached once), per (name, q): every
    (q, model) in interleaved rounds, so machine noise falls on all alike; each forward's nodes are dropped again,
    so every one sees the same cache. A feature draft gets one state row per input (seeded random rows: what they
    hold does not change what a forward costs). scripts/forward_cost.py times target and drafts with it."""
    context = len(prompt)
    states = {name: torch.randn(context + max(sizes), model.model.config.hidden_size,
                                generator=torch.Generator().manual_seed(0)) if model.reads_features else None
              for name, model in models.items()}
    for name, model in models.items():
        model.forward(prompt, [], None, [], 1, _rows(states[name], 0, context))
    seconds = {(name, q): [] for name in models for q in sizes}
    for _ in range(rounds):
        for q in sizes:
            chain = torch.ones(q, q, dtype=torch.bool).tril()
            for name, model in models.items():
                features = _rows(states[name], context, q)
                started = clock()
                model.forward([], nodes[:q], chain, list(range(context, context + q)), keep_logits=q,
                              features=features)
                seconds[name, q].append(clock() - started)
                model.keep_path([], context)
    return seconds


def _rows(states: torch.Tensor | None, start: int, count: int) -> torch.Tensor | None:
    return None if states is None else states[start:start + count]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    parser.add_argument("--reps", type=int, default=15, help="timed forwards per size and variant (median shown)")
    parser.add_argument("--contexts", default="160",
                        help="comma-separated cached-prompt lengths before the tree (160: a short prompt)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pairs = {"plain": load_pair(args.pair, device="cpu", fast_kernels=False),
             "torch": load_pair(args.pair, device="cpu", compiled_kernel=False),
             "fp32": load_pair(args.pair, device="cpu", weights="fp32"),
             "fast": load_pair(args.pair, device="cpu")}
    sentence = pairs["plain"].encode_prompt(
        "Explain how the water cycle works and why it matters for farming in dry regions.")
    for context in (int(c) for c in args.contexts.split(",")):
        models = {name: CachedModel(pair.target) for name, pair in pairs.items()}
        fast_target = pairs["fast"].target  # its runtime, but transformers' concatenating cache
        models["concat"] = CachedModel(fast_target, runtime=replace(runtime_of(fast_target), new_cache=stock_cache))
        seconds = time_chain_forwards(models, repeated(sentence, context), repeated(sentence, max(SIZES)), SIZES,
                                      args.reps)
        print(f"\n{args.pair} target, {torch.get_num_threads()} threads, {context} cached tokens, "
              f"median of {args.reps} (ms)")
        print("| nodes | plain | torch | concat | fp32 | fast | plain / fast | torch / fast | concat / fast "
              "| fp32 / fast | fast / fast at 1 node |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        ms = {key: statistics.median(values) * 1000 for key, values in seconds.items()}
        for q in SIZES:
            fast = ms['fast', q]
            print(f"| {q} | {ms['plain', q]:.1f} | {ms['torch', q]:.1f} | {ms['concat', q]:.1f} | "
                  f"{ms['fp32', q]:.1f} | {fast:.1f} | {ms['plain', q] / fast:.2f} | {ms['torch', q] / fast:.2f} | "
                  f"{ms['concat', q] / fast:.2f} | {ms['fp32', q] / fast:.2f} | {fast / ms['fast', 1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
