"""Memory the engine has freed, handed back to the system."""
from __future__ import annotations

import ctypes
import functools


@functools.cache
def _libc():
    try:
        return ctypes.CDLL("libc.so.6")  # glibc (Linux); elsewhere nothing is done
    except OSError:
        return None


def can_return_freed_memory() -> bool:
    """Whether this process's C library hands freed heap back on request (glibc's malloc_trim)."""
    return getattr(_libc(), "malloc_trim", None) is not None


def return_freed_memory() -> None:
    """Hand the memory freed while swapping layers back to the system. glibc keeps freed heap memory for reuse, and
    after one large block is freed it serves blocks up to that size from the heap too (its sliding threshold), so a
    load's intermediate copies stayed in the process: ~50-130 MB of the embedded pair's."""
    malloc_trim = getattr(_libc(), "malloc_trim", None)
    if malloc_trim is not None:
        malloc_trim(0)
