"""`dynasd build-kernels`: build the engine's compiled kernels ahead of time (`make setup` runs it), so that the
first model load does not compile. A module of its own: it names every kernel, and the kernels' modules import
compile.py."""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from . import block_weights, fast_linear
from .compile import KernelUnavailable, build_kernel, has_avx512


def engine_kernels() -> dict[str, Path]:
    return {module.KERNEL_NAME: module.KERNEL_SOURCE for module in (fast_linear, block_weights)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bound and the cache folder come from the environment, as for a model load."""
    parser.add_argument("--all", action="store_true",
                        help="build them even on a CPU whose loads do not use them (no AVX-512)")


def run(args: argparse.Namespace) -> int:
    """Build every engine kernel now, one line each; a kernel that cannot be built is not an error (the engine uses
    torch's products instead), so setup goes on."""
    for name, source in engine_kernels().items():
        start = time.monotonic()
        if os.environ.get("DYNASD_COMPILE", "1") == "0":
            print(f"{name}: unavailable (DYNASD_COMPILE=0)")
            continue
        if not (args.all or has_avx512()):  # no load asks for them here (fast_linear.kernel_pays_here, plan_for)
            print(f"{name}: not needed on this CPU (no AVX-512: the engine uses torch's products)")
            continue
        try:
            library = build_kernel(name, source)
        except (KernelUnavailable, OSError) as error:
            print(f"{name}: unavailable ({error!s:.300})")
            continue
        state = f"built in {time.monotonic() - start:.0f} s" if library.built else "already built"
        print(f"{name}: {state} ({library.path})", flush=True)
    return 0
