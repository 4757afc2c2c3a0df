"""The process's heap: whether freed host memory is kept for reuse or handed back to the system.

glibc's malloc serves a block of 32 MB or more (and smaller ones until its adaptive threshold has grown) with a
fresh ``mmap`` and unmaps it at ``free``. A training step on a CPU allocates and frees many such blocks every pass
(a chunk of full-vocabulary logits, a weight's gradient), so each one comes back as new pages that the kernel
faults in and zeroes one by one. Measured on SmolLM2-135M-Instruct on 2 cores (one optimise phase of the real-model
benchmark's batch, ``benchmarks/profile_step.py`` against ``--no-keep-freed-memory``): 10.31 s against 11.19 s in
float32 and 5.05 s against 6.99 s in bfloat16 (before the output layer's own backward, ``llm.logprobs``, which
allocates less, 11.6 s against 20.2 s and 5.1 s against 10.5 s). ``keep_freed_memory`` turns both off: large
blocks come from the heap like small ones and freed memory stays in the process for the next pass. The resident
set then stays near its peak instead of falling between passes; ``release_freed_memory`` still returns the free
pages on demand. Elsewhere than glibc both are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

#: ``mallopt`` parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
#: The largest trim threshold ``mallopt`` takes (a C int): the heap's top is never trimmed at ``free``.
NEVER_TRIM = 2**31 - 1


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def keep_freed_memory() -> bool:
    """From now on, serve every block from the heap (no ``mmap`` per large block) and keep freed memory in the
    process (no trim of the heap's top at ``free``). Returns whether the allocator took both settings (False where
    the C library is not glibc)."""
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))


def release_freed_memory() -> None:
    """Hand the heap memory freed since the last call back to the system (glibc's ``malloc_trim``; elsewhere a
    no-op). A CPU sync's transfer buffers are freed but stay resident otherwise: measured on SmolLM2-135M-Instruct,
    the process holds 0.67 GB less after the first sync and 1.1 GB less after the second
    (``benchmarks/sampler_memory.py``). Pages handed back are faulted in again when the heap reuses them."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
