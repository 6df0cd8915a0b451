"""Write the example traces the explorer replays before any model is loaded (assets/examples).

Why recorded runs: a Space's first visitor should see a tree, a mask and a rejection at once, without waiting for
a model to load. Each file is a plain trace (dynasd/trace.py), kept small: a short answer on the embedded pair.

    .venv/bin/python scripts/example_traces.py            # rewrites the shipped examples
"""
from __future__ import annotations

import argparse
from pathlib import Path

from dynasd.decoders import make_decoder
from dynasd.explorer.sessions.share import EXAMPLES_DIR
from dynasd.loading.models import load_pair
from dynasd.options import DecoderOptions
from dynasd.trace import save_run

PROMPT = "Explain why the sky is blue in two sentences."
# The two sides of speculation on a CPU (docs/benchmarks.md, "Where speculation pays on a CPU, and where it loses"):
# prompt lookup on a prompt the answer copies from, and the default wide tree on free writing.
COPYING_PROMPT = ("Rewrite this paragraph with every sentence in the past tense and change nothing else: The library "
                  "opens at nine in the morning. Students come in with their laptops and look for a quiet table near "
                  "the windows. The librarian checks the returned books and puts them back on the shelves. At noon "
                  "the reading room is full, and everyone works in silence until the bell rings at five.")
FREE_PROMPT = "Write a short poem about the sea at night."
# name -> (options, new tokens, prompt): a 44-node tree records ~12 KB a step, so its example stays under ~200 KB
EXAMPLES = {
    "mcsd-greedy": (DecoderOptions(method="mcsd"), 21, PROMPT),  # the default tree
    "sd-sampled": (DecoderOptions(method="sd", gamma=4, temperature=0.8, seed=1), 32, PROMPT),
    "pld-copying-pays": (DecoderOptions(method="pld"), 64, COPYING_PROMPT),
    "mcsd-wide-tree-loses": (DecoderOptions(method="mcsd"), 16, FREE_PROMPT),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--out", type=Path, default=EXAMPLES_DIR)
    parser.add_argument("--only", nargs="+", choices=sorted(EXAMPLES), help="write these examples only")
    args = parser.parse_args()
    pair = load_pair(args.pair, device="cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (options, new_tokens, prompt) in EXAMPLES.items():
        if args.only and name not in args.only:
            continue
        decoder = make_decoder(pair, options)
        run = decoder.generate(pair.encode_prompt(prompt), new_tokens, prompt)
        path = args.out / f"{name}.json"
        save_run(run, path)
        print(f"{path}: {len(run.steps)} steps, {path.stat().st_size} bytes: {run.text!r}")


if __name__ == "__main__":
    main()
