"""How a process that runs passes keeps the memory a pass frees for the next one, and
gives it back when it goes idle (glibc's allocator).

A pass decodes its windows into fresh arrays: about 200 bytes a record for 1-record
batches. By default glibc hands a block of 128 KiB or more back to the kernel when it
is freed (its mmap threshold, which rises to at most 32 MiB as such blocks are freed),
and trims the free top of a heap past twice that threshold; the next pass then takes
every page again, each a page fault and a page zeroed by the kernel. On this project's
2-core machine that was 30,000 faults, and a quarter of the time, of each pass over 500,000
1-record batches after the first. `keep_freed_memory` sets both thresholds
(`M_MMAP_THRESHOLD` to 32 MiB, so a window's arrays come from the heap, and
`M_TRIM_THRESHOLD` to 128 MiB of free top kept per heap), so that consecutive passes
reuse the same pages: a whole `clean` of four such partitions (364 MB) took 0.81 s
instead of 0.92 s (a fresh copy of the dir included), with 63,000 page faults instead
of 136,000 and 17 MiB more at its peak.

What is kept is given back when the process has run no job for `IDLE_SECONDS`
(`IdleRelease`, `malloc_trim`), so a daemon between cycles holds no more than before.

Only glibc has these calls; with another C library (musl) both functions do nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from typing import Final

MMAP_THRESHOLD: Final = 32 * 1024 * 1024
"""Blocks this large or larger are mapped and unmapped on their own (glibc's most for
its own rising threshold): a decoded window's arrays stay below it."""
TRIM_THRESHOLD: Final = 128 * 1024 * 1024
"""Free memory kept at the top of a heap (each thread's arena has its own) while busy:
the decode cache's budget (`cleaner.CACHE_BYTES`), what a pass frees at its end."""
IDLE_SECONDS: Final = 5.0
"""How long a process runs no job before it gives the kept memory back: passes of one
cycle follow each other at once, cycles are seconds apart."""

_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
"""`mallopt` parameters (glibc's malloc.h)."""


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library, when it is glibc (it names its version; musl does not)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
    except (ValueError, OSError):
        return None
    libc = ctypes.CDLL(None)
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc


@functools.cache
def keep_freed_memory() -> bool:
    """Keep what a pass frees for the next (see the module docstring), once per process;
    whether the allocator took it."""
    libc = _glibc()
    if libc is None:
        return False
    # Each on its own: a glibc that refuses one (a smaller heap, on 32 bits) takes the other.
    mapped = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    trimmed = libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return bool(mapped) and bool(trimmed)


def release_freed_memory() -> None:
    """Give the free memory of every heap back to the kernel (`malloc_trim(0)`)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


class IdleRelease:
    """Calls `release` once `delay` seconds have passed since the last job ended with no
    job running: `busy()` when a job starts, `idle()` when it ends (jobs may overlap)."""

    def __init__(
        self, delay: float = IDLE_SECONDS, release: Callable[[], None] = release_freed_memory
    ) -> None:
        self._delay = delay
        self._release = release
        self._lock = threading.Lock()
        self._running = 0
        self._timer: threading.Timer | None = None

    def busy(self) -> None:
        with self._lock:
            self._running += 1
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def idle(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running > 0:
                return
            # A daemon thread: a one-shot command exits without waiting for it.
            timer = threading.Timer(self._delay, self._fire)
            timer.daemon = True
            timer.name = "cleanerd-heap-release"
            try:
                timer.start()
            except RuntimeError:  # no thread to be had (a task limit): give it back now
                self._release()
                return
            self._timer = timer

    def _fire(self) -> None:
        with self._lock:
            if self._running or self._timer is not threading.current_thread():
                return  # a job started after this timer fired, before it took the lock
            self._timer = None
        self._release()
