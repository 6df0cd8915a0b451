"""`dynasd costs`: what a forward costs over q rows, timed at the levels asked for, in one table.

Why: a draft pays when its forward costs a small share of the target's for the same rows, and a tree when a row
costs a small share of a forward; whether speculation pays on a CPU depends on how fast a verify pass grows with
the tree (docs/benchmarks.md). Each level answers one part of that. Within a level every model is loaded first,
in this one process, and then every (model, rows) forward is timed in interleaved rounds, so machine noise falls
on all alike:

  products  each weight product of a model's forward alone, every block layer called on q random rows as the
            forward calls it (fused q/k/v and gate/up as one call): a row of a verify costs its share of every
            product plus the attention and the small operations between them, and this measures a change to the
            integer products (block_int8.h, block_vnni.h) without the rest
  forward   one forward of the target and of each draft (token draft, feature draft) over a chain of q rows
            behind a cached prompt, each forward's rows dropped again so every one sees the same cache: each
            draft's share of the target's forward
  verify    one target forward over q tree nodes for each engine of VERIFY_ENGINES, from stock modules to the
            engine's own: what each part of the engine buys, and what a row beyond the first costs
  load      the explorer's kept cost table (dynasd/explorer/costs/cost.py) measured as the explorer measures it,
            quiet, with `--busy` busy loops at the same priority beside it, then quiet again. On a shared CPU
            another process can slow a measurement down; such a measurement must either stay close to a quiet
            one or be refused (the quiet table kept): the note says which

A variant (`--variants`, products and forward) is a DYNASD_KERNEL_VARIANT (compile.kernel_variant), optionally
`:fp32` (the target's float32 weights instead of its GGUF blocks) and optionally `/float32` (the blocks' float32
arithmetic instead of 8-bit activations): `avx512,avx2,avx2/float32,avx2:fp32,torch`. The pair is loaded once per
variant and per engine, and levels that need the same load share it. `--cpu-time` times one thread's CPU time
instead of the wall clock: on a machine other jobs share, it leaves out the time the process waited for a core.

    dynasd costs --levels products,forward --threads 2 --rounds 9 --variants avx512,avx2
    dynasd costs --levels verify --contexts 160,800
    dynasd costs --levels load --busy 1
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import torch

from ..cache import CachedModel, runtime_of, stock_cache
from ..explorer.costs import cost
from ..kernels.block_weights import BLOCK, BlockLinear, FusedBlocks
from ..kernels.compile import NO_VARIANT, VARIANT_ENV, runnable_variants
from ..kernels.lean_forward import fused_projections
from ..loading.models import ARITHMETICS, DEFAULT_ARITHMETIC, DEFAULT_WEIGHTS, WEIGHT_MODES, ModelPair, load_pair
from ..speed.step_cost import fit_line

LEVELS = ("products", "forward", "verify", "load")
ROWS = (1, 2, 4, 8, 16, 32)  # products and forward: a draft's level and a tree's verify, up to a wide one
VERIFY_ROWS = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, 32)  # the trees' own node counts between them
# Each level's rounds and cached tokens unless --rounds / --contexts say otherwise: what its measurements in
# docs/benchmarks.md used. The load level measures as the explorer does, so it takes the explorer's rounds.
ROUNDS = {"products": 7, "forward": 13, "verify": 15, "load": cost.CALIBRATION_ROUNDS}
CONTEXTS = {"forward": (100,), "verify": (160,)}  # 160: a short prompt
ROLES = ("target", "draft", "feature_draft")  # those a pair has: tiny-random and embedded have all three
PROMPT = "Explain how the water cycle works and why it matters for farming in dry regions."
LOAD_PROMPT = "Explain how the water cycle works and why it matters for farming."  # 8 times: the load's context
BUSY_LOOP = "import time\nend = time.time() + 600\nwhile time.time() < end:\n    pass\n"
# The verify level's engines, as load_pair's options, in the order they are timed; "concat" is "fast" with
# transformers' cache, which concatenates (copies) on every forward.
VERIFY_ENGINES = {
    "plain": dict(fast_kernels=False),      # stock transformers modules and cache
    # the engine before the compiled kernel: pre-transposed linears (kernels/fast_linear.py without its compiled
    # kernel), packed grouped-query attention (gqa_attention.py), a KV cache that grows in place, the lean forward
    "torch": dict(compiled_kernel=False),
    # torch's plus the compiled few-row kernel (panel_linear.cpp) for 2-24 rows (every row count on CPUs other
    # than Intel's: fast_linear.mkl_is_tuned_here), float32 weights: the engine before 2026-12-02, `--weights fp32`
    "fp32": dict(weights="fp32"),
    # what the engine uses: fp32's, with a GGUF target's weights in the file's 4- and 8-bit blocks
    # (block_linear.cpp; on x86 CPUs with AVX-512 or AVX2)
    "fast": dict(),
}
ENGINE_ORDER = ("plain", "torch", "concat", "fp32", "fast")  # as the table shows them: slowest first


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--levels", default="forward", help=f"comma-separated, of {', '.join(LEVELS)}")
    p.add_argument("--pair", default="embedded", help="the model pair (tiny-random: a check that it runs)")
    p.add_argument("--variants", default=None,
                   help="products and forward: comma-separated kernel variants, each optionally :fp32 and/or "
                        "/float32 (default: the variants this CPU runs, else torch)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (0: torch's choice)")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved rounds (default per level: " +
                        ", ".join(f"{level} {rounds}" for level, rounds in ROUNDS.items()) + ")")
    p.add_argument("--contexts", default=None,
                   help="forward and verify: comma-separated cached-prompt lengths before the rows (default: "
                        + ", ".join(f"{level} {c[0]}" for level, c in CONTEXTS.items()) + ")")
    p.add_argument("--cpu-time", action="store_true", help="one thread, its CPU time (a shared machine)")
    p.add_argument("--busy", type=int, default=1, help="load: busy loops planted beside the loaded measurement")
    p.add_argument("--settle", type=float, default=2.0, help="load: seconds the loops run before measuring")


@dataclass(frozen=True)
class Variant:
    """One entry of --variants: the kernel variant ($DYNASD_KERNEL_VARIANT), the target's weights, the blocks'
    arithmetic."""

    text: str
    kernel: str
    weights: str
    arithmetic: str


def parse_variant(text: str) -> Variant:
    """`KERNEL[:WEIGHTS][/ARITHMETIC]`, refused where this CPU does not run the kernel variant (kernel_variant
    would quietly run another, and the table would name a variant it did not time)."""
    named, _, arithmetic = text.strip().partition("/")
    kernel, _, weights = named.partition(":")
    runnable = (*runnable_variants(), NO_VARIANT)
    if kernel not in runnable:
        raise ValueError(f"variant '{text}': '{kernel}' is not a kernel variant this CPU runs "
                         f"({', '.join(runnable)})")
    if weights and weights not in WEIGHT_MODES:
        raise ValueError(f"variant '{text}': weights ':{weights}' must be one of {', '.join(WEIGHT_MODES)}")
    if arithmetic and arithmetic not in ARITHMETICS:
        raise ValueError(f"variant '{text}': arithmetic '/{arithmetic}' must be one of {', '.join(ARITHMETICS)}")
    return Variant(text.strip(), kernel, weights or DEFAULT_WEIGHTS, arithmetic or DEFAULT_ARITHMETIC)


@dataclass(frozen=True)
class Plan:
    """What one `dynasd costs` times, checked before a model loads."""

    pair: str
    levels: tuple[str, ...]
    variants: tuple[Variant, ...]
    rounds: dict[str, int]
    contexts: dict[str, tuple[int, ...]]
    cpu_time: bool
    busy: int
    settle: float

    @property
    def clock(self) -> Callable[[], float]:
        return time.thread_time if self.cpu_time else time.perf_counter


def plan_from(args: argparse.Namespace) -> Plan:
    levels = tuple(level.strip() for level in args.levels.split(","))
    unknown = [level for level in levels if level not in LEVELS]
    if unknown or not levels:
        raise ValueError(f"unknown level '{','.join(unknown)}' (levels: {', '.join(LEVELS)})")
    variants = tuple(parse_variant(v) for v in (args.variants or ",".join(runnable_variants() or (NO_VARIANT,)))
                     .split(","))
    if args.rounds is not None and args.rounds < 1:
        raise ValueError("--rounds must be at least 1")
    if args.threads < 0 or args.busy < 0 or args.settle < 0:
        raise ValueError("--threads, --busy and --settle must not be negative")
    if args.cpu_time and "load" in levels:
        raise ValueError("--cpu-time does not go with the load level: the explorer's table is wall clock")
    contexts = dict(CONTEXTS)
    if args.contexts is not None:
        try:
            given = tuple(int(c) for c in args.contexts.split(","))
        except ValueError:
            raise ValueError(f"--contexts must be comma-separated integers, got '{args.contexts}'") from None
        if min(given) < 1:
            raise ValueError("--contexts must be at least 1 token each")
        contexts = {level: given for level in CONTEXTS}
    return Plan(args.pair, levels, variants, {level: args.rounds or ROUNDS[level] for level in LEVELS}, contexts,
                args.cpu_time, args.busy, args.settle)


class Pairs:
    """The pairs one run loads, each once, keyed by its kernel variant and load options: levels that time the
    same pair share it."""

    def __init__(self, name: str):
        self.name = name
        self._loaded: dict[tuple, ModelPair] = {}

    def get(self, kernel: str | None = None, **options) -> ModelPair:
        """The pair loaded with `kernel` as $DYNASD_KERNEL_VARIANT (None: as the environment says) and `options`."""
        key = (kernel, tuple(sorted(options.items())))
        if key not in self._loaded:
            with variant_env(kernel):
                self._loaded[key] = load_pair(self.name, device="cpu", **options)
        return self._loaded[key]

    def of(self, variant: Variant) -> ModelPair:
        return self.get(variant.kernel, weights=variant.weights, arithmetic=variant.arithmetic)


@contextmanager
def variant_env(kernel: str | None) -> Iterator[None]:
    """$DYNASD_KERNEL_VARIANT set while a pair loads (its kernels are chosen then), and put back after, so that a
    later load without a variant gets the environment's."""
    before = os.environ.get(VARIANT_ENV)
    if kernel is not None:
        os.environ[VARIANT_ENV] = kernel
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(VARIANT_ENV, None)
        else:
            os.environ[VARIANT_ENV] = before


