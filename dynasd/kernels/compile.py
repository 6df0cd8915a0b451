"""Building the engine's C++ kernels on first use, for this CPU, with a fallback where that is not possible.

Why one place: every kernel is built the same way (torch.utils.cpp_extension, -O3, the variant's instruction set)
and fails the same way (no compiler, no ninja, DYNASD_COMPILE=0: the caller keeps torch's own products, warned
once).

Variants: each kernel's source holds an AVX-512 and an AVX2 variant (the build flags choose), and which one a
process uses is decided here only, by `kernel_variant()`, from this CPU's features: AVX-512 where it has AVX-512,
else AVX2 (with FMA and F16C: x86-64-v3), else none (ARM and older x86: the engine keeps float32 weights and torch's
products). $DYNASD_KERNEL_VARIANT (avx512, avx2 or torch) overrides it, for tests and benchmarks: an AVX-512 CPU
runs the AVX2 variant too. Each variant registers its operators under its own namespace (dynasd_avx2, ...), so one
process can load both.

Why not torch's own cache (~/.cache/torch_extensions): its builds are guarded by a `lock` file that only the
builder deletes, so an interrupted build (Ctrl-C, a killed process, two checkouts rebuilding at once) left every
later model load waiting for it forever, silently. Here no process can leave a state that another one waits on:
  - a library is published whole or not at all: it is built in a private folder beside the cache and renamed into
    place (`<name>-<key>.so`, the key a hash of the source text, the flags, this CPU, torch and Python), so a process
    that finds it loads it without building or locking, and a changed source builds anew;
  - builds of one library are serialised by `flock` on `<name>-<key>.lock`, which the kernel drops when its holder
    dies; the holder writes its pid there for the message of whoever waits;
  - the compiler runs in a child process that ends with its parent, and waiting plus building is bounded
    (DYNASD_KERNEL_BUILD_TIMEOUT seconds, else BUILD_TIMEOUT_S): past it the build is killed and the engine goes on with
    torch's products, saying so in one line.
The cache folder is $DYNASD_KERNEL_CACHE, else `kernels` in dynasd's cache folder (~/.cache/dynasd/kernels).
`dynasd build-kernels` builds the engine's kernels ahead of time (`make setup` runs it).
"""
from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..loading.embedded import cache_dir

BUILD_TIMEOUT_S = 300.0  # waiting for another build plus building; ~15 s per kernel on an idle machine
LOCK_POLL_S = 0.1
STOP_GRACE_S = 2.0  # between asking a build to stop (ninja then stops its compilers) and killing it

_built_lock = threading.Lock()
_built: dict[str, object] = {}


class KernelUnavailable(Exception):
    """The kernel cannot be built here; the message says why, in one line."""


class KernelBuildTimeout(KernelUnavailable):
    """Waiting for the build lock and building took longer than the bound."""


@dataclass(frozen=True)
class KernelLibrary:
    path: Path
    built: bool  # False: found in the cache, built earlier


def kernel_once(name: str, source: Path, op: Callable[[str], object], variant: str | None = None):
    """The engine kernel `name`'s operator `op(variant)` in `variant` (default: the one this process uses,
    `kernel_variant()`), or None where there is none or it cannot be built here: built (or found unbuildable,
    warned once) the first time a process asks for it, then the same answer every time: each layer of every model
    asks at load."""
    variant = variant or kernel_variant()
    if variant is None:
        return None
    with _built_lock:
        if (name, variant) not in _built:
            _built[name, variant] = compiled_op(name, source, lambda: op(variant), variant)
        return _built[name, variant]


