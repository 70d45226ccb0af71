"""glibc's allocator set to keep the memory a training step frees (:func:`keep_freed_memory`).

A CPU worker's step allocates its activations and gradients (MBs each) and frees them all by the
end of the backward pass. With glibc's defaults the freed top of the heap goes back to the kernel
whenever it exceeds the trim threshold, a threshold glibc moves by itself as large blocks come and
go (``mallopt(3)``: the dynamic mmap threshold); how much goes back each step then depends on the
process's allocation history (its imports, the order of its first steps), and every page given
back is faulted in and zeroed again in the next forward pass: thousands of page faults per step,
a few per cent of a ResNet step's CPU time, differing between otherwise identical processes.

Fixing both thresholds (allocations up to 32 MiB from the heap, up to 1 GiB of freed memory kept)
makes the step reuse its memory: after the first steps it faults no page in. The cost is memory
the process already held at its peak, kept (at most 1 GiB beyond it, never reused by others).
Set once per process by :class:`elastic_ring.worker.api.Job` on CPU workers; a process whose
allocator settings were chosen by the user (``MALLOC_*`` or ``GLIBC_TUNABLES`` in its environment,
another allocator preloaded) is left as it is, as is a C library other than glibc.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Mapping

M_TRIM_THRESHOLD = -1  # mallopt(3)'s parameters (glibc's <malloc.h>)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks above it are mmap'ed (and unmapped when freed)
TRIM_THRESHOLD = 1 << 30  # freed memory kept at the heap's top before it goes back to the kernel
USER_KEYS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
             "MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "LD_PRELOAD")


def _glibc() -> Any:
    """The process's C library where it is glibc (it has ``mallopt`` and ``gnu_get_libc_version``):
    the symbols the process already has, found without a search (``ctypes.util.find_library`` would
    run ``ldconfig`` in a child process)."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None


def keep_freed_memory(env: Mapping[str, str] | None = None, libc: Any = None) -> bool:
    """Fix glibc's mmap and trim thresholds in this process (see the module docstring); returns
    whether both were set. Nothing is changed where ``env`` (default: this process's) holds an
    allocator setting of the user's, or where the C library is not glibc (``libc``: passed in
    by tests)."""
    env = os.environ if env is None else env
    if any(env.get(k) for k in USER_KEYS):
        return False
    libc = _glibc() if libc is None else libc
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