# ---------------------------------------------------------------------------------------------------------------
# the table

@dataclass
class Row:
    """One row of the table: what was timed (level, model or engine, variant or condition) and a cell per row
    count it was timed at."""

    level: str
    model: str
    condition: str
    cells: dict[int, str]
    note: str = ""


def timed_row(level: str, model: str, condition: str, seconds: dict[int, list[float]], note: str = "") -> Row:
    """A measured row: each row count's min (median) over the rounds, in ms."""
    return Row(level, model, condition, {q: f"{min(s) * 1e3:.2f} ({statistics.median(s) * 1e3:.2f})"
                                         for q, s in seconds.items()}, note)


def beyond_first(ms: dict[int, float]) -> dict[int, str]:
    """What each row beyond the first adds to a forward, in ms, from one row to q rows."""
    first = min(ms)
    return {q: f"{(ms[q] - ms[first]) / (q - first):.3f}" for q in sorted(ms) if q > first}


def table(rows: list[Row]) -> list[str]:
    """The markdown table: one column per row count any level timed ("–" where a level did not time it)."""
    counts = sorted({q for row in rows for q in row.cells})
    lines = ["| level | model or engine | variant or condition | "
             + " | ".join(f"{q} row{'s' * (q > 1)}" for q in counts) + " | note |",
             "|---|---|---|" + "---|" * (len(counts) + 1)]
    for row in rows:
        cells = [row.cells.get(q, "–") for q in counts]
        lines.append(f"| {row.level} | {row.model} | {row.condition} | " + " | ".join(cells) + f" | {row.note} |")
    return lines


