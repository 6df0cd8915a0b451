"""Write the draft's held-out training prompts as a Spec-Bench-style file, so `bench` can run on them.

Why: Spec-Bench measures speculation on prompts unlike the draft's training data; the held-out prompts
(`train-draft` kept them out of training) show what the same draft gives on prompts like those it learned from.
One category per held-out file (e.g. heldout = TriviaQA/PIQA, heldout-self = self-instruct).

    .venv/bin/python scripts/heldout_bench_prompts.py --data runs/distill4/data --out runs/heldout-prompts.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dynasd.loading.models import load_pair
from dynasd.training.sequences import load_sequences
from dynasd.training.task_prompts import user_message


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="embedded", help="whose tokenizer wrote the held-out prompts")
    parser.add_argument("--data", required=True, help="a train-draft data folder with heldout*.jsonl")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    tokenizer = load_pair(args.pair, device="cpu").tokenizer
    rows = []
    for path in sorted(Path(args.data).glob("heldout*.jsonl")):
        for i, seq in enumerate(load_sequences([path])):
            text = user_message(tokenizer, seq.ids[:seq.answer_start])
            if text:
                rows.append({"question_id": f"{path.stem}-{i}", "category": path.stem, "turns": [text]})
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} prompts in {len(set(r['category'] for r in rows))} categories -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