def compiled_op(name: str, source: Path, op: Callable[[], object], variant: str | None = None):
    """Build `source` as the library `name` in `variant` (once per source text and CPU kind, see the module's
    docstring), load it and return `op()`, the operator it registers, or None where it cannot be built here."""
    if os.environ.get("DYNASD_COMPILE", "1") == "0":
        return None
    try:
        library = build_kernel(name, source, variant=variant)
        import torch

        torch.ops.load_library(str(library.path))
        return op()
    except KernelBuildTimeout as error:  # one line, not a warning's two: this one is expected on a busy machine
        sys.stderr.write(f"dynasd: {error}; using torch's products instead\n")
        return None
    except Exception as error:  # no compiler, no ninja, a build error: fall back to torch's own products
        warnings.warn(f"dynasd: the compiled kernel {name} is not available ({error!s:.200}); "
                      "using torch's products instead", stacklevel=3)
        return None


# ---------------------------------------------------------------------------------------------------------------
# the cache

def kernel_cache() -> Path:
    return Path(os.environ["DYNASD_KERNEL_CACHE"]).expanduser() if os.environ.get("DYNASD_KERNEL_CACHE") \
        else cache_dir() / "kernels"


def build_flags(variant: str | None = None) -> list[str]:
    """The compiler's flags for `variant` (None: a plain build for this CPU, as for a kernel without variants)."""
    if variant is None:
        return ["-O3", "-fopenmp"] + (["-march=native"] if os.uname().machine == "x86_64" else [])
    return ["-O3", "-fopenmp", *VARIANT_FLAGS[variant]]


def library_name(name: str, variant: str | None = None) -> str:
    """The library's own name (one per variant: two libraries of one name would be one to the dynamic loader)."""
    return name if variant is None else f"{name}_{variant}"


def library_path(name: str, source: Path, variant: str | None = None) -> Path:
    """Where the library built from `source`'s text lives: anything that changes the binary changes the key, so a
    checkout with other sources (or headers beside them), another CPU kind or another torch never loads a library
    that does not fit."""
    key = hashlib.sha256()
    headers = [header.read_bytes() for header in sorted(Path(source).parent.glob("*.h"))]  # what it may include
    for part in [Path(source).read_bytes(), *headers, " ".join(build_flags(variant)).encode(), cpu_tag().encode(),
                 _torch_version().encode(), sys.implementation.cache_tag.encode()]:
        key.update(hashlib.sha256(part).digest())
    return kernel_cache() / f"{library_name(name, variant)}-{key.hexdigest()[:16]}.so"


