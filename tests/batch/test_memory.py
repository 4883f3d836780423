"""keep_freed_memory: a worker reuses freed chunk memory (malloc's and pymalloc's arenas) instead of
faulting it in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.compiled import compiled

PROBE = """
import resource, sys
from eventspark.batch.memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
faults = []
for _round in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer = bytearray()
    for _row in range(50_000):  # a 90 MB chunk of JSON lines
        buffer += b"x" * 1800
    del buffer
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults[1])
"""


def _second_chunk_faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_second_chunk_reuses_the_memory_of_the_first() -> None:
    assert _second_chunk_faults("default") > 10_000  # ~22k pages faulted in again
    assert _second_chunk_faults("keep") < 1_000


ARENAS_PROBE = """
import resource, sys
from eventspark.speedups import _arenas
capacity = int(sys.argv[1])
if capacity:
    assert _arenas.install(capacity)
    assert not _arenas.install(capacity)  # once per process
faults = []
for _round in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    rows = [[str(i) * 4, float(i), {"k": str(i)}] for i in range(200_000)]  # small objects: pymalloc
    assert sum(len(row[0]) for row in rows) > 0
    del rows
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
stats = _arenas.stats() if capacity else {}
print(faults[-1], stats.get("kept", 0), stats.get("reused", 0), stats.get("returned", 0))
"""


def _arenas_run(capacity: int) -> list[int]:
    compiled("arenas")  # fails, not skips, when the module is not built
    done = subprocess.run(
        [sys.executable, "-c", ARENAS_PROBE, str(capacity)], capture_output=True, text=True, check=True
    )
    return [int(word) for word in done.stdout.split()]


def test_freed_pymalloc_arenas_are_kept_for_the_next_split() -> None:
    faults, *_ = _arenas_run(0)
    assert faults > 5_000  # pymalloc unmaps emptied arenas: the next round faults its pages in again
    faults, kept, reused, returned = _arenas_run(256)
    assert faults < 1_000 and reused > 50 and kept > 0 and returned == 0


def test_arenas_beyond_the_capacity_go_back_to_the_system() -> None:
    faults, kept, reused, returned = _arenas_run(4)
    assert kept == 4 and returned > 50 and reused >= 4
    assert faults > 5_000  # a cache too small to matter: the rest is faulted in as before


def test_an_executor_task_keeps_arenas() -> None:
    script = (
        "from eventspark.batch.memory import keep_freed_memory, ARENAS_KEPT\n"
        "from eventspark.speedups import _arenas\n"
        "keep_freed_memory()\n"
        "assert _arenas.stats()['capacity'] == ARENAS_KEPT, _arenas.stats()\n"
    )
    compiled("arenas")
    subprocess.run([sys.executable, "-c", script], check=True)


def test_the_arena_size_is_learned_from_an_arena_not_a_frame_stack() -> None:
    # The interpreter frees its frame stacks (16 KiB) through the same allocator: a deep call
    # returning before the first arena is freed must not make the cache keep 16 KiB blocks only.
    script = (
        "from eventspark.speedups import _arenas\n"
        "assert _arenas.install(128)\n"
        "def deep(n):\n"
        "    return 0 if n == 0 else deep(n - 1) + 1\n"
        "deep(900)\n"
        "rows = [str(i) * 4 for i in range(300_000)]\n"
        "del rows\n"
        "stats = _arenas.stats()\n"
        "assert stats['arena_size'] >= 256 * 1024 and stats['kept'] > 0, stats\n"
    )
    compiled("arenas")
    subprocess.run([sys.executable, "-c", script], check=True)
