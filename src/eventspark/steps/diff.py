"""Table diff step: what must change in a warehouse table so a batch fits in it.

Patching only ever adds: a missing table is created, missing columns are added, and a
configured primary key that differs is set. Existing columns are never dropped or retyped
(a column present in the table but missing from the batch is simply left alone). Pure data
here; the destinations turn a TablePatch into their SQL.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from eventspark.steps.flatten import json_text
from eventspark.steps.typing import BatchHeader, Field


@dataclass(slots=True)
class Table:
    """A warehouse table as eventspark sees it: column name → SQL type, and its primary key."""

    name: str
    columns: dict[str, str] = field(default_factory=dict)
    primary_keys: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The proto3 JSON form of ``eventspark.pipeline.Table``."""
        return {"name": self.name, "columns": dict(self.columns), "primary_keys": list(self.primary_keys)}


@dataclass(slots=True)
class TablePatch:
    """The changes ``diff`` found.

    ``primary_keys`` is None when the key stays as it is, else the key to set (create or replace).
    """

    table: str
    create: bool = False
    add_columns: dict[str, str] = field(default_factory=dict)
    primary_keys: tuple[str, ...] | None = None

    @property
    def is_empty(self) -> bool:
        """True when the table already fits: nothing to run."""
        return not self.create and not self.add_columns and self.primary_keys is None


class ColumnLimitError(ValueError):
    """Patching would give a table more columns than ``server.max_columns`` allows."""


class LoadDeferred(ColumnLimitError):
    """The unmapped rule left fields out of the patch: the rows load in the next pass, placed
    against the patched table. Not a failure: no retry back-off (docs/json-columns.md)."""


def table_from_header(
    header: BatchHeader, column_type: Callable[[Field], str], primary_keys: Iterable[str] = ()
) -> Table:
    """The Table a batch needs, with SQL types from a destination's ``column_type``."""
    columns = {name: column_type(f) for name, f in header.fields.items()}
    return Table(header.table_name, columns, tuple(primary_keys))


def diff(existing: Table | None, wanted: Table) -> TablePatch:
    """What to add to ``existing`` (None: the table does not exist) so rows of ``wanted`` fit.

    Column names compare exactly; destinations whose warehouse folds case report lower-case
    names. An empty ``wanted.primary_keys`` means none is configured: the existing key is kept.
    Keys compare as sets, since reordering a key is not worth rebuilding it.
    """
    if existing is None:
        keys = wanted.primary_keys or None
        return TablePatch(wanted.name, create=True, add_columns=dict(wanted.columns), primary_keys=keys)
    have = existing.columns
    missing = {name: sql_type for name, sql_type in wanted.columns.items() if name not in have}
    key_changes = bool(wanted.primary_keys) and set(wanted.primary_keys) != set(existing.primary_keys)
    return TablePatch(
        existing.name,
        create=False,
        add_columns=missing,
        primary_keys=wanted.primary_keys if key_changes else None,
    )


def check_column_limit(existing: Table | None, patch: TablePatch, max_columns: int, exempt: str | None = None) -> None:
    """Raise ColumnLimitError when applying ``patch`` would pass ``max_columns`` (0 or less: no limit).

    ``exempt``: a column not counted (the unmapped column)."""
    if max_columns <= 0:
        return
    current = len(existing.columns) if existing is not None else 0
    if existing is not None and exempt in existing.columns:
        current -= 1
    total = current + len(patch.add_columns) - (exempt in patch.add_columns)
    if total > max_columns:
        raise ColumnLimitError(
            f"table {patch.table!r} would have {total} columns ({current} now, {len(patch.add_columns)} "
            f"new), more than server.max_columns = {max_columns}"
        )


UNMAPPED_TYPE = "json"
"""The mapping type of the unmapped column: each dialect's JSON type (`Dialect.json_type`)."""
KEEP_FIRST = ("_timestamp", "eventn_ctx_event_id")
"""Fields that get a column before any other when `max_columns` leaves room for only some."""


