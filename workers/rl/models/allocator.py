"""Freed tensors go back to the operating system: glibc's malloc told to keep large blocks in mappings of their own.

torch allocates CPU tensors with malloc. glibc maps a block above its threshold (128 KiB at first) on its own and
unmaps it when it is freed, but every such free raises the threshold to that block's size, up to 32 MiB: from then
on tensors of those sizes come from the heaps of its arenas (one per thread that allocates: the engine's, the
trainer's, the rollout and evaluation threads), and a freed one stays in the process. A run allocates and frees
tensors of ever-changing sizes (KV caches that grow a column a token and shrink as rows finish, micro-batches as
wide as their longest sequence), so the heaps fragment and each arena keeps its high-water mark. In the embedded
demo (`manage.py bench memory`, 200 steps) the web process held 1.2-1.5 GB, half of it free (malloc_trim gave it
back), and grew 9.7% per 100 steps; with the threshold fixed at 1 MiB it held 0.7-0.8 GB and grew 3.3%.

A fixed threshold (mallopt M_MMAP_THRESHOLD, as the MALLOC_MMAP_THRESHOLD_ variable would set it) also stops the
raising. Elsewhere than glibc (musl, macOS) nothing is changed.

Blocks under the threshold still fragment the arenas' heaps: with the threshold fixed, `bench memory`'s web process
read its threads' arenas growing by about 32 MB per 100 steps (/proc/PID/smaps, 64 MiB-aligned heaps) while the
main heap and the large mappings stayed flat. glibc hands a heap's free pages back only from its top, or when
malloc_trim walks every arena (`give_back_free_heap_pages`, asked at each training step's end: about 1 ms when little
was freed since the last, 28 ms after 80k allocations by four threads on a loaded 2-core machine). It trims at most
once every TRIM_INTERVAL_SECONDS: trimming at every step made the tiny Llama's GRPO step (`bench trainer --workloads
tiny`) 0.22 s instead of 0.19 s; a fragment the trim waits a few seconds for is not growth.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading
import time

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
LARGE_BLOCK_BYTES = 1 << 20  # 1 MiB: a KV cache or an activation; small tensors and Python objects stay in heaps
TRIM_INTERVAL_SECONDS = 5.0
_done = threading.Event()
_last_trim = [float("-inf")]  # monotonic time of the last malloc_trim


def return_freed_tensors_to_the_os() -> bool:
    """Fix glibc's mmap threshold for this process (once). Returns whether it is fixed."""
    if _done.is_set():
        return True
    libc = _glibc()
    if libc is None or libc.mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES) != 1:
        return False
    _done.set()
    return True


def give_back_free_heap_pages(*, at_most_every: float = TRIM_INTERVAL_SECONDS) -> bool:
    """Return the free pages inside every malloc arena's heaps to the operating system (glibc's malloc_trim), unless
    the last trim was less than `at_most_every` seconds ago. Returns whether it trimmed."""
    libc = _glibc()
    now = time.monotonic()
    if libc is None or now - _last_trim[0] < at_most_every:
        return False
    _last_trim[0] = now
    libc.malloc_trim(0)
    return True


@functools.cache
def _glibc():
    name = ctypes.util.find_library("c")
    if not name:
        return None
    libc = ctypes.CDLL(name)
    return libc if hasattr(libc, "gnu_get_libc_version") else None  # musl's mallopt changes nothing
