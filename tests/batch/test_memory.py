"""keep_freed_memory: a worker reuses freed chunk memory instead of faulting it in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
