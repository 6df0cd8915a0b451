"""`dynasd build-kernels`: build the engine's compiled kernels ahead of time (`make setup` runs it), so that the
first model load does not compile. A module of its own: it names every kernel, and the kernels' modules import
compile.py."""
from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import block_weights, fast_linear
from .compile import VARIANT_LABELS, VARIANTS, KernelUnavailable, build_kernel, kernel_variant, multiplies_with_vnni


def engine_kernels() -> dict[str, Path]:
    return {module.KERNEL_NAME: module.KERNEL_SOURCE for module in (fast_linear, block_weights)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bound and the cache folder come from the environment, as for a model load."""
    parser.add_argument("--all", action="store_true",
                        help="build them even on a CPU whose loads do not use them (neither AVX-512 nor AVX2): the "
                             "AVX2 variant, which such a CPU cannot run")


def execute(args: argparse.Namespace) -> int:
    """Build every engine kernel now, one line each, in the kernels' order; a kernel that cannot be built is not an
    error (the engine uses torch's products instead), so setup goes on.

    Why at once: each build is one compiler process that spends ~15-20 s reading torch's headers, so on two cores
    the two kernels are built in the time of one (a fresh machine's `make setup`: 37 s of builds -> ~20 s)."""
    kernels = engine_kernels()
    with ThreadPoolExecutor(max_workers=max(1, min(len(kernels), os.cpu_count() or 1))) as pool:
        states = list(pool.map(lambda item: _build_state(args, *item), kernels.items()))
    for name, state in zip(kernels, states):
        print(f"{name}: {state}", flush=True)
    return 0


def _build_state(args: argparse.Namespace, name: str, source: Path) -> str:
    """What became of the kernel `name`, as its line says it."""
    start = time.monotonic()
    if os.environ.get("DYNASD_COMPILE", "1") == "0":
        return "unavailable (DYNASD_COMPILE=0)"
    variant = kernel_variant() or (VARIANTS[-1] if args.all else None)  # the last variant needs the least
    if variant is None:  # no load asks for them here (compile.kernel_variant)
        return "not needed on this CPU (neither AVX-512 nor AVX2: the engine uses torch's products)"
    try:
        library = build_kernel(name, source, variant=variant)
    except (KernelUnavailable, OSError) as error:
        return f"unavailable ({error!s:.300})"
    state = f"built in {time.monotonic() - start:.0f} s" if library.built else "already built"
    vnni = " (8-bit products with VNNI)" if name == block_weights.KERNEL_NAME and multiplies_with_vnni(variant) else ""
    return f"{state}, {VARIANT_LABELS[variant]} variant{vnni} ({library.path})"
