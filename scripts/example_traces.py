"""Write the example traces the explorer replays before any model is loaded (assets/examples).

Why recorded runs: a Space's first visitor should see a tree, a mask and a rejection at once, without waiting for
a model to load. Each file is a plain trace (dynasd/trace.py), kept small: a short answer on the embedded pair.

    .venv/bin/python scripts/example_traces.py            # rewrites the shipped examples
"""
from __future__ import annotations

import argparse
from pathlib import Path

from dynasd.decoders import make_decoder
from dynasd.explorer.share import EXAMPLES_DIR
from dynasd.models import load_pair
from dynasd.options import DecoderOptions
from dynasd.trace import save_run

PROMPT = "Explain why the sky is blue in two sentences."
# name -> (options, new tokens): a 44-node tree records ~12 KB a step, so its example stays under ~200 KB
EXAMPLES = {
    "mcsd-greedy": (DecoderOptions(method="mcsd"), 21),  # the default tree
    "sd-sampled": (DecoderOptions(method="sd", gamma=4, temperature=0.8, seed=1), 32),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--out", type=Path, default=EXAMPLES_DIR)
    args = parser.parse_args()
    pair = load_pair(args.pair, device="cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (options, new_tokens) in EXAMPLES.items():
        decoder = make_decoder(pair, options)
        run = decoder.generate(pair.encode_prompt(PROMPT), new_tokens, PROMPT)
        path = args.out / f"{name}.json"
        save_run(run, path)
        print(f"{path}: {len(run.steps)} steps, {path.stat().st_size} bytes: {run.text!r}")


if __name__ == "__main__":
    main()
