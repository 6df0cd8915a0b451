"""The cost table quiet and with a planted load: does load move it, and is a loaded measurement refused?

Why: the explorer's expected speed-ups all read one kept table of forward costs per device and pair
(dynasd/explorer/costs/cost.py). On a shared CPU another process can slow the measurement down; such a measurement
must either stay close to a quiet one or be refused (the quiet table kept). This measures the table in
interleaved rounds as the explorer does, quiet, then with `--busy` busy loops at `nice -n 0` running beside it,
then quiet again, and prints for each the one-row forward, the cost of a row beyond it (the fitted line), the cores
other processes used meanwhile and whether the measurement counts as busy (and so would be refused).

    .venv/bin/python scripts/cost_under_load.py --pair embedded --busy 1
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch

from dynasd.explorer.costs import cost
from dynasd.loading.models import load_pair
from dynasd.speed.step_cost import fit_line

BUSY_LOOP = "import time\nend = time.time() + 600\nwhile time.time() < end:\n    pass\n"


def measure(pair, context: list[int], rounds: int) -> tuple[float, float, cost.Conditions]:
    timings, conditions = cost.measure_models({"target": pair.target}, context, rounds=rounds)
    target = timings["target"]
    _, per_row = fit_line([float(r) for r in target], list(target.values()))
    return target[1], per_row, conditions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="embedded", help="the model pair (tiny-random: a check that it runs)")
    parser.add_argument("--busy", type=int, default=1, help="busy loops planted beside the loaded measurement")
    parser.add_argument("--rounds", type=int, default=cost.CALIBRATION_ROUNDS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--settle", type=float, default=2.0, help="seconds the loops run before measuring")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(args.pair, device="cpu")
    context = pair.encode_prompt("Explain how the water cycle works and why it matters for farming.") * 8
    measure(pair, context, 1)  # warm-up: first forwards pay for allocation
    rows = []
    for label in ("quiet", f"{args.busy} busy loop(s)", "quiet again"):
        loops = []
        if label.startswith(str(args.busy)) and args.busy:
            loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(args.busy)]
            time.sleep(args.settle)
        try:
            rows.append((label, *measure(pair, context, args.rounds)))
        finally:
            for loop in loops:
                loop.kill()
                loop.wait()
    quiet_one, quiet_row = rows[0][1], rows[0][2]
    print(f"{args.pair} pair, {args.threads} threads, {args.rounds} interleaved rounds (the explorer's calibration)")
    print("| measurement | one-row forward (ms) | vs quiet | a row beyond it (ms) | vs quiet | other processes "
          "(cores) | verdict |")
    print("|---|---|---|---|---|---|---|")
    for label, one, row, conditions in rows:
        busy = conditions.busy_because()
        others = "unknown" if conditions.others is None else f"{conditions.others:.2f}"
        print(f"| {label} | {one * 1e3:.2f} | {one / quiet_one:.2f}x | {row * 1e3:.3f} | "
              f"{row / quiet_row if quiet_row else float('nan'):.2f}x | {others} | "
              f"{'busy: refused, the kept quiet table stays' if busy else 'quiet: kept'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