def _torch_version() -> str:
    """Read from the package's metadata: a process that finds its libraries built need not import torch to say so."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        import torch

        return torch.__version__


def build_timeout_s() -> float:
    value = os.environ.get("DYNASD_KERNEL_BUILD_TIMEOUT", "")
    try:
        return float(value) if value else BUILD_TIMEOUT_S
    except ValueError:
        raise KernelUnavailable(f"DYNASD_KERNEL_BUILD_TIMEOUT={value!r} is not a number of seconds") from None


# ---------------------------------------------------------------------------------------------------------------
# building

def build_kernel(name: str, source: Path, timeout_s: float | None = None, variant: str | None = None
                 ) -> KernelLibrary:
    """The library built from `source` (in `variant`): found in the cache, or built now under the build lock within
    `timeout_s` (default: `build_timeout_s()`), all waiting included. Raises KernelUnavailable (KernelBuildTimeout)
    saying why not."""
    timeout_s = build_timeout_s() if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    library = library_path(name, source, variant)
    name = library_name(name, variant)
    if library.exists():
        return KernelLibrary(library, built=False)
    library.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(library.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _take_lock(lock, library, deadline):
            if library.exists():  # built by the lock's holder while this process waited
                return KernelLibrary(library, built=False)
            raise KernelBuildTimeout(f"the kernel {name} was not built within {timeout_s:g} s (the build of process "
                                     f"{_lock_owner(lock)} holds its lock; DYNASD_KERNEL_BUILD_TIMEOUT sets the bound)")
        if library.exists():
            return KernelLibrary(library, built=False)
        _remove_leftover_builds(library)
        _run_build(name, Path(source), library, lock, deadline, timeout_s, build_flags(variant))
        return KernelLibrary(library, built=True)
    finally:
        os.close(lock)  # drops the lock


def _take_lock(lock: int, library: Path, deadline: float) -> bool:
    """Whether this process holds the build lock before `deadline`; False at once when another process publishes
    the library meanwhile."""
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
        else:
            _write_owner(lock, str(os.getpid()))
            return True
        if library.exists() or time.monotonic() >= deadline:
            return False
        time.sleep(LOCK_POLL_S)


def _write_owner(lock: int, owner: str) -> None:
    os.ftruncate(lock, 0)
    os.pwrite(lock, f"{owner}\n".encode(), 0)


def _lock_owner(lock: int) -> str:
    return os.pread(lock, 64, 0).decode(errors="replace").split(" ")[0].strip() or "unknown"


def _remove_leftover_builds(library: Path) -> None:
    """Private build folders whose owner is gone: every one of this library (its lock is ours, so nobody builds it
    now) and those of other libraries whose loader no longer runs."""
    for folder in library.parent.glob("*.build-*"):
        owner = folder.name.rpartition(".build-")[2].split("-")[0]
        if folder.name.startswith(f"{library.stem}.build-") or not process_runs(owner):
            shutil.rmtree(folder, ignore_errors=True)


def process_runs(pid: str) -> bool:
    """Whether the process `pid` (text, as a private folder's name carries it) still runs: its folder is not
    abandoned. Also read by converted.py."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _run_build(name: str, source: Path, library: Path, lock: int, deadline: float, timeout_s: float,
               flags: list[str]) -> None:
    """Build in a private folder, in a child process bounded by `deadline`, then publish by an atomic rename."""
    # torch looks for ninja on PATH; the pip-installed one (requirements.txt) sits beside this interpreter, which is
    # not on PATH when the environment is not activated (`.venv/bin/python -m ...`). The builder inherits it.
    scripts = sysconfig.get_path("scripts")
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join(filter(None, [scripts, os.environ.get("PATH")]))
    folder = Path(tempfile.mkdtemp(prefix=f"{library.stem}.build-{os.getpid()}-", dir=library.parent))
    try:
        with open(folder / "build.log", "wb") as log:
            wall_deadline = time.time() + (deadline - time.monotonic())
            builder = subprocess.Popen(builder_command(name, source, folder, wall_deadline, flags), cwd=folder,
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)  # its own process group, stopped as a whole
        _write_owner(lock, f"{os.getpid()} {builder.pid}")
        try:
            returncode = builder.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _stop(builder)
            raise KernelBuildTimeout(f"the kernel {name} was not built within {timeout_s:g} s (the compiler did not "
                                     "finish; DYNASD_KERNEL_BUILD_TIMEOUT sets the bound)") from None
        except BaseException:  # Ctrl-C: the build does not outlive the process that asked for it
            _stop(builder)
            raise
        built = folder / f"{name}.so"
        if returncode != 0 or not built.exists():
            raise KernelUnavailable(f"the build failed: {_build_error(folder / 'build.log')}")
        os.replace(built, library)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _stop(builder: subprocess.Popen) -> None:
    for sig, wait_s in [(signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, None)]:
        try:
            os.killpg(builder.pid, sig)
        except ProcessLookupError:
            pass
        try:
            builder.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _build_error(log: Path) -> str:
    """The compiler's first error, else the log's last line."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return next((line for line in lines if "error:" in line), lines[-1] if lines else "no output")


# The builder: torch's extension build into the private folder (it also loads the library, so one whose symbols do
# not resolve is never published). A watchdog ends the build with its process group (ninja then stops its
# compilers) when the loader that started it dies or the deadline passes, so no build runs on for nobody.
_BUILDER = """
import os, signal, sys, threading, time
name, source, folder, parent, deadline, *flags = sys.argv[1:]

def watch():
    while os.getppid() == int(parent) and time.time() < float(deadline):
        time.sleep(0.2)
    os.killpg(0, signal.SIGTERM)

