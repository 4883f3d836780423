"""Bringing a warehouse table up to what a batch or a micro-batch needs: written once, for the
batch load and the stream workers alike.

Under the coordination lock `<destination_id>_<table>` (`table_lock`), which the caller holds:
read the table → diff it with the wanted one → check `max_columns` → patch (create, add columns,
primary key) → bump the table's version, so that other nodes refresh their cached schemas → read
it back. Table patching never changes or drops an existing column.
"""

from __future__ import annotations

from dataclasses import dataclass

from eventspark.coordination import Coordination
from eventspark.destinations.base import DestinationAdapter, TerminalError
from eventspark.steps.diff import (
    LoadDeferred,
    Table,
    TablePatch,
    UnmappedRule,
    check_column_limit,
    diff,
)

LOCK_TIMEOUT = 120.0
"""Seconds to wait for another node's patch or load of the same table."""


def table_lock(dest_id: str, table: str) -> str:
    """The coordination lock (and version key) of one destination table."""
    return f"{dest_id}_{table}"


@dataclass(frozen=True, slots=True)
class SyncedTable:
    table: Table
    """The table as it is after patching."""
    version: int
    """Its version in the coordination store after this sync."""
    patch: TablePatch | None
    """What was changed; None when the table already had everything."""


def sync_table(
    adapter: DestinationAdapter,
    coordination: Coordination,
    lock: str,
    wanted: Table,
    max_columns: int,
    unmapped: UnmappedRule | None = None,
) -> SyncedTable:
    """Patches the table to hold `wanted`'s columns and key; the caller holds `lock`.

    ColumnLimitError when the patch would pass `max_columns`; DestinationError (or a subclass)
    from the warehouse. With `unmapped` (docs/json-columns.md), the patch adds only the columns
    the rule allows, plus the unmapped column, and LoadDeferred follows the patch when some
    were left out: the rows must be placed again against the patched table (the next pass).
    """
    existing = adapter.read_table(wanted.name)
    patch = diff(existing, wanted)
    if patch.is_empty and existing is not None:
        return SyncedTable(existing, coordination.table_version(lock), None)
    left_out = ""
    if unmapped is not None:
        patch, left_out = unmapped.limit(existing, patch, adapter.dialect.json_type)
        if patch.is_empty and existing is not None:
            raise LoadDeferred(left_out)
    check_column_limit(existing, patch, max_columns, unmapped.column if unmapped is not None else None)
    adapter.patch(patch)
    version = coordination.bump_table_version(lock)
    after = adapter.read_table(wanted.name)
    if after is None:
        raise TerminalError(f"table {wanted.name!r} is missing right after it was patched")
    if left_out:
        raise LoadDeferred(left_out)
    return SyncedTable(after, version, patch)
