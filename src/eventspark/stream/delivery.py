"""Delivering one table's rows of a micro-batch: cached schema, patching, typed insert, isolation.

The table's schema is read from the warehouse on first use and cached; it is read again when the
coordination store's version of the table differs from the cached one (another node patched it),
and when an insert fails. Patching runs under the lock `<destination_id>_<table>` and bumps the
table's version, like the batch load.

Every value is converted to its column's type before the insert (`coerce`), so that a value that
does not fit fails its own event with a reason naming the column. Before a value fails that way,
the table's schema is read again from the warehouse (at most once per table every
`REFRESH_SECONDS`) and the rows are checked again: an operator may have changed the column's type
by hand (`ALTER TABLE ... TYPE text`) behind the cache, as EventNative did. A failed insert is retried once
with a fresh schema; if it fails again, the rows are split in halves and each half retried, down
to single rows, so one poison event never fails its neighbours.

Errors: `TransientError` and coordination errors propagate (the worker keeps the events queued and
retries); warehouse refusals end up as per-row reasons.

`EventDelivery` is the same role for destinations without tables (`Capabilities.delivery ==
"events"`, the HTTP family): the rows are the mapped events, handed to the adapter's `send`; no
schema, no patching, no coordination.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from eventspark.coordination import Coordination
from eventspark.destinations.base import ORDER_COLUMN, DestinationAdapter, EventSender, TerminalError
from eventspark.destinations.sync import LOCK_TIMEOUT, sync_table, table_lock
from eventspark.steps.chain import HeaderBuilder, Row
from eventspark.steps.diff import ColumnLimitError, Table, TablePatch, UnmappedRule, table_from_header
from eventspark.steps.typing import DataType, coerce, format_timestamp

log = logging.getLogger(__name__)

REFUSED = (TerminalError, ColumnLimitError, ValueError)
"""What the warehouse (or the patch) refuses for these rows: retry once, then isolate."""
REFRESH_SECONDS = 5.0
"""The least time between two reads of a table's schema for values that do not fit the cached one."""

_KIND: dict[DataType, type] = {
    DataType.BOOL: bool,
    DataType.INT64: int,
    DataType.FLOAT64: float,
    DataType.STRING: str,
}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(slots=True)
class _Cached:
    """A table as last read from the warehouse (None: missing), the version it was read at, and
    the DataType of each column (None: a type eventspark does not check, cast by the warehouse)."""

    table: Table | None
    version: int
    types: dict[str, DataType | None] = field(default_factory=dict)


