"""The machine a run happens on, in one line: CPU model and the vector features the kernels care about, torch
threads, or the GPU; and for a loaded pair its weights mode and the kernels in use.

Why one owner: speed advice ("fastest with float32 weights on an AVX-512 CPU") can only be read next to the
machine it is about, and the page, every saved trace, `dynasd generate --json` and the bench's meta and report
all name it; written once here, they cannot disagree.
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import weakref

import torch

from .kernels import kernels_in_use
from .kernels.compile import cpu_flags

# The CPU features that decide which kernels run and how fast (dynasd/kernels/), in the order they are named.
NAMED_FEATURES = (("avx512f", "AVX-512"), ("amx_tile", "AMX"), ("avx2", "AVX2"), ("fma", "FMA"), ("asimd", "NEON"))


@functools.cache
def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (or the platform's processor string)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith(("model name", "Model", "cpu model")):
                    return " ".join(line.partition(":")[2].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


@functools.cache
def cpu_features() -> list[str]:
    """The named vector features this CPU has (AVX-512, AMX, AVX2, FMA, NEON); AVX-512 and AVX2 also when absent
    on x86, since 'no AVX-512' is what changes the speed advice."""
    flags = set(cpu_flags().partition(":")[2].split())
    named = [name for flag, name in NAMED_FEATURES if flag in flags]
    if platform.machine() == "x86_64" and "AVX-512" not in named:
        named.insert(0, "no AVX-512")
    return named


def machine_line(device: torch.device | str | None = None) -> str:
    """The machine without a pair: 'Intel Xeon … (AVX-512, AMX, AVX2), 2 threads' or the GPU's name."""
    device = torch.device(device or "cpu")
    if device.type == "cuda" and torch.cuda.is_available():
        return f"GPU {torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    features = ", ".join(cpu_features())
    return (f"{cpu_model()}{f' ({features})' if features else ''}, {torch.get_num_threads()} of "
            f"{os.cpu_count()} threads")


def emulated(device: torch.device | str | None) -> bool:
    """Whether `device` is a GPU that torch only pretends to have: the `spaces` package's CUDA emulation (a ZeroGPU
    Space's serving process, tests/spaces_emulation.py) names a GPU and keeps its "cuda" tensors in host memory, so
    what is timed there is this CPU under another name. Its stand-ins for torch.cuda's functions are the package's
    own (a real ZeroGPU worker restores torch's before it reaches its GPU); a CPU build of torch has no CUDA at
    all."""
    if device is None or torch.device(device).type != "cuda":
        return False
    stand_in = getattr(torch.cuda.is_available, "__module__", "") or ""
    return not torch.backends.cuda.is_built() or stand_in.split(".")[0] == "spaces"


def device_line(pair=None) -> str:
    """The whole line: the machine, and for a loaded pair (dynasd.loading.models.ModelPair) the weights and kernels
    each of its models runs on (dynasd.kernels.kernels_in_use names them, e.g. "GGUF blocks, AVX2 kernels")."""
    if pair is None:
        return machine_line()
    models = [("target", pair.target)] + ([("draft", pair.draft)] if getattr(pair, "draft", None) is not None else [])
    return "; ".join([machine_line(pair.device)] + [f"{role}: {_kernels_of(model)}" for role, model in models])


SHOWN_DEVICE_CHARS = 320  # a device line as a page shows it: the longest real one (~210) whole


def shown_device(line: str) -> str:
    """A device line for the page: whole where it fits SHOWN_DEVICE_CHARS, else cut at a word with an ellipsis.
    Why a bound: a trace loaded from a file or a share link carries its own line, which could be any length."""
    if len(line) <= SHOWN_DEVICE_CHARS:
        return line
    return line[:SHOWN_DEVICE_CHARS].rsplit(" ", 1)[0].rstrip(",;") + " …"


# A loaded model's kernels do not change, and every run's trace names them: walking its modules (~90 us for the
# tiny pair) at every run start cost the statistical tests' thousands of runs a few percent.
_KERNELS_OF: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _kernels_of(model) -> str:
    named = _KERNELS_OF.get(model)
    if named is None:
        named = _KERNELS_OF[model] = kernels_in_use(model)
    return named


def device_key(pair=None) -> str:
    """A short stable name of this machine (its CPU flags included) and pair, for what is kept per device."""
    text = f"{device_line(pair)}|{cpu_flags()}|{getattr(pair, 'name', '')}"
    return hashlib.sha1(text.encode()).hexdigest()[:12]
