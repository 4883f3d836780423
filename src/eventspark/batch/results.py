"""What one Spark task hands back to the driver: typed, small, and never events.

A task returns one `TaskResult` (pickled by Spark): counts per (log, destination, table), the
chunks it staged with their BatchHeaders, the splits it wrote directly into their tables, the
pairs whose staging or writing failed, a sample for the events cache and the ids users
recognition saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eventspark.destinations.base import StagedChunk
from eventspark.steps.recognition import Sightings
from eventspark.steps.typing import BatchHeader


@dataclass(slots=True)
class PairCount:
    """Events of one (log, destination, table) in a task (table '': skipped, template failures,
    unreadable lines)."""

    file: str
    dest_id: str
    table: str
    rows: int = 0
    failed: int = 0
    skipped: int = 0
    spool: str | None = None
    """The file of this pair's failed events (one JSON line each), fsynced; None without any."""


@dataclass(slots=True)
class StagedResult:
    """One chunk a task staged for the driver to commit."""

    dest_id: str
    table: str
    chunk: StagedChunk
    header: BatchHeader
    bucket: int | None = None
    """Task commits of a table with a primary key: the key bucket of every row of the chunk."""


@dataclass(slots=True)
class DirectResult:
    """One split a task wrote straight into a destination's tables (committed with its markers)."""

    dest_id: str
    split: str
    """`Split.key`."""
    file: str
    rows: dict[str, int] = field(default_factory=dict)
    """Table → rows written."""


@dataclass(slots=True)
class TaskResult:
    """The one result of a task (`batch.partition.process_splits`)."""

    counts: list[PairCount] = field(default_factory=list)
    staged: list[StagedResult] = field(default_factory=list)
    direct: list[DirectResult] = field(default_factory=list)
    staged_splits: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    """(destination id, table) of `JobPlan.task_commits` → the keys of the splits whose rows this
    task's chunks of the pair hold: their markers, committed with the chunks (`batch.commits`)."""
    errors: dict[tuple[str, str], str] = field(default_factory=dict)
    """(destination id, table) → why staging or writing failed: the pair is not committed."""
    samples: list[tuple[str, str, str]] = field(default_factory=list)
    """(log, destination id, sampled event's JSON) for the events cache (`ops.cache_results`)."""
    sightings: dict[str, Sightings] = field(default_factory=dict)
    """Users recognition: per destination, the ids this task saw."""
