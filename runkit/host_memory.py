"""The process's heap: whether freed host memory is kept for reuse or handed back to the system.

glibc's malloc serves a block of 32 MB or more (and smaller ones until its adaptive threshold has grown) with a
fresh ``mmap`` and unmaps it at ``free``. A training step on a CPU allocates and frees many such blocks every pass
(a chunk of full-vocabulary logits, a weight's gradient), so each one comes back as new pages that the kernel
faults in and zeroes one by one. Measured on SmolLM2-135M-Instruct on 2 cores (one optimise phase of the real-model
benchmark's batch, ``benchmarks/profile_step.py`` against ``--no-keep-freed-memory``): 10.31 s against 11.19 s in
float32 and 5.05 s against 6.99 s in bfloat16 (before the output layer's own backward, ``llm.tensors.logprobs``, which
allocates less, 11.6 s against 20.2 s and 5.1 s against 10.5 s). ``keep_freed_memory`` turns both off: large
blocks come from the heap like small ones and freed memory stays in the process for the next pass. The resident
set then stays near its peak instead of falling between passes; ``release_freed_memory`` still returns the free
pages on demand. Elsewhere than glibc both are no-ops.

Kept freed memory fragments: a pass's large blocks differ in size from micro-batch to micro-batch (sequences of
different lengths), a small block that outlives its pass pins the heap above a freed one, and the heap grows with
the number of micro-batches, so with the batch (docs/memory.md). ``FreedMemoryCeiling`` bounds it by the pass.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Iterable, Iterator
from typing import TypeVar

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


def resident_bytes() -> int:
    """The process's resident set now (``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class FreedMemoryCeiling:
    """Kept freed memory, bounded by the pass: ``start`` (once, before the first step) switches the ceiling on;
    ``pass_start`` (before a pass's first micro-batch) takes the resident set as the pass's base;
    ``micro_batch_done`` (after each micro-batch; ``micro_batches`` makes the three calls around a pass's loop) notes that micro-batch's growth and releases the freed pages once
    the resident set is more than ``factor`` times the largest such growth (over the run) above the base; ``pass_end``
    releases them after a pass of more than one micro-batch. Within a pass the micro-batches reuse each other's
    freed blocks (the speed keeping freed memory is for); across passes of different shapes they could not, and the
    heap would grow with the number of micro-batches. A pass in one micro-batch (a whole step at once, the default)
    never releases: the next step's same pass reuses its blocks as they are. Off (``factor`` 0, or not started):
    no-ops."""

    def __init__(self) -> None:
        self.factor = 0.0
        self.base = self.last = self.largest = 0
        self.micro_batches = 0
        self.releases = 0

    def start(self, factor: float) -> None:
        self.factor = factor

    def pass_start(self) -> None:
        if self.factor > 0:
            self.base = self.last = resident_bytes()
            self.micro_batches = 0

    def micro_batch_done(self) -> None:
        if self.factor <= 0 or not self.base:
            return
        self.micro_batches += 1
        now = resident_bytes()
        self.largest = max(self.largest, now - self.last)
        self.last = now
        if self.largest and now - self.base > self.factor * self.largest:
            self._release()

    def pass_end(self) -> None:
        if self.factor > 0 and self.base and self.micro_batches > 1:
            self._release()

    def _release(self) -> None:
        release_freed_memory()
        self.releases += 1
        self.base = self.last = resident_bytes()


T = TypeVar("T")

#: The process's ceiling (one heap per process): the trainer starts it before its first step when it keeps freed
#: memory.
CEILING = FreedMemoryCeiling()


def micro_batches(items: Iterable[T]) -> Iterator[T]:
    """The micro-batches of one pass, under the process's ceiling: ``CEILING.pass_start`` before the first,
    ``micro_batch_done`` after each and ``pass_end`` after the last (``for mb in micro_batches(parts): ...``)."""
    CEILING.pass_start()
    for item in items:
        yield item
        CEILING.micro_batch_done()
    CEILING.pass_end()
