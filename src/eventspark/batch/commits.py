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
task, are one upsert. No marker is needed: a unit that commits again after a crash writes the same
rows over themselves (the rerun reads the logs again, and upserts are idempotent).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from threading import local
from typing import Any

from eventspark.destinations import build_destination
from eventspark.destinations.base import DestinationAdapter, DestinationError, Load, StagedChunk
from eventspark.steps.diff import Table

log = logging.getLogger(__name__)


@dataclass(slots=True)
class TaskUnit:
    """The chunks one task staged for one pair, and the splits whose rows they hold."""

    chunks: list[StagedChunk]
    splits: list[str]


def bucket_rows(rows: list[list[Any]], keys: Sequence[int], buckets: int) -> dict[int, list[list[Any]]]:
    """Rows by the bucket of their key (the values at `keys`): a stable hash of the key's text, so
    that every executor puts a key in the same bucket, whatever the type its values were staged
    in (1 and "1", 2.0 and 2 are one key once cast to the column's type)."""
    if buckets <= 1:
        return {0: rows}
    cut: dict[int, list[list[Any]]] = {}
    for row in rows:
        text = "\x1f".join(_key_text(row[index]) for index in keys)
        cut.setdefault(zlib.crc32(text.encode("utf-8", "surrogatepass")) % buckets, []).append(row)
    return cut


def _key_text(value: Any) -> str:
    if type(value) is float and value.is_integer():
        return str(int(value))
    return str(value)


@dataclass(slots=True)
class UnitCommit:
    """One unit to commit into a patched table."""

    dest_id: str
    table: Table
    unit: TaskUnit
    ordered: bool = False
    """A key bucket of a table with a primary key: its chunks carry ORDER_COLUMN."""
    error: str = ""
    """Set by `commit_units` when the commit failed (rolled back whole)."""
    done: bool = False


def commit_units(
    units: list[UnitCommit],
    destinations: Mapping[str, Any],
    events_dir: Path,
    workers: int,
    fault: Callable[[str], None] | None = None,
) -> None:
    """Commits every unit, `workers` at a time, each thread on connections of its own (one per
    destination); sets each unit's `done` or `error`. Never raises for a unit's failure."""
    if not units:
        return
    threads = local()
    opened: list[DestinationAdapter] = []

    def adapter_of(dest_id: str) -> DestinationAdapter:
        adapters: dict[str, DestinationAdapter] | None = getattr(threads, "adapters", None)
        if adapters is None:
            adapters = threads.adapters = {}
        found = adapters.get(dest_id)
        if found is None:
            found = adapters[dest_id] = build_destination(dest_id, destinations[dest_id], events_dir)
            opened.append(found)  # list.append is atomic: closed by the caller's thread at the end
        return found

    def commit(item: UnitCommit) -> None:
        try:
            load = Load(item.dest_id, item.table, item.unit.chunks, item.unit.splits, ordered=item.ordered)
            adapter_of(item.dest_id).commit(load)
        except DestinationError as exc:
            item.error = str(exc)
        except Exception as exc:  # a client's untranslated error fails the unit, never the pass
            item.error = f"{type(exc).__name__}: {str(exc)[:300]}"
        else:
            item.done = True
            if fault is not None:
                fault("task committed")

    try:
        with ThreadPoolExecutor(max(1, min(workers, len(units))), thread_name_prefix="commit") as pool:
            list(pool.map(commit, units))
    finally:
        for adapter in opened:
            adapter.close()
    for item in units:
        if item.error:
            what = (item.dest_id, item.table.name, item.error)
            log.warning("destination %s, table %s: a task's commit failed: %s", *what)
