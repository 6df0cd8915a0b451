"""Building the engine's C++ kernels on first use, for this CPU, with a fallback where that is not possible.

Why one place: every kernel is built the same way (torch.utils.cpp_extension, -O3 and -march=native, named after
this CPU's instruction set so a cache shared with another CPU rebuilds), and fails the same way (no compiler, no
ninja, DYNASD_COMPILE=0: the caller keeps torch's own products, warned once).
"""
from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
import threading
import warnings
from pathlib import Path
from typing import Callable

_built_lock = threading.Lock()
_built: dict[str, object] = {}


def kernel_once(name: str, source: Path, op: Callable[[], object]):
    """`compiled_op`, built (or found unbuildable, warned once) the first time a process asks for `name`, then the
    same answer every time: each layer of every model asks at load."""
    with _built_lock:
        if name not in _built:
            _built[name] = compiled_op(name, source, op)
        return _built[name]


def compiled_op(name: str, source: Path, op: Callable[[], object]):
    """Build `source` as the extension `name` (once per CPU kind; cached under ~/.cache/torch_extensions) and return
    `op()`, the operator it registers, or None where it cannot be built here."""
    if os.environ.get("DYNASD_COMPILE", "1") == "0":
        return None
    try:
        from torch.utils.cpp_extension import load

        # torch looks for ninja on PATH; the pip-installed one (requirements.txt) sits beside this interpreter,
        # which is not on PATH when the environment is not activated (`.venv/bin/python -m ...`).
        scripts = sysconfig.get_path("scripts")
        if scripts not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = os.pathsep.join(filter(None, [scripts, os.environ.get("PATH")]))
        native = os.uname().machine == "x86_64"
        flags = ["-O3", "-fopenmp"] + (["-march=native"] if native else [])
        load(name=f"{name}_{cpu_tag()}", sources=[str(source)], extra_cflags=flags, is_python_module=False,
             verbose=False)
        return op()
    except Exception as error:  # no compiler, no ninja, a build error: fall back to torch's own products
        warnings.warn(f"dynasd: the compiled kernel {name} is not available ({error!s:.200}); "
                      "using torch's products instead", stacklevel=3)
        return None


@functools.cache
def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next((line for line in info if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def cpu_tag() -> str:
    return hashlib.sha1(f"{os.uname().machine} {cpu_flags()}".encode()).hexdigest()[:10]


def has_avx512() -> bool:
    """Whether this CPU is x86 with AVX-512, for which the kernels keep one 16-float vector per register."""
    return os.uname().machine == "x86_64" and "avx512f" in cpu_flags().split()
