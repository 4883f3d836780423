"""Table diff step: what must change in a warehouse table so a batch fits in it.

Patching only ever adds: a missing table is created, missing columns are added, and a
configured primary key that differs is set. Existing columns are never dropped or retyped
(a column present in the table but missing from the batch is simply left alone). Pure data
here; the destinations turn a TablePatch into their SQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

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


def check_column_limit(existing: Table | None, patch: TablePatch, max_columns: int) -> None:
    """Raise ColumnLimitError when applying ``patch`` would pass ``max_columns`` (0 or less: no limit)."""
    if max_columns <= 0:
        return
    current = len(existing.columns) if existing is not None else 0
    total = current + len(patch.add_columns)
    if total > max_columns:
        raise ColumnLimitError(
            f"table {patch.table!r} would have {total} columns ({current} now, {len(patch.add_columns)} "
            f"new), more than server.max_columns = {max_columns}"
        )
