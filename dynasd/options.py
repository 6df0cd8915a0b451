"""Options shared by the commands: which model pair to load, and how."""
from __future__ import annotations

import argparse

from .models import load_pair


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pair", default=None, help="embedded (default), tiny-random, or a preset name")
    p.add_argument("--target", default=None, help="target model: hub id, local folder or .gguf file")
    p.add_argument("--draft", default=None, help="draft model: hub id, local folder or .gguf file")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    p.add_argument("--dtype", default="auto", help="fp32 (default), bf16 or fp16")


def load_pair_from(args: argparse.Namespace, fast_kernels: bool = True, compiled_kernel: bool = True):
    return load_pair(args.pair, args.target, args.draft, device=args.device, dtype=args.dtype,
                     fast_kernels=fast_kernels, compiled_kernel=compiled_kernel)
