"""Upper bounds on each method's speedup over ar from one bench run: what if the draft cost nothing, what if only
the target's forwards cost anything.

Why: a speedup goal that even a free draft cannot reach needs a draft that proposes better tokens, not a cheaper
draft or a faster step loop. The bench records, per (prompt, method), the wall time and the seconds spent in draft
and target forwards (prefill included), so both bounds follow from the run itself, on the same machine and prompts:

    measured         = method tokens/s / ar tokens/s   (the bench's own speedup_vs_ar)
    free draft       = the same with the method's draft forward seconds taken out of its time
    target only      = the same with only the method's target forward seconds as its time (no draft, no host work)

    .venv/bin/python scripts/speedup_bounds.py runs/bench-s12-lean-t0
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def speedup_bounds(runs: list[dict]) -> dict[tuple[str, float], dict[str, float]]:
    """Per (method, temperature): the measured speedup over ar and its two bounds, in tokens per second summed over
    the prompts (as the bench's own speedup), for temperatures at which ar ran the same number of prompts."""
    totals: dict[tuple[str, float], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for run in runs:
        total = totals[(run["method"], run["temperature"])]
        total["tokens"] += run["new_tokens"]
        total["seconds"] += run["seconds"]
        total["draft"] += run["draft_forward_seconds"]
        total["target"] += run["target_forward_seconds"]
        total["prompts"] += 1
    bounds = {}
    for (method, temperature), total in totals.items():
        ar = totals.get(("ar", temperature))
        if ar is None or ar["prompts"] != total["prompts"]:
            continue
        ar_rate = ar["tokens"] / ar["seconds"]
        bounds[(method, temperature)] = {
            "measured": total["tokens"] / total["seconds"] / ar_rate,
            "free_draft": total["tokens"] / (total["seconds"] - total["draft"]) / ar_rate,
            "target_only": total["tokens"] / total["target"] / ar_rate,
        }
    return bounds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a bench --out folder (reads its runs.jsonl)")
    args = parser.parse_args()
    path = Path(args.run) / "runs.jsonl"
    if not path.is_file():
        print(f"error: no runs.jsonl in {args.run}", file=sys.stderr)
        return 2
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print("| method | T | measured speedup vs ar | bound: free draft | bound: target forwards only |")
    print("|---|---|---|---|---|")
    for (method, temperature), b in speedup_bounds(runs).items():
        print(f"| {method} | {temperature:g} | {b['measured']:.3f}x | {b['free_draft']:.3f}x | "
              f"{b['target_only']:.3f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