class UnmappedRule:
    """`data_layout.unmapped_column`, `schema_freeze` and `max_columns` of one destination: which
    fields a table lacks become columns, and which go into the unmapped column (a JSON object of
    flattened name → value per row) instead (docs/json-columns.md, "The exact rule").

    * The table does not exist: every field becomes a column (a frozen schema is frozen once the
      first load created it), within `max_columns` (see below).
    * `schema_freeze`: no field becomes a column; without an unmapped column such an event fails.
    * `max_columns` (the unmapped column is not counted): when the fields fit, all become columns;
      else the room left is filled by KEEP_FIRST and the primary key, then by name order, and the
      other fields go to the unmapped column.
    """

    __slots__ = ("_casts", "column", "freeze", "keep_first", "max_columns")

    def __init__(self, column: str | None, max_columns: int, freeze: bool, primary_keys: Iterable[str] = ()) -> None:
        self.column = column
        self.max_columns = max_columns if column is not None else 0  # without a column: ColumnLimitError
        self.freeze = freeze
        self.keep_first = frozenset((*KEEP_FIRST, *primary_keys))
        self._casts: dict[int, tuple[Mapping[str, str], Mapping[str, str]]] = {}

    @classmethod
    def of(cls, layout: Any, max_columns: int) -> UnmappedRule | None:
        """The rule of a destination's `data_layout` (`max_columns`: the layout's, else the
        server's); None when neither `unmapped_column` nor `schema_freeze` is set."""
        if layout.unmapped_column is None and not layout.schema_freeze:
            return None
        return cls(layout.unmapped_column, max_columns, layout.schema_freeze, layout.primary_key_fields)

    def counted(self, columns: Collection[str]) -> int:
        """The columns `max_columns` counts: all but the unmapped column."""
        return len(columns) - (self.column in columns)

    def full(self, columns: Collection[str] | None) -> bool:
        """True when no field the table lacks may become a column (the table exists)."""
        if columns is None:
            return False
        return self.freeze or (self.max_columns > 0 and self.counted(columns) >= self.max_columns)

    def allowed(self, columns: Collection[str] | None, new: Collection[str]) -> Collection[str]:
        """Which of the `new` fields (the table lacks them) become columns (class docstring)."""
        if columns is None:
            columns = ()
        elif self.freeze:
            return ()
        room = self.max_columns - self.counted(columns) if self.max_columns > 0 else len(new)
        if len(new) <= room:
            return new
        ordered = sorted(new, key=lambda name: (name not in self.keep_first, name))
        return frozenset(ordered[: max(room, 0)])

    def place(self, row: dict[str, Any], columns: Collection[str], allowed: Collection[str] = ()) -> str | None:
        """Moves the fields of `row` that are neither in `columns` nor `allowed` into the unmapped
        column (merged with what it holds); the reason when the event cannot go (frozen, no column)."""
        unmapped = self.column
        extra = [n for n, v in row.items() if v is not None and n not in columns and n not in allowed and n != unmapped]
        if not extra:
            return None
        if unmapped is None:
            return f"the table has no column {extra[0]!r} and its schema is frozen (data_layout.schema_freeze)"
        moved = {name: row.pop(name) for name in extra}
        prior = row.get(unmapped)
        if prior is not None:
            held = _json_object(prior)
            moved = {**held, **moved} if held is not None else {unmapped: prior, **moved}
        row[unmapped] = json_text(moved)
        return None

    def casts(self, casts: Mapping[str, str]) -> Mapping[str, str]:
        """`casts` plus the unmapped column's JSON type (cached: a mapper has two casts dicts)."""
        found = self._casts.get(id(casts))
        if found is None or found[0] is not casts:
            if len(self._casts) > 64:
                self._casts.clear()
            found = self._casts[id(casts)] = (casts, {**casts, self.column or "": UNMAPPED_TYPE})
        return found[1]

    def limit(self, existing: Table | None, patch: TablePatch, json_sql: str) -> tuple[TablePatch, str]:
        """The driver's side: `patch` reduced to the columns the rule allows (the unmapped column
        added, as `json_sql`, when some were left out), and why the load must wait for the next pass ('' when
        nothing was left out: the rows fit the patched table)."""
        columns = existing.columns if existing is not None else None
        new = [name for name in patch.add_columns if name != self.column]
        allowed = self.allowed(columns, new)
        if len(allowed) == len(new):
            return patch, ""
        left_out = sorted(set(new) - set(allowed))
        adds = {name: sql_type for name, sql_type in patch.add_columns.items() if name in allowed}
        if self.column is not None and (columns is None or self.column not in columns):
            adds[self.column] = patch.add_columns.get(self.column) or json_sql
        reduced = TablePatch(patch.table, patch.create, adds, patch.primary_keys)
        shown = ", ".join(left_out[:5]) + (", ..." if len(left_out) > 5 else "")
        where = f"go to the unmapped column {self.column!r}" if self.column else "fail their events (schema_freeze)"
        reason = (
            f"table {patch.table!r}: {len(left_out)} new field(s) ({shown}) {where} from the next pass "
            f"(max_columns = {self.max_columns}, schema_freeze = {self.freeze})"
        )
        return reduced, reason


def _json_object(text: object) -> dict[str, Any] | None:
    """The object an unmapped column's JSON text holds (None: not such a text)."""
    if not isinstance(text, str) or not text.startswith("{"):
        return None
    try:
        found = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None
