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
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
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


@dataclass(slots=True)
class UnitCommit:
    """One unit to commit into a patched table."""

    dest_id: str
    table: Table
    unit: TaskUnit
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
            load = Load(item.dest_id, item.table, item.unit.chunks, item.unit.splits)
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
