"""Stream-mode rows as TSV in the target's column types.

Rows are grouped by their non-NULL columns and each group is inserted naming only those, so a
column a row lacks gets ClickHouse's default for it (NULL for Nullable, else 0, '' or the zero
date), whatever its type: ClickHouse 18 cannot read `\\N` into a non-nullable column. Timestamps
are sent as RFC 3339 and parsed with `date_time_input_format = best_effort`, which reads the
offset, so the server's time zone does not matter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from eventspark.destinations.base import TerminalError
from eventspark.destinations.tsv import escape
from eventspark.steps.diff import Table
from eventspark.steps.typing import DataType, coerce, format_timestamp

SETTINGS = {"date_time_input_format": "best_effort"}


def group_by_columns(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, ...], list[Mapping[str, Any]]]:
    """Rows by the tuple of their non-NULL columns, in first-seen order."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        columns = tuple(c for c, v in row.items() if v is not None)
        groups.setdefault(columns, []).append(row)
    return groups


def field_text(value: Any, target: DataType | None) -> str:
    """One value as TSV text for a column of DataType `target` (None: sent as its text)."""
    if target is None:
        return escape(value if isinstance(value, str) else str(value))
    value = coerce(value, target)
    if target is DataType.BOOL:
        return "1" if value else "0"
    if target is DataType.TIMESTAMP:
        return format_timestamp(value)  # type: ignore[arg-type]
    if target is DataType.STRING:
        return escape(value)  # type: ignore[arg-type]
    return str(value)


def encode(
    table: Table,
    columns: tuple[str, ...],
    rows: Sequence[Mapping[str, Any]],
    data_type_of: Callable[[str], DataType | None],
) -> bytes:
    """`rows` (all with exactly `columns` non-NULL) as TSV; TerminalError naming a misfit value."""
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise TerminalError(f"clickhouse: table {table.name!r} has no column {missing[0]!r}")
    targets = [data_type_of(table.columns[c]) for c in columns]
    lines = []
    try:
        for row in rows:
            lines.append("\t".join(field_text(row[c], t) for c, t in zip(columns, targets, strict=True)))
    except ValueError as exc:
        raise TerminalError(f"clickhouse: inserting into {table.name!r}: {exc}") from exc
    return ("\n".join(lines) + "\n").encode()
