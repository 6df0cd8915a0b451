"""Upper bounds on each method's speedup over ar from one bench run: what if the draft cost nothing, what if only
the target's forwards cost anything.

Why: a speedup goal that even a free draft cannot reach needs a draft that proposes better tokens, not a cheaper
draft or a faster step loop. The bench's summary.json holds, per (method, temperature) over all categories, the
wall time and the seconds spent in draft and target forwards (prefill included), so both bounds follow from the run
itself, on the same machine and prompts:

    measured         = the summary's speedup_vs_ar (method tokens/s / ar tokens/s)
    free draft       = the same with the method's draft forward seconds taken out of its time
    target only      = the same with only the method's target forward seconds as its time (no draft, no host work)

    .venv/bin/python scripts/speedup_bounds.py runs/bench-embedded-cpu
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def speedup_bounds(summary: list[dict]) -> dict[tuple[str, float], dict[str, float]]:
    """Per (method, temperature) with a speedup over ar: the measured speedup and its two bounds. The method's
    tokens stay the same, so taking seconds out of its time scales its speedup by old time / new time."""
    bounds = {}
    for row in summary:
        if row["category"] != "all" or row["speedup_vs_ar"] is None:
            continue
        measured, seconds = row["speedup_vs_ar"], row["seconds"]
        bounds[(row["method"], row["temperature"])] = {
            "measured": measured,
            # the time ratio first: with no draft seconds it is exactly 1, and the bound exactly the measured speedup
            "free_draft": measured * (seconds / (seconds - row["draft_seconds"])),
            "target_only": measured * (seconds / row["verify_seconds"]),
        }
    return bounds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a bench --out folder (reads its summary.json)")
    args = parser.parse_args()
    path = Path(args.run) / "summary.json"
    if not path.is_file():
        print(f"error: no summary.json in {args.run}", file=sys.stderr)
        return 2
    print("| method | T | measured speedup vs ar | bound: free draft | bound: target forwards only |")
    print("|---|---|---|---|---|")
    for (method, temperature), b in speedup_bounds(json.loads(path.read_text())).items():
        print(f"| {method} | {temperature:g} | {b['measured']:.3f}x | {b['free_draft']:.3f}x | "
              f"{b['target_only']:.3f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