threading.Thread(target=watch, daemon=True).start()
from torch.utils.cpp_extension import load
load(name=name, sources=[source], build_directory=folder, extra_cflags=flags, is_python_module=False)
"""


def builder_command(name: str, source: Path, folder: Path, deadline: float, flags: list[str] | None = None
                    ) -> list[str]:
    """The child process that builds `source` into `folder / f"{name}.so"` by `deadline` (time.time())."""
    return [sys.executable, "-c", _BUILDER, name, str(source), str(folder), str(os.getpid()), str(deadline),
            *(build_flags() if flags is None else flags)]


# ---------------------------------------------------------------------------------------------------------------
# this CPU

@functools.cache
def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next((line for line in info if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def cpu_tag() -> str:
    return hashlib.sha1(f"{os.uname().machine} {cpu_flags()}".encode()).hexdigest()[:10]


# ---------------------------------------------------------------------------------------------------------------
# the variant: decided here, from the CPU's features

VARIANTS = ("avx512", "avx2")  # fastest first
# The kernels' sources read the instruction set from the compiler's own macros, which these flags set
# (kernel_common.h: DYNASD_ISA_AVX512), and name their operators' namespace after it (dynasd_avx2, ...).
VARIANT_FLAGS = {"avx512": ["-march=native"],
                 # x86-64-v3: AVX2, FMA, F16C. Tuned for this CPU, but no AVX-512 even where it has it.
                 "avx2": ["-march=x86-64-v3", "-mtune=native"]}
VARIANT_NEEDS = {"avx512": {"avx512f", "avx2", "fma", "f16c"}, "avx2": {"avx2", "fma", "f16c"}}
VARIANT_LABELS = {"avx512": "AVX-512", "avx2": "AVX2"}
# block_vnni.h's test of the build's instruction set (__AVX512VNNI__ and __AVX512BW__), as /proc/cpuinfo names it:
# the AVX-512 variant is built for this CPU (-march=native), so it multiplies 8-bit activations with VNNI where
# the CPU has these.
VNNI_NEEDS = {"avx512_vnni", "avx512bw"}
VARIANT_ENV = "DYNASD_KERNEL_VARIANT"
NO_VARIANT = "torch"  # $DYNASD_KERNEL_VARIANT's word for "no compiled kernels": float32 weights, torch's products
_told_variant: set[str] = set()


def runnable_variants() -> tuple[str, ...]:
    """The kernel variants this CPU can execute, fastest first (none off x86)."""
    if os.uname().machine != "x86_64":
        return ()
    flags = set(cpu_flags().split())
    return tuple(variant for variant in VARIANTS if VARIANT_NEEDS[variant] <= flags)


def multiplies_with_vnni(variant: str | None) -> bool:
    """Whether `variant`'s 8-bit-activation products use VNNI on this CPU (block_vnni.h; bitwise the same results
    as without, only faster): a device line says so."""
    return variant == "avx512" and VNNI_NEEDS <= set(cpu_flags().split())


def kernel_variant() -> str | None:
    """The kernel variant this process uses: $DYNASD_KERNEL_VARIANT where this CPU runs it, else the fastest this
    CPU runs; None where it runs none (the engine then keeps float32 weights and torch's products). A value this
    CPU cannot run is said once on stderr, and the automatic choice used."""
    runnable = runnable_variants()
    automatic = runnable[0] if runnable else None
    asked = os.environ.get(VARIANT_ENV, "").strip().lower()
    if asked in ("", "auto"):
        return automatic
    if asked == NO_VARIANT:
        return None
    if asked in runnable:
        return asked
    if asked not in _told_variant:
        _told_variant.add(asked)
        choices = ", ".join((*runnable, NO_VARIANT))
        sys.stderr.write(f"dynasd: {VARIANT_ENV}={asked} is not a kernel variant this CPU runs ({choices}); "
                         f"using {automatic or NO_VARIANT}\n")
    return automatic
