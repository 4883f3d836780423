"""Splitting rotated logs into byte ranges that executors read themselves.

Executors open the logs directly: under `log.path` (like Spark's own text source, the files must be
reachable at the same path from every executor: one machine, or a shared filesystem), or on
object storage with `log.remote` (`read_remote_split`: each executor reads its byte ranges). Reading in Python skips
the JVM's decoding of every line and its conversion to Arrow and back, which cost more per event
than the step chain itself.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import accumulate, pairwise
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from eventspark.logs.store import LogFile, RemoteReader

SPLIT_BYTES = 16 * 1024 * 1024
"""The size of a split (the last one of a log or of a gap is smaller): read by `plan_splits` at
each call, so tests may make it smaller."""
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


def plan_splits(
    logs: list[Path] | list[LogFile], known: Mapping[str, Iterable[tuple[int, int]]] | None = None
) -> list[Split]:
    """Cuts each log into ceil(size / SPLIT_BYTES) equal splits: a function of the log alone (not
    of the parallelism or of the other logs of the pass), so that a rerun after a crash cuts the
    same splits and finds their load markers.

    `known`: log name → (start, end) of splits that have load markers already (`Split.key`s read
    by the driver); they are kept as they are, so a change of SPLIT_BYTES across an upgrade never
    cuts a committed split differently. The gaps between them are cut at the rule's boundaries for
    the whole log: a pass that knows the markers of some destinations only (the others not due)
    cuts the splits the others wrote exactly as they were, never across them. A known range that
    overlaps an earlier one or runs past the end of its log is not kept.

    Splits come in the order of `logs`, then of offsets: task ids follow the order of the events.
    """
    splits: list[Split] = []
    for item in logs:
        name, total, where = _located(item)
        cuts = _cuts(total)
        position = 0
        for start, end in sorted((known or {}).get(name, ())):
            if start < position or end > total or end <= start:
                continue
            splits += _gap(where, position, start, cuts)
            splits.append(Split(where, start, end))
            position = end
        splits += _gap(where, position, total, cuts)
    return splits


def _located(item: Path | LogFile) -> tuple[str, int, str]:
    """(name, size, location) of a local path or a listed `LogFile` (local or on object storage)."""
    if isinstance(item, Path):
        return item.name, item.stat().st_size, str(item)
    return item.name, item.size, item.location


def _cuts(size: int) -> range:
    """The inner boundaries of [0, size) cut in ceil(size / SPLIT_BYTES) pieces of equal size (the
    last one maybe smaller)."""
    if size <= 0:
        return range(0)
    step = -(-size // -(-size // SPLIT_BYTES))
    return range(step, size, step)


def _gap(path: str, start: int, end: int, cuts: range) -> list[Split]:
    """[start, end) cut at the boundaries of `cuts` inside it."""
    if end <= start:
        return []
    inner = [cut for cut in cuts if start < cut < end]
    bounds = [start, *inner, end]
    return [Split(path, low, high) for low, high in pairwise(bounds)]


def split_range(key: str) -> tuple[str, int, int]:
    """(log name, start, end) of a `Split.key`; ValueError when `key` is not one."""
    name, at, span = key.rpartition("@")
    start, dash, end = span.partition("-")
    if not (name and at and dash and start.isdigit() and end.isdigit()):
        raise ValueError(f"not a split key: {key!r}")
    return name, int(start), int(end)


def group_splits(splits: list[Split], cores: int, per_core: int) -> list[list[Split]]:
    """Consecutive splits grouped into at most `per_core` tasks per core, each group one task,
    cut so that the cores finish together: Spark starts the tasks in order on the first core
    free, and the job waits for the last one. Fourteen equal splits in eight tasks of one or two
    (`parallelize`'s even count) keep one of two cores busy a split longer than the other, an
    eighth of the stage. Of the task counts that are multiples of `cores` (or one split per task
    when fewer), cutting groups of about equal bytes (or of equal counts, as `parallelize`, which
    the cut by bytes misses now and then when split sizes vary: never later than it), the largest
    that finishes within 1 % of the earliest: more tasks let Spark even out cores that run at
    different speeds, and a smaller count gains less than a task costs.

    Groups stay consecutive: task ids follow the order of the events (`PartitionTask.seq`)."""
    if not splits:
        return []
    cores = max(1, cores)
    counts = sorted({min(len(splits), cores * n) for n in range(1, max(1, per_core) + 1)}, reverse=True)
    cuts = [
        (_finish(groups, cores), groups)
        for count in counts
        for groups in (_even_groups(splits, count), _count_groups(splits, count))
    ]
    earliest = min(finish for finish, _groups in cuts)
    return next(groups for finish, groups in cuts if finish <= earliest + earliest // 100)


def _even_groups(splits: list[Split], count: int) -> list[list[Split]]:
    """`splits` cut into `count` non-empty consecutive groups, each cut at the split boundary
    nearest to an even share of the bytes."""
    ends = list(accumulate(s.end - s.start for s in splits))
    total = ends[-1]
    cuts = [0]
    for group in range(1, count):
        target = total * group / count
        low, high = cuts[-1] + 1, len(splits) - (count - group)  # leave a split for each group after
        at = min(max(bisect_left(ends, target) + 1, low), high)
        if at > low and abs(ends[at - 2] - target) <= abs(ends[at - 1] - target):
            at -= 1  # the boundary before is nearer
        cuts.append(at)
    cuts.append(len(splits))
    return [splits[start:end] for start, end in pairwise(cuts)]


def _count_groups(splits: list[Split], count: int) -> list[list[Split]]:
    """`splits` cut into `count` consecutive groups of about equal counts (`parallelize`'s cut)."""
    return [splits[group * len(splits) // count : (group + 1) * len(splits) // count] for group in range(count)]


def _finish(groups: list[list[Split]], cores: int) -> int:
    """When the last of `groups` ends (in bytes read per core), each started in order on the core
    free first."""
    free = [0] * cores
    for group in groups:
        heapq.heappush(free, heapq.heappop(free) + sum(s.end - s.start for s in group))
    return max(free)


def read_split(split: Split) -> Iterator[bytes]:
    """The lines (without line endings, empty ones skipped) that start inside the split."""
    with open(split.path, "rb", buffering=READ_BUFFER) as file:
        yield from split_lines(file, split.start, split.end)


def read_remote_split(split: Split, reader: RemoteReader) -> Iterator[bytes]:
    """`read_split` of a log on object storage (`log.remote`): the executor reads the split's
    byte range itself, plus the end of its last line, through `reader`'s filesystem."""
    with reader.open(split.path) as file:
        yield from split_lines(file, split.start, split.end)


def split_lines(file: BinaryIO, start: int, end: int) -> Iterator[bytes]:
    """The lines of `file` that start at an offset in [start, end): the line running into `start`
    belongs to the split before, the line running past `end` to this one."""
    position = start
    if position > 0:
        # The line running into the split belongs to the previous one: skip to its end.
        file.seek(position - 1)
        position += len(file.readline()) - 1
    while position < end:
        line = file.readline()
        if not line:
            return
        position += len(line)
        line = line.rstrip(b"\r\n")
        if line:
            yield line
