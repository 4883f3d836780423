# cython: language_level=3
"""Keeps the arenas of Python's small-object allocator (pymalloc) that a worker frees, for its
next split, instead of handing them back to the kernel.

pymalloc takes its memory in arenas (1 MiB on CPython 3.10+) straight from `mmap`, not from
malloc, so `batch.memory`'s malloc thresholds do not reach it: when a split's rows are freed,
every arena left empty is unmapped, and the next split maps them again and faults each 4 KiB page
in (the kernel zeroes it): ~8,000 faults per 14,000 events, ~1 µs of system CPU per event.

`install(capacity)` wraps the interpreter's arena allocator (`PyObject_SetArenaAllocator`): a
freed arena is kept (up to `capacity` of them) and handed out again by the next arena
allocation; beyond that, and for an allocation of another size, the interpreter's own allocator
runs. Arenas allocated before `install` are freed through the same wrapper: every arena has the
one size the interpreter uses, so a kept arena is interchangeable with a new one, and whatever
leaves the cache goes back through the interpreter's own `free` with its size. pymalloc does not
rely on an arena's memory being zeroed (it formats each pool as it first uses it).

The interpreter sends other blocks through the same allocator (its frame stacks, 16 KiB on 3.11):
only blocks of at least `_MIN_ARENA` bytes are taken for arenas, so the cache learns the arena
size from the first arena freed, whatever was freed before it.

pymalloc calls the arena allocator with the GIL held (it is not thread-safe), so the cache needs
no lock of its own, in a process with one GIL: a free-threaded build calls it without one (its
threads' frame stacks), so `install` refuses to run there; subinterpreters with GILs of their own
(3.12+) would share it too, and executors run none.
"""

import sys

from libc.stdlib cimport malloc


cdef extern from "Python.h":
    ctypedef struct PyObjectArenaAllocator:
        void *ctx
        void* (*alloc)(void *ctx, size_t size) noexcept nogil
        void (*free)(void *ctx, void *ptr, size_t size) noexcept nogil
    void PyObject_GetArenaAllocator(PyObjectArenaAllocator *allocator)
    void PyObject_SetArenaAllocator(PyObjectArenaAllocator *allocator)


cdef PyObjectArenaAllocator _system  # the interpreter's own, wrapped
cdef void **_kept = NULL
cdef size_t _count = 0  # arenas in _kept
cdef size_t _capacity = 0
cdef size_t _size = 0  # the arena size, learned from the first free
cdef size_t _reused = 0
cdef size_t _returned = 0
cdef size_t _MIN_ARENA = 256 * 1024  # pymalloc's arenas: 256 KiB before 3.10, 1 MiB since


cdef void* _alloc(void *ctx, size_t size) noexcept nogil:
    global _count, _reused
    if _count and size == _size:
        _count -= 1
        _reused += 1
        return _kept[_count]
    return _system.alloc(_system.ctx, size)


cdef void _free(void *ctx, void *ptr, size_t size) noexcept nogil:
    global _count, _size, _returned
    if _size == 0 and size >= _MIN_ARENA:
        _size = size
    if _count < _capacity and size == _size:
        _kept[_count] = ptr
        _count += 1
        return
    _returned += 1
    _system.free(_system.ctx, ptr, size)


def install(size_t capacity) -> bool:
    """Keeps up to `capacity` freed arenas in this process from now on; once (a second call
    changes nothing and returns False)."""
    global _kept, _capacity
    if _kept != NULL or capacity == 0:
        return False
    if hasattr(sys, "_is_gil_enabled") and not sys._is_gil_enabled():
        return False  # no GIL to keep the cache's updates apart (module docstring)
    _kept = <void**>malloc(capacity * sizeof(void*))
    if _kept == NULL:
        return False
    _capacity = capacity
    cdef PyObjectArenaAllocator wrapper
    PyObject_GetArenaAllocator(&_system)
    wrapper.ctx = NULL
    wrapper.alloc = _alloc
    wrapper.free = _free
    PyObject_SetArenaAllocator(&wrapper)
    return True


def stats() -> dict:
    """What the cache did: arenas kept now, reused, handed back to the system; its capacity and
    the arena size (0 until the first free)."""
    return {"kept": _count, "reused": _reused, "returned": _returned, "capacity": _capacity, "arena_size": _size}
