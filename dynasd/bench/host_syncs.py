"""Host reads per decoding step: how often a step waits for a device value (`.item()`, `.tolist()`, `float(t)`, ...).

Why: on a GPU each such read is a synchronisation; the device's queue drains and the launch overhead of the next
kernels is no longer hidden. A step whose reads grow with the number of tree nodes pays that per node. This counts
them, by patching torch.Tensor's reading methods while steps run, so the number is measured, not guessed.

    python -m dynasd.bench.host_syncs --pair tiny-random --device cpu --methods mcsd,sd:gamma=4

On CPU every read is counted (the count of the code path a GPU run takes, plus reads of tensors a GPU run keeps
on the host anyway); with --device cuda only reads of CUDA tensors count: those are the real synchronisations.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import torch

from ..decoders import make_decoder
from ..loading.models import ModelLoadError, ModelPair, load_pair
from ..options import DEFAULT_MAX_NEW_TOKENS, DecoderOptions
from .specs import decoder_options, parse_methods, parse_temperatures

# The Tensor methods that hand a device value to Python; each is a synchronisation when the tensor is on a GPU.
READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__")


@contextmanager
def count_host_reads(device_type: str | None = None) -> Iterator[Counter]:
    """Counts, by method name, the host reads of tensors on `device_type` (None: every tensor) inside the block,
    `.to()` onto the CPU from another device included."""
    counts: Counter = Counter()
    originals = {name: getattr(torch.Tensor, name) for name in READS + ("to",)}

    def counted(name, original):
        def read(self, *args, **kwargs):
            if device_type is None or self.device.type == device_type:
                counts[name] += 1
            return original(self, *args, **kwargs)
        return read

    def counted_to(original):
        def to(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            if (isinstance(result, torch.Tensor) and result.device.type == "cpu" and self.device.type != "cpu"
                    and (device_type is None or self.device.type == device_type)):
                counts["to(cpu)"] += 1
            return result
        return to

    for name in READS:
        setattr(torch.Tensor, name, counted(name, originals[name]))
    torch.Tensor.to = counted_to(originals["to"])
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def reads_per_step(pair: ModelPair, options: DecoderOptions, prompt: str, steps: int = 4,
                   max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> list[dict]:
    """Host reads of each of the first `steps` steps of one run (the prefill in `start` is not counted), with the
    step's node count: the reads per node show whether a cost grows with the tree."""
    decoder = make_decoder(pair, options)
    decoder.start(pair.encode_prompt(prompt), max_new_tokens)
    device_type = None if pair.device.type == "cpu" else pair.device.type
    counted = []
    while not decoder.done and len(counted) < steps:
        with count_host_reads(device_type) as counts:
            step = decoder.step()
        counted.append({"step": step.index, "nodes": len(step.nodes), "reads": sum(counts.values()),
                        "by_method": dict(sorted(counts.items()))})
    return counted


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", default="tiny-random")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--methods", default="sd:gamma=4,mcsd")
    p.add_argument("--temperatures", default="0,0.7")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompt", default="Explain why the sky is blue in two sentences.")
    args = p.parse_args(argv)
    try:
        specs = parse_methods(args.methods)
        temperatures = parse_temperatures(args.temperatures)
        pair = load_pair(args.pair, device=args.device, dtype=args.dtype)
    except (ValueError, ModelLoadError) as exc:
        print(f"host_syncs: {exc}", file=sys.stderr)
        return 2
    for spec in specs:
        if spec.method == "hf-assisted":
            continue  # transformers' own loop, not a Decoder
        for temperature in temperatures:
            options = decoder_options(DecoderOptions(temperature=temperature), spec)
            rows = reads_per_step(pair, options, args.prompt, args.steps)
            print(json.dumps({"pair": args.pair, "device": args.device, "dtype": args.dtype, "method": spec.label,
                              "temperature": temperature, "steps": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
