"""Splitting rotated logs into byte ranges that executors read themselves.

Executors open the logs directly (like Spark's own text source, the files must be reachable at
the same path from every executor: one machine, or a shared filesystem). Reading in Python skips
the JVM's decoding of every line and its conversion to Arrow and back, which cost more per event
than the step chain itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MIN_SPLIT_BYTES = 4 * 1024 * 1024
MAX_SPLIT_BYTES = 64 * 1024 * 1024
READ_BUFFER = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Split:
    """Lines of `path` that start at a byte offset in [start, end)."""

    path: str
    start: int
    end: int

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def key(self) -> str:
        """The split's name in load markers: `<log name>@<start>-<end>` (boundaries are a function
        of the log alone, so a rerun cuts the same splits: `plan_splits`)."""
        return f"{self.name}@{self.start}-{self.end}"


def plan_splits(logs: list[Path], parallelism: int, max_bytes: int = MAX_SPLIT_BYTES) -> list[Split]:
    """Cuts the logs into splits of about the same size, at most `max_bytes` and (unless a log is
    smaller) at least 4 MB: at least two per core, as many as makes whole waves of tasks, so that
    no core is left with a long last task while the others wait.

    Splits come in the order of `logs`, then of offsets: task ids follow the order of the events.
    """
    sizes = [p.stat().st_size for p in logs]
    cores = max(1, parallelism)
    count = max(2 * cores, -(-sum(sizes) // max_bytes))
    count = -(-count // cores) * cores
    size = max(-(-sum(sizes) // count), min(MIN_SPLIT_BYTES, max_bytes))
    splits = []
    for path, total in zip(logs, sizes, strict=True):
        # Equal pieces of each log rather than full ones and a small remainder.
        step = max(1, -(-total // max(1, -(-total // size))))
        for start in range(0, total, step):
            splits.append(Split(str(path), start, min(start + step, total)))
    return splits


def read_split(split: Split) -> Iterator[bytes]:
    """The lines (without line endings, empty ones skipped) that start inside the split."""
    with open(split.path, "rb", buffering=READ_BUFFER) as file:
        position = split.start
        if position > 0:
            # The line running into the split belongs to the previous one: skip to its end.
            file.seek(position - 1)
            position += len(file.readline()) - 1
        while position < split.end:
            line = file.readline()
            if not line:
                return
            position += len(line)
            line = line.rstrip(b"\r\n")
            if line:
                yield line