def _per_rows(seconds: dict, key, rows: tuple[int, ...]) -> dict[int, list[float]]:
    return {q: seconds[key, q] for q in rows}


def _label(role: str) -> str:
    return role.replace("_", " ")


def _rounds(count: int) -> str:
    return f"{count} round{'s' * (count != 1)}"


# ---------------------------------------------------------------------------------------------------------------
# products

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


def products_level(plan: Plan, pairs: Pairs) -> tuple[str, list[Row]]:
    """Each model's weight products over q random rows, per variant; the models with no block layers (the
    products of torch's linears are not the kernels') are named and left out."""
    calls = {(role, v.text): products_of(model) for role in ROLES for v in plan.variants
             for model in [getattr(pairs.of(v), role)] if model is not None}
    without = {role: [variant for (of, variant), products in calls.items() if of == role and not products]
               for role in ROLES}
    calls = {key: products for key, products in calls.items() if products}
    rounds = plan.rounds["products"]
    said = f"products: each model's weight products of one forward, {_rounds(rounds)}" + "".join(
        f"; the {_label(role)} has no block layers ({', '.join(variants)})" for role, variants in without.items()
        if variants)
    gen = torch.Generator().manual_seed(0)
    rows_in = {(k, q): torch.randn(q, k, generator=gen)
               for k in sorted({in_features(p) for products in calls.values() for p in products}) for q in ROWS}
    seconds: dict = {(key, q): [] for key in calls for q in ROWS}
    for _ in range(rounds):
        for q in ROWS:
            for key, products in calls.items():
                started = plan.clock()
                for product in products:
                    product(rows_in[in_features(product), q])
                seconds[key, q].append(plan.clock() - started)
    rows = [timed_row("products", _label(role), variant, _per_rows(seconds, (role, variant), ROWS),
                      f"{len(calls[role, variant])} products") for role, variant in calls]
    rows += [Row("products", f"{_label(role)}: a row beyond the first (min)", variant,
                 beyond_first({q: min(seconds[(role, variant), q]) * 1e3 for q in ROWS}), "ms")
             for role, variant in calls]
    return said, rows


