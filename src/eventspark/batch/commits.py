"""Task commits (`Capabilities.task_commits`): the staged rows of a pass committed per Spark task,
in parallel, rather than all of a pair's rows in one serial commit on one connection.

The driver patches each table first (under its lock, `batch.load.patch_pair`), then the rows
each task staged for a table are committed on their own: one INSERT ... SELECT of the task's
chunks with one load marker per split whose rows they hold (`<log>@<start>-<end>`, as direct
writes mark theirs), in one transaction. A rerun after a crash finds the markers of the units
that committed and does not write their splits again (`JobPlan.split_done`); the others are
written again, whole. The work of a commit is the warehouse's (the INSERT ... SELECT runs on the
server): the driver only sends a statement per unit, on as many connections as the pass has
commit workers, so what stays serial on the driver grows with the tasks, not with the events.

A table with a primary key (`Capabilities.keyed_task_commits`): upserts of one key must be in one
statement, its last row winning, so the units are not the tasks' but key buckets: executors cut
their staged rows by a hash of the key (`bucket_rows`), and each bucket's chunks, from every
task, are one upsert. Buckets carry no marker: a unit that commits again after a crash writes the
same rows over themselves (the rerun reads the logs again, and upserts are idempotent); once every
bucket of a pair committed, the driver writes the logs' markers, so that a later pass (a give-up
among them) knows the pair is in the table.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from threading import Lock, local
from types import TracebackType
from typing import Any

from eventspark.destinations import build_destination
from eventspark.destinations.base import DestinationAdapter, DestinationError, Load, StagedChunk
from eventspark.steps.diff import Table
from eventspark.steps.typing import DataType

log = logging.getLogger(__name__)

MAX_KEY_BUCKETS = 8
"""Key buckets at most, whatever the connections: each flush of a keyed table writes a staging
table per bucket it holds rows of, and each bucket's upsert drops its chunks (a lock each) in its
transaction; beyond a few buckets a key's upserts gain nothing the warehouse's cores would give."""


@dataclass(slots=True)
class TaskUnit:
    """The chunks one task staged for one pair, and the splits whose rows they hold."""

    chunks: list[StagedChunk]
    splits: list[str]


DEFAULT_CONNECTIONS = 16
"""Commit connections of a pass when `spark.commit_connections` is 0: the job's parallelism, this
many at most (a server's connections are few: Postgres allows 100 by default)."""


def key_buckets(connections: int) -> int:
    """The buckets keyed rows are cut into for `connections` commit connections."""
    return max(1, min(connections, MAX_KEY_BUCKETS))


def bucket_rows(
    rows: list[list[Any]], keys: Sequence[int], buckets: int, types: Sequence[DataType | None] = ()
) -> dict[int, list[list[Any]]]:
    """Rows by the bucket of their key (the values at `keys`, of stage types `types`): a stable
    hash of the key's text, so that every executor puts a key in the same bucket whatever the type
    its values were staged in (1, "1" and 1.0 are one key once cast to the column's type; so are
    True and "true", and the RFC 3339 texts of one instant, staged as timestamps or as strings).
    Two keys in one bucket cost nothing; one key in two buckets would race its upserts."""
    if buckets <= 1:
        return {0: rows}
    stamps = [index for index, data_type in zip(keys, types, strict=False) if data_type is DataType.TIMESTAMP]
    cut: list[list[list[Any]]] = [[] for _ in range(buckets)]
    crc32 = zlib.crc32
    if len(keys) == 1 and not stamps:  # the common key: one column, its text as it is (the hot loop)
        index = keys[0]
        for row in rows:
            value = row[index]
            text = value if type(value) is str and not _stamp_like(value) else _key_text(value)
            cut[crc32(text.encode("utf-8", "surrogatepass")) % buckets].append(row)
    else:
        for row in rows:
            text = "\x1f".join(_timestamp_text(row[i]) if i in stamps else _key_text(row[i]) for i in keys)
            cut[crc32(text.encode("utf-8", "surrogatepass")) % buckets].append(row)
    return {bucket: found for bucket, found in enumerate(cut) if found}


def _key_text(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return _timestamp_text(value) if _stamp_like(value) else value
    if kind is bool:
        return "true" if value else "false"
    if kind is float and value.is_integer():
        return str(int(value))
    return str(value)


def _stamp_like(text: str) -> bool:
    """Cheaply: might `text` be an RFC 3339 timestamp (`YYYY-MM-DDTHH:MM:SS...`)?"""
    return len(text) >= 19 and text[4] == "-" and text[10] in "Tt " and text[13] == ":"


def _timestamp_text(value: Any) -> str:
    """One text for every spelling of an instant (`Z`, `+00:00`, other offsets, trailing zeros)."""
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return str(value)
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return parsed.isoformat()


@dataclass(slots=True)
class UnitCommit:
    """One unit to commit into a patched table."""

    dest_id: str
    table: Table
    unit: TaskUnit
    ordered: bool = False
    """A key bucket of a table with a primary key: its chunks carry ORDER_COLUMN."""
    error: str = ""
    """Set by `CommitPool.commit` when the commit failed (rolled back whole)."""
    done: bool = False


class CommitPool:
    """The connections of a pass's task commits: `workers` threads, each with its own adapter per
    destination (a connection, opened on its first unit and kept for the pass's next pairs)."""

    def __init__(
        self,
        destinations: Mapping[str, Any],
        events_dir: Path,
        workers: int,
        fault: Callable[[str], None] | None = None,
    ) -> None:
        self.destinations = destinations
        self.events_dir = events_dir
        self.fault = fault
        self.pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="commit")
        self.threads = local()
        self.opened: list[DestinationAdapter] = []
        self.opened_lock = Lock()

    def __enter__(self) -> CommitPool:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def commit(self, units: list[UnitCommit]) -> None:
        """Commits every unit, as many at once as there are workers; sets each unit's `done` or
        `error`. A unit's failure never raises; anything else (a test's crash) cancels the units
        not started and is raised once the running ones end."""
        futures = [self.pool.submit(self._commit, unit) for unit in units]
        try:
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        for unit in units:
            if unit.error:
                what = (unit.dest_id, unit.table.name, unit.error)
                log.warning("destination %s, table %s: a task's commit failed: %s", *what)

    def _commit(self, item: UnitCommit) -> None:
        try:
            load = Load(item.dest_id, item.table, item.unit.chunks, item.unit.splits, ordered=item.ordered)
            self._adapter(item.dest_id).commit(load)
        except DestinationError as exc:
            item.error = str(exc)
        except Exception as exc:  # a client's untranslated error fails the unit, never the pass
            item.error = f"{type(exc).__name__}: {str(exc)[:300]}"
        else:
            item.done = True
            if self.fault is not None:
                self.fault("task committed")

    def _adapter(self, dest_id: str) -> DestinationAdapter:
        adapters: dict[str, DestinationAdapter] | None = getattr(self.threads, "adapters", None)
        if adapters is None:
            adapters = self.threads.adapters = {}
        found = adapters.get(dest_id)
        if found is None:
            found = adapters[dest_id] = build_destination(dest_id, self.destinations[dest_id], self.events_dir)
            with self.opened_lock:
                self.opened.append(found)
        return found

    def close(self) -> None:
        """Waits for the running units (those not started are cancelled), then closes every connection."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        with self.opened_lock:
            opened, self.opened = self.opened, []
        for adapter in opened:
            adapter.close()
