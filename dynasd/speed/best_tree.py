"""`dynasd best-tree`: the static tree with the highest expected speed for this draft on this device.

Three measurements, then the search (dynasd/speed/tree_search.py), then the check:
  1. acceptance  the draft's acceptance vector p_r (rank r's chance once the earlier siblings were rejected), from
                 mcsd runs of a wide measuring tree on the prompts;
  2. costs       the target's verify forward against its rows (the cost model's calibration), the draft's
                 forward and the per-step work outside the forwards, from the same runs;
  3. search      every k-config within the node budget, ranked by expected speed-up over ar;
  4. check       ar and the chosen tree decode the same prompts, interleaved, in this process: the measured
                 speed-up beside the expected one.
The chosen tree is written as a recipe file (`--out`), which `dynasd recipes --file` turns into a bench spec.
"""
from __future__ import annotations

import argparse
import datetime
import json
import time
from dataclasses import replace
from pathlib import Path

from ..acceptance import acceptance_of
from ..decoders import make_decoder
from ..explorer.costs import cost as cost_model
from ..options import DEFAULT_MAX_NEW_TOKENS, DecoderOptions, add_model_arguments, load_pair_from
from ..prompts import select_prompts
from ..recipes import Recipe
from ..trace import RunTrace, StepTrace
from .tree_search import MAX_BRANCH, acceptance_vector, best_by_budget

MEASURING_TREE = (MAX_BRANCH, 2, 1, 1)  # wide at level 1, so every rank up to MAX_BRANCH is tested there


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--budget", type=int, default=16, help="most tree nodes (verify rows less the root)")
    p.add_argument("--max-depth", type=int, default=8, help="most tree levels (draft forwards a step)")
    p.add_argument("--prompts", required=True, help="prompt file (Spec-Bench JSON Lines or a TriviaQA-style list)")
    p.add_argument("--limit", type=int, default=8, help="first N prompts per category")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-check", action="store_true", help="skip decoding with the chosen tree and ar")
    p.add_argument("--out", default=None, help="write the chosen tree as a recipe file (JSON)")


def _decode(pair, options: DecoderOptions, prompts: list[list[int]], max_new_tokens: int) -> list[RunTrace]:
    return [make_decoder(pair, replace(options, seed=seed)).generate(ids, max_new_tokens)
            for seed, ids in enumerate(prompts)]


def _shape(runs: list[RunTrace], steps: list[StepTrace]) -> cost_model.RunShape:
    """The cost model's averages over `steps` of `runs` taken as one run (speed over the steps' own time, never the
    prefill, as the explorer counts it)."""
    together = RunTrace(**{**runs[0].__dict__, "steps": steps})
    return cost_model.steps_shape(steps, together.summary()["acceptance_rate"])


def execute(args: argparse.Namespace) -> int:
    if not 1 <= args.budget <= 256 or not 1 <= args.max_depth <= 16:
        raise ValueError("--budget must lie in 1..256 and --max-depth in 1..16")
    pair = load_pair_from(args)
    prompts = [pair.encode_prompt(p["text"]) for p in select_prompts([args.prompts], None, args.limit)]
    sampling = dict(temperature=args.temperature)
    started = time.perf_counter()
    measuring = _decode(pair, DecoderOptions(method="mcsd", k_config=MEASURING_TREE, **sampling), prompts,
                        args.max_new_tokens)
    steps = [s for r in measuring for s in r.steps[1:]]  # a run's first step pays warm-up
    p = acceptance_vector(steps)
    if not p:
        raise ValueError(f"too few draft tests to measure acceptance ({len(steps)} steps): give more prompts "
                         "(--limit) or more tokens (--max-new-tokens)")
    shape = _shape(measuring, steps)
    # The target's and the draft's forwards over 1..64 rows timed in the same interleaved rounds: the verify line,
    # and the draft's, which prices each level of a shape by its rows.
    timings, _ = cost_model.measure_models({"target": pair.target, "draft": pair.default_draft()},
                                           cost_model.calibration_context(measuring[-1]), ar_step_of="target")
    costs = cost_model.costs_from(shape, timings["target"], draft_timings=timings["draft"],
                                  ar_step_s=timings[cost_model.AR_STEP][1])
    overhead = shape.overhead_per_node_s
    sweep = best_by_budget(p, costs, args.budget, args.max_depth, overhead)
    best = sweep[-1]
    acceptance = acceptance_of(steps)
    print(f"measured on {len(prompts)} prompts ({time.perf_counter() - started:.0f} s): acceptance vector p_r = "
          + " ".join(f"{v:.2f}" for v in p))
    print(f"  per-position acceptance {' '.join(f'{v:.2f}' for v in acceptance.per_position)}, conditional "
          f"{' '.join(f'{v:.2f}' for v in acceptance.conditional)}")
    print(f"  costs: ar step {costs.ar_s * 1e3:.2f} ms, verify {costs.verify_base_s * 1e3:.2f} ms + "
          f"{costs.verify_per_row_s * 1e3:.3f} ms a row, draft forward {costs.draft_s(1) * 1e3:.2f} ms over one row, "
          f"{costs.draft_s(16) * 1e3:.2f} ms over 16, step overhead {overhead * 1e3:.3f} ms a node")
    print("budget  best shape        nodes  tokens/step  expected speed-up")
    for budget in sorted({b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b <= args.budget} | {args.budget}):
        c = sweep[budget - 1]
        print(f"{budget:6}  {c.text:16}  {c.nodes:5}  {c.tokens_per_step:11.2f}  {c.speedup:.2f}x")
    result = {"shape": best.text, "nodes": best.nodes, "expected_tokens_per_step": best.tokens_per_step,
              "expected_speedup": best.speedup}
    if not args.no_check:
        ar = _decode(pair, DecoderOptions(method="ar", **sampling), prompts, args.max_new_tokens)
        chosen = _decode(pair, DecoderOptions(method="mcsd", k_config=best.branching, **sampling), prompts,
                         args.max_new_tokens)
        ar_speed = _shape(ar, [s for r in ar for s in r.steps]).tokens_per_s
        checked = _shape(chosen, [s for r in chosen for s in r.steps])
        speed, tokens_per_step = checked.tokens_per_s, checked.tokens_per_step
        measured = speed / ar_speed if ar_speed else 0.0
        print(f"checked: mcsd k={best.text} {speed:.1f} tokens/s ({tokens_per_step:.2f} tokens a step), ar "
              f"{ar_speed:.1f} tokens/s: measured {measured:.2f}x, expected {best.speedup:.2f}x")
        result.update(measured_speedup=measured, measured_tokens_per_step=tokens_per_step)
    if args.out:
        recipe = Recipe("best-tree", f"Best static tree for {pair.name} on {pair.device.type} ({best.nodes} nodes, "
                        f"expected {best.speedup:.2f}x ar)", dict(method="mcsd", k_config=best.branching))
        record = {"key": recipe.key, "label": recipe.label, "own": {"method": "mcsd", "k_config": best.text},
                  "pair": pair.name, "device": pair.device.type, "budget": args.budget,
                  "date": datetime.date.today().isoformat(), "acceptance_vector": p, **result}
        Path(args.out).write_text(json.dumps(record, indent=1))
        print(f"wrote {args.out} (bench spec: {recipe.bench_spec()})")
    return 0