class TableDelivery:
    """The tables of one stream destination."""

    def __init__(
        self,
        dest_id: str,
        adapter: DestinationAdapter,
        coordination: Coordination,
        primary_keys: Sequence[str] = (),
        max_columns: int = 0,
        lock_timeout: float = LOCK_TIMEOUT,
        unmapped: UnmappedRule | None = None,
    ) -> None:
        self.dest_id = dest_id
        self.adapter = adapter
        self.coordination = coordination
        self.primary_keys = tuple(primary_keys)
        self.max_columns = max_columns
        self.lock_timeout = lock_timeout
        self.unmapped = unmapped
        """`data_layout.unmapped_column` / `schema_freeze`: fields the table may not get go there."""
        self._tables: dict[str, _Cached] = {}
        self._refreshed: dict[str, float] = {}
        """Table → when (monotonic) its schema was last read again for values that did not fit."""

    def deliver(self, table: str, rows: list[Row]) -> list[str | None]:
        """Loads `rows` (all for `table`); per row, None when delivered, else why it failed.

        Raises TransientError or CoordinationError when the warehouse or the coordination store is
        unreachable: nothing is decided then, the caller retries the same rows later.
        """
        errors: list[str | None] = [None] * len(rows)
        everything = list(range(len(rows)))
        try:
            self._attempt(table, rows, everything, errors)
            return errors
        except REFUSED as exc:
            log.info(
                "%s/%s: insert of %d rows failed (%s); refreshing the schema",
                self.dest_id,
                table,
                len(rows),
                exc,
            )
        self.forget(table)
        try:
            self._attempt(table, rows, everything, errors)
        except REFUSED as exc:
            self._isolate(table, rows, everything, errors, exc)
        return errors

    def forget(self, table: str) -> None:
        """Drops the cached schema: the next use reads it from the warehouse."""
        self._tables.pop(table, None)

    def interrupt(self) -> None:
        """Nothing waits here: the worker's own waits end with its stop."""

    def _attempt(self, table: str, rows: list[Row], indices: list[int], errors: list[str | None]) -> None:
        for i in [i for i in indices if ORDER_COLUMN in rows[i].values]:  # as the batch load refuses it
            errors[i] = f"field {ORDER_COLUMN!r} is reserved for eventspark's own use: rename it with a mapping"
        indices = [i for i in indices if errors[i] is None]
        if indices and self.unmapped is not None:
            indices = self._place(table, rows, indices, errors)
        if not indices:
            return
        cached = self._target(table, [rows[i] for i in indices])
        converted = {i: self._convert(cached, rows[i].values) for i in indices}
        if any(error is not None for _, error in converted.values()) and self._may_refresh(table):
            log.info("%s/%s: values do not fit the cached schema; reading it again", self.dest_id, table)
            self.forget(table)
            cached = self._target(table, [rows[i] for i in indices])
            converted = {i: self._convert(cached, rows[i].values) for i in indices}
        good: list[dict[str, Any]] = []
        for i in indices:
            changes, error = converted[i]
            errors[i] = error
            if error is None:
                rows[i].values.update(changes)  # the stored values (the events cache shows them)
                good.append(rows[i].values)
        if good:
            assert cached.table is not None
            self.adapter.insert(cached.table, good)

    def _place(self, table: str, rows: list[Row], indices: list[int], errors: list[str | None]) -> list[int]:
        """Moves the fields the table may not get into the unmapped column (`UnmappedRule`);
        the rows that can go on (a frozen schema without an unmapped column fails the others)."""
        rule = self.unmapped
        assert rule is not None
        current = self._cached(table).table
        columns = current.columns if current is not None else None
        known = columns or {}
        new = {name for i in indices for name in rows[i].values if name not in known and name != rule.column}
        allowed = rule.allowed(columns, new) if new else ()
        going = []
        for i in indices:
            row = rows[i]
            errors[i] = rule.place(row.values, known, allowed)
            if errors[i] is None:
                going.append(i)
                if rule.column in row.values:
                    row.casts = rule.casts(row.casts)
        return going

    def _may_refresh(self, table: str) -> bool:
        """Whether the schema may be read again for values that do not fit (bounded per table)."""
        now = time.monotonic()
        last = self._refreshed.get(table)
        if last is not None and now - last < REFRESH_SECONDS:
            return False
        self._refreshed[table] = now
        return True

    def _isolate(
        self, table: str, rows: list[Row], indices: list[int], errors: list[str | None], exc: Exception
    ) -> None:
        if len(indices) == 1:
            errors[indices[0]] = str(exc)
            return
        middle = len(indices) // 2
        for half in (indices[:middle], indices[middle:]):
            try:
                self._attempt(table, rows, half, errors)
            except REFUSED as half_exc:
                self._isolate(table, rows, half, errors, half_exc)

    # --- schema ---------------------------------------------------------------------------------

    def _cached(self, table: str) -> _Cached:
        version = self.coordination.table_version(table_lock(self.dest_id, table))
        cached = self._tables.get(table)
        if cached is None or cached.version != version:
            cached = self._remember(table, self.adapter.read_table(table), version)
        return cached

    def _remember(self, name: str, table: Table | None, version: int) -> _Cached:
        types = {} if table is None else {c: self.adapter.data_type_of(t) for c, t in table.columns.items()}
        cached = self._tables[name] = _Cached(table, version, types)
        return cached

    def _target(self, table: str, rows: list[Row]) -> _Cached:
        """The cached table when every column of `rows` is in it, else the table after patching."""
        cached = self._cached(table)
        current = cached.table
        if current is not None and (not self.primary_keys or set(self.primary_keys) == set(current.primary_keys)):
            columns = current.columns
            if all(name in columns for row in rows for name in row.values):
                return cached
        builder = HeaderBuilder()
        for row in rows:
            builder.add(row)
        wanted = table_from_header(builder.headers[table], self.adapter.dialect.column_type, self.primary_keys)
        return self._patch(table, wanted)

    def _patch(self, name: str, wanted: Table) -> _Cached:
        lock = table_lock(self.dest_id, name)
        with self.coordination.lock(lock, self.lock_timeout):
            synced = sync_table(self.adapter, self.coordination, lock, wanted, self.max_columns, self.unmapped)
        if synced.patch is not None:
            log.info("%s/%s: patched (%s)", self.dest_id, name, _describe(synced.patch))
        return self._remember(name, synced.table, synced.version)

    # --- values ---------------------------------------------------------------------------------

    def _convert(self, cached: _Cached, values: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """(the values converted to the types of their columns, None) or ({}, the reason when one
        does not fit); `values` is left as it is, to be checked again against a fresh schema."""
        for key in self.primary_keys:
            if values.get(key) is None:
                return {}, f"primary key field {key!r} is missing"
        types = cached.types
        changes: dict[str, Any] = {}
        for name, value in values.items():
            if value is None:
                continue
            if name not in types:
                return {}, f"table {cached.table.name if cached.table else '?'!r} has no column {name!r}"
            target = types[name]
            if target is None:
                continue  # json, uuid...: the warehouse casts the text
            kind = _KIND.get(target)
            if type(value) is kind and (kind is not int or _INT64_MIN <= value <= _INT64_MAX):
                continue
            try:
                converted = coerce(value, target)
            except ValueError as exc:
                return {}, f"column {name!r}: {exc}"
            # Timestamps go as RFC 3339 in UTC: exact whatever the column's time zone handling.
            changes[name] = format_timestamp(converted) if target is DataType.TIMESTAMP else converted  # type: ignore[arg-type]
        return changes, None


class EventDelivery:
    """The events of one stream destination without tables: each micro-batch's events (grouped by
    the table name template, which only filters here) go to `adapter.send`, which decides each
    event or raises `PartlyDelivered` / `TransientError` for the worker to retry the undecided."""

    def __init__(self, dest_id: str, adapter: EventSender) -> None:
        self.dest_id = dest_id
        self.adapter = adapter

    def deliver(self, table: str, rows: list[Row]) -> list[str | None]:
        """Per row, None when delivered, else why it failed; raises as `EventSender.send`."""
        return self.adapter.send([row.values for row in rows])

    def forget(self, table: str) -> None:
        """Nothing is cached per table."""

    def interrupt(self) -> None:
        """The worker is stopping: cut the adapter's waits between retries short."""
        self.adapter.interrupt()


def _describe(patch: TablePatch) -> str:
    create, columns = patch.create, patch.add_columns
    names = ", ".join(sorted(columns)[:10]) + (", ..." if len(columns) > 10 else "")
    return f"created with {len(columns)} columns" if create else f"added {names}"