# ---------------------------------------------------------------------------------------------------------------
# forward and verify: chains of q rows behind a cached prompt

def repeated(ids: list[int], n: int) -> list[int]:
    """`ids` repeated to exactly n tokens: a prompt, or tree nodes, of any length from one encoded sentence."""
    return (ids * (n // len(ids) + 1))[:n]


def time_chain_forwards(models: dict, prompt: list[int], nodes: list[int], sizes, rounds: int,
                        clock: Callable[[], float] = time.perf_counter) -> dict:
    """Seconds of each model's forward of a chain of q nodes after `prompt` (cached once), per (name, q): every
    (q, model) in interleaved rounds, so machine noise falls on all alike; each forward's nodes are dropped again,
    so every one sees the same cache. A feature draft gets one state row per input (seeded random rows: what they
    hold does not change what a forward costs)."""
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


def forward_level(plan: Plan, pairs: Pairs) -> tuple[str, list[Row]]:
    """One forward of the target and each draft over q rows, per variant; then each draft / target, of the
    minimums."""
    first = pairs.of(plan.variants[0])
    sentence = first.encode_prompt(PROMPT)
    roles = [role for role in ROLES if getattr(first, role) is not None]
    rows = []
    for context in plan.contexts["forward"]:
        level = f"forward ({context} tokens)"
        models = {(v.text, role): CachedModel(getattr(pairs.of(v), role)) for v in plan.variants for role in roles}
        seconds = time_chain_forwards(models, repeated(sentence, context), repeated(sentence, max(ROWS)), ROWS,
                                      plan.rounds["forward"], plan.clock)
        rows += [timed_row(level, _label(role), v.text, _per_rows(seconds, (v.text, role), ROWS))
                 for role in roles for v in plan.variants]
        rows += [Row(level, f"{_label(role)} / target (min)", v.text,
                     {q: f"{min(seconds[(v.text, role), q]) / min(seconds[(v.text, 'target'), q]):.3f}"
                      for q in ROWS}) for role in roles[1:] for v in plan.variants]
    return f"forward: a chain of q rows behind the cached tokens, {_rounds(plan.rounds['forward'])}", rows


def verify_level(plan: Plan, pairs: Pairs) -> tuple[str, list[Row]]:
    """One target forward over q tree nodes per engine; then each engine / fast and what a node beyond the first
    costs, of the medians."""
    engines = {name: pairs.get(**options) for name, options in VERIFY_ENGINES.items()}
    sentence = engines["plain"].encode_prompt(PROMPT)
    rows = []
    for context in plan.contexts["verify"]:
        level = f"verify ({context} tokens)"
        models = {name: CachedModel(pair.target) for name, pair in engines.items()}
        fast_target = engines["fast"].target  # its runtime, but transformers' concatenating cache
        models["concat"] = CachedModel(fast_target, runtime=replace(runtime_of(fast_target), new_cache=stock_cache))
        seconds = time_chain_forwards(models, repeated(sentence, context), repeated(sentence, max(VERIFY_ROWS)),
                                      VERIFY_ROWS, plan.rounds["verify"], plan.clock)
        ms = {key: statistics.median(values) * 1e3 for key, values in seconds.items()}
        rows += [timed_row(level, "target", name, _per_rows(seconds, name, VERIFY_ROWS)) for name in ENGINE_ORDER]
        rows += [Row(level, "target / fast (median)", name, {q: f"{ms[name, q] / ms['fast', q]:.2f}"
                                                             for q in VERIFY_ROWS}) for name in ENGINE_ORDER[:-1]]
        rows += [Row(level, "target: a node beyond the first (median)", name,
                     beyond_first({q: ms[name, q] for q in VERIFY_ROWS}), "ms") for name in ENGINE_ORDER]
    return f"verify: a chain of q tree nodes behind the cached tokens, {_rounds(plan.rounds['verify'])}", rows


# ---------------------------------------------------------------------------------------------------------------
# load: the explorer's cost table quiet, loaded, quiet again

@contextmanager
def busy_loops(count: int, settle: float) -> Iterator[None]:
    """`count` busy loops in other processes at this one's priority, running `settle` seconds before the body."""
    loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]
    try:
        if loops:
            time.sleep(settle)
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def load_level(plan: Plan, pairs: Pairs) -> tuple[str, list[Row]]:
    """The explorer's calibration (cost.time_rounds, its medians and fitted line) quiet, beside busy loops and
    quiet again; each one's one-row forward and fitted row against the first quiet one's, and the verdict the
    explorer would give it."""
    pair = pairs.get()
    context = pair.encode_prompt(LOAD_PROMPT) * 8
    cost.time_rounds({"target": pair.target}, context, rounds=1)  # warm-up: first forwards pay for allocation
    measured = []
    for condition, loops in (("quiet", 0), (f"{plan.busy} busy loop(s)", plan.busy), ("quiet again", 0)):
        with busy_loops(loops, plan.settle):
            runs, conditions = cost.time_rounds({"target": pair.target}, context, rounds=plan.rounds["load"])
        medians = cost.medians(runs)["target"]
        _, per_row = fit_line([float(q) for q in medians], list(medians.values()))
        measured.append((condition, runs["target"], medians, per_row, conditions))
    quiet, quiet_row = measured[0][2], measured[0][3]
    rows = []
    for condition, seconds, _, per_row, conditions in measured:
        others = "unknown" if conditions.others is None else f"{conditions.others:.2f}"
        verdict = "busy: refused, the kept quiet table stays" if conditions.busy_because() else "quiet: kept"
        versus = f"{per_row / quiet_row:.2f}x" if quiet_row else "–"
        rows.append(timed_row("load", "target", condition, seconds,
                              f"a row beyond the first {per_row * 1e3:.3f} ms (fitted, {versus} quiet); other "
                              f"processes {others} cores; {verdict}"))
    rows += [Row("load", "target / quiet (median)", condition, {q: f"{medians[q] / quiet[q]:.2f}x" for q in medians})
             for condition, _, medians, _, _ in measured]
    return (f"load: the explorer's cost table, {_rounds(plan.rounds['load'])} interleaved, quiet, beside "
            f"{plan.busy} busy loop(s), quiet again"), rows


# ---------------------------------------------------------------------------------------------------------------

MEASURE: dict[str, Callable[[Plan, Pairs], tuple[str, list[Row]]]] = {
    "products": products_level, "forward": forward_level, "verify": verify_level, "load": load_level}


def execute(args: argparse.Namespace) -> int:
    plan = plan_from(args)  # every mistake in the arguments fails before a model loads
    torch.set_num_threads(1 if plan.cpu_time else args.threads or torch.get_num_threads())
    threads = torch.get_num_threads()
    timing = "CPU time, one thread" if plan.cpu_time else f"wall clock, {threads} thread{'s' * (threads > 1)}"
    pairs = Pairs(plan.pair)
    said, rows = [], []
    for level in plan.levels:
        print(f"timing {level} ...", file=sys.stderr, flush=True)
        level_said, level_rows = MEASURE[level](plan, pairs)
        said.append(level_said)
        rows += level_rows
    print(f"{plan.pair} pair, {timing}: ms, min (median) of the rounds")
    print("\n".join(said))
    print("\n".join(table(rows)))
    return 0
