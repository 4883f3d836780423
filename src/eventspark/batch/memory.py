"""Keeping a Python worker's freed memory for its next chunk (glibc only).

A task buffers chunks of tens of MB and frees them once staged. By default glibc hands such
memory back to the kernel (blocks over 128 KiB to 32 MiB are mmap'ed, the heap top is trimmed),
so the next chunk faults every page in again: about 3 µs per 4 KiB page on a VM, a few percent of
a pass. `keep_freed_memory` makes blocks up to 256 MiB come from the heap and trims the heap only
above 1 GiB free, for the process it runs in: called by each executor task (once per worker
process), never for the JVM. Elsewhere (musl, macOS) that part does nothing.

Python's small objects (a row's strings, lists, dicts) do not come from malloc but from pymalloc's
1 MiB arenas, mapped and unmapped by the interpreter itself: for them `keep_freed_memory` also
keeps up to `ARENAS_KEPT` freed arenas for the next split (`speedups/_arenas.pyx`, where it is
built): ~8,000 page faults per 14,000 events less, about a tenth of an executor's CPU per event.
"""

from __future__ import annotations

import ctypes
import logging

from eventspark import speedups

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLDS = (256 * 1024 * 1024, 32 * 1024 * 1024)
"""Tried in turn: glibc before 2.35 refuses more than 32 MiB (HEAP_MAX_SIZE / 2) on 64 bits."""
TRIM_THRESHOLD = 1024 * 1024 * 1024
ARENAS_KEPT = 128
"""Freed pymalloc arenas (1 MiB each) a worker keeps: above the ~30–60 a 16 MiB split's rows take."""

_done: bool | None = None


def keep_freed_memory() -> bool:
    """Sets this process's malloc thresholds (once); True when glibc took them."""
    global _done
    if _done is None:
        _done = _set_thresholds()
        _keep_arenas()
    return _done


def _keep_arenas() -> None:
    arenas = speedups.load("arenas")
    if arenas is not None:
        arenas.install(ARENAS_KEPT)


def _set_thresholds() -> bool:
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    if not any(mallopt(_M_MMAP_THRESHOLD, size) for size in MMAP_THRESHOLDS):
        log.debug("malloc refused every mmap threshold; freed chunk memory goes back to the kernel")
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
