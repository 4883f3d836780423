"""The driver's part of loading one destination/table pair: patch the table, then commit the stage.

Both run under the coordination lock `<destination_id>_<table>`, so two nodes never patch the same
table at once, and a patch bumps the table version so that other nodes refresh cached schemas.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from eventspark.batch.commits import TaskUnit
from eventspark.coordination import Coordination, CoordinationError
from eventspark.destinations.base import DestinationAdapter, DestinationError, Load, StagedChunk
from eventspark.destinations.sync import LOCK_TIMEOUT, sync_table, table_lock
from eventspark.steps.diff import ColumnLimitError, LoadDeferred, Table, UnmappedRule, table_from_header
from eventspark.steps.typing import BatchHeader

log = logging.getLogger(__name__)

Fault = Callable[[str], None]
"""A test hook called at named points of a pass ("staged", "committed") to inject a crash."""


class Deferred(str):
    """A pair's reason to wait for the next pass that is not a failure (`LoadDeferred`): no
    attempt is counted and no retry back-off applies."""

    __slots__ = ()


@dataclass(slots=True)
class PairLoad:
    """What the executors produced for one destination/table pair."""

    dest_id: str
    table: str
    header: BatchHeader
    chunks: list[StagedChunk] = field(default_factory=list)
    files: set[str] = field(default_factory=set)
    error: str = ""
    """Set when an executor could not stage its rows: the pair is not committed this pass."""
    units: list[TaskUnit] = field(default_factory=list)
    """With task commits (`batch.commits`): the chunks of each task, and the splits they hold."""
    buckets: dict[int, list[StagedChunk]] = field(default_factory=dict)
    """Task commits of a table with a primary key: the chunks of each key bucket, from every task."""


def load_pair(
    adapter: DestinationAdapter,
    coordination: Coordination,
    pair: PairLoad,
    primary_keys: tuple[str, ...],
    max_columns: int,
    fault: Fault | None = None,
    unmapped: UnmappedRule | None = None,
) -> str:
    """Patches and loads the pair; returns '' on success, else the reason it failed (retried with
    the destination's retry policy), or a `Deferred` reason (loaded again by the next pass)."""
    try:
        # The lock covers the commit too: a commit casts to the types the patch left.
        with coordination.lock(table_lock(pair.dest_id, pair.table), LOCK_TIMEOUT):
            target = patch_pair(adapter, coordination, pair, primary_keys, max_columns, unmapped)
            if fault is not None:
                fault("staged")
            load = Load(pair.dest_id, target, pair.chunks, sorted(pair.files), ordered=bool(primary_keys))
            adapter.commit(load)
    except LOAD_ERRORS as exc:
        return load_failure(pair, exc)
    return ""


LOAD_ERRORS = (LoadDeferred, DestinationError, CoordinationError, ColumnLimitError, ValueError)
"""What patching or committing a pair raises for a reason of its own (`load_failure`)."""


def patch_pair(
    adapter: DestinationAdapter,
    coordination: Coordination,
    pair: PairLoad,
    primary_keys: tuple[str, ...],
    max_columns: int,
    unmapped: UnmappedRule | None = None,
) -> Table:
    """Patches the pair's table to hold every row the executors staged (the caller holds its
    lock, `table_lock`); returns the table as it is after the patch. Raises `LOAD_ERRORS`."""
    wanted = table_from_header(pair.header, adapter.dialect.column_type, primary_keys)
    lock = table_lock(pair.dest_id, pair.table)
    return sync_table(adapter, coordination, lock, wanted, max_columns, unmapped).table


def load_failure(pair: PairLoad, exc: Exception) -> str:
    """The pair's outcome for one of `LOAD_ERRORS`: a `Deferred` reason, or the failure's."""
    if isinstance(exc, LoadDeferred):
        log.info("destination %s, table %s: %s", pair.dest_id, pair.table, exc)
        return Deferred(str(exc))
    log.warning("destination %s, table %s: %s", pair.dest_id, pair.table, exc)
    return str(exc)


def commit_objects(adapter: DestinationAdapter, pair: PairLoad) -> str:
    """The files family's commit: the executors wrote the pair's objects; the destination removes
    those of the same logs that this pass did not write (a killed pass that cut a log into other
    splits). No table, no lock, no marker. '' on success, else the reason it failed."""
    try:
        adapter.commit(Load(pair.dest_id, Table(pair.table), pair.chunks, sorted(pair.files)))
    except DestinationError as exc:
        log.warning("destination %s, table %s: %s", pair.dest_id, pair.table, exc)
        return str(exc)
    except Exception as exc:  # a client's untranslated error fails the pair, never the pass
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
        log.warning("destination %s, table %s: %s", pair.dest_id, pair.table, error)
        return error
    return ""
