"""MySQL/MariaDB SQL built from data: column types, the commit's INSERT ... SELECT, stream rows.

The commit relies on the session's strict mode (`STRICT_ALL_TABLES`) rather than CAST: assigning
text that is not a number to a BIGINT column is then an error that fails the load, where CAST
would only warn and store 0.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from eventspark.destinations.base import ORDER_COLUMN, Load, StagedChunk
from eventspark.destinations.mysql.dialect import DIALECT
from eventspark.destinations.staging import load_columns
from eventspark.destinations.tsv import NULL, STAGE_ENCODERS, Encoder
from eventspark.steps.typing import DataType, coerce, parse_timestamp

quote = DIALECT.quote

STAGE_TYPES: dict[DataType, str] = {
    DataType.BOOL: "BOOLEAN",
    DataType.INT64: "BIGINT",
    DataType.FLOAT64: "DOUBLE",
    DataType.STRING: "LONGTEXT",
    DataType.TIMESTAMP: "DATETIME(6)",
}
KEY_TEXT_TYPE = "VARCHAR(255)"
"""Key columns cannot be TEXT in MySQL (no index without a prefix length): text keys get this."""
TABLE_OPTIONS = "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={}"
"""utf8mb4 for any text; a binary collation so that keys compare as eventspark compares them."""
EXACT_COLLATIONS = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin", "utf8mb4_bin")
"""Binary collations, best first: MariaDB's and MySQL 8's do not ignore trailing spaces."""

_TYPE = re.compile(r"^\s*([a-z ]+?)\s*(?:\((\d+)(?:\s*,\s*\d+)?\))?(?:\s+(?:unsigned|signed|zerofill))*\s*$")
_FAMILIES: dict[str, DataType] = {
    **dict.fromkeys(["boolean", "bool"], DataType.BOOL),
    **dict.fromkeys(["bigint", "int", "integer", "mediumint", "smallint", "tinyint", "year"], DataType.INT64),
    **dict.fromkeys(["decimal", "numeric", "double", "double precision", "float", "real"], DataType.FLOAT64),
    **dict.fromkeys(
        ["text", "tinytext", "mediumtext", "longtext", "varchar", "char", "character varying"], DataType.STRING
    ),
    **dict.fromkeys(["datetime", "timestamp"], DataType.TIMESTAMP),
}
TEXT_FAMILIES = frozenset({"text", "tinytext", "mediumtext", "longtext"})


def type_family(sql_type: str) -> tuple[str, int | None]:
    """(`bigint`, 20) for `bigint(20) unsigned`; ('', None) for what does not parse."""
    match = _TYPE.match(sql_type.lower())
    if match is None:
        return "", None
    return match.group(1), int(match.group(2)) if match.group(2) else None


def data_type_of(sql_type: str) -> DataType | None:
    """The DataType of a MySQL column type; `tinyint(1)` is how BOOLEAN reads back."""
    family, size = type_family(sql_type)
    if family == "tinyint" and size == 1:
        return DataType.BOOL
    return _FAMILIES.get(family)


def key_column_type(sql_type: str) -> str:
    """The type a key column needs: VARCHAR(255) instead of a TEXT type."""
    return KEY_TEXT_TYPE if type_family(sql_type)[0] in TEXT_FAMILIES else sql_type


def insert_select(load: Load, target: str, source: Callable[[StagedChunk], str]) -> list[str]:
    """The INSERT ... SELECT statements of a commit (run in one transaction).

    When the table has no primary key, one statement per chunk straight from its staging table: a
    UNION ALL of the chunks would be materialised by the server first (on disk, as the rows hold
    TEXT), writing every row twice. With a key, one upsert of every chunk, in the order column's
    order when the chunks carry it, so that the last event of a key wins.
    """
    columns = load_columns(load)
    names = ", ".join(quote(c) for c in columns)
    keys = load.table.primary_keys
    if not keys:
        return [f"INSERT INTO {target} ({names}) {_branch(load, c, columns, source(c), False)}" for c in load.chunks]
    # The table's key, whether or not the config names one: a row whose key exists is updated.
    keep_order = load.ordered
    branches = " UNION ALL ".join(_branch(load, chunk, columns, source(chunk), keep_order) for chunk in load.chunks)
    aliases = ", ".join(f"c{i}" for i in range(len(columns)))
    statement = f"INSERT INTO {target} ({names}) SELECT {aliases} FROM ({branches}) AS s"
    if keep_order:
        statement += " ORDER BY s.seq"
    return [statement + upsert_clause(columns, keys)]


def upsert_clause(columns: Sequence[str], keys: Sequence[str]) -> str:
    """`ON DUPLICATE KEY UPDATE` for a table with a primary key ('' without one)."""
    if not keys:
        return ""
    updates = [f"{quote(c)} = VALUES({quote(c)})" for c in columns if c not in keys]
    if not updates:  # nothing to update: a no-op assignment keeps the existing row
        updates = [f"{quote(keys[0])} = {quote(keys[0])}"]
    return " ON DUPLICATE KEY UPDATE " + ", ".join(updates)


def _branch(load: Load, chunk: StagedChunk, columns: list[str], source: str, keep_order: bool) -> str:
    exprs = []
    for index, name in enumerate(columns):
        stage = chunk.columns.get(name)
        value = "NULL" if stage is None else quote(name)
        if stage is DataType.BOOL and data_type_of(load.table.columns[name]) is DataType.STRING:
            value = f"CASE WHEN {value} IS NULL THEN NULL WHEN {value} THEN 'true' ELSE 'false' END"
        exprs.append(f"{value} AS c{index}")
    if keep_order:
        exprs.append(f"{quote(ORDER_COLUMN) if ORDER_COLUMN in chunk.columns else '0'} AS seq")
    return f"SELECT {', '.join(exprs)} FROM {source}"


def _timestamps(values: Sequence[Any]) -> list[str]:
    """RFC 3339 text as MySQL DATETIME text in UTC (MySQL reads no offsets)."""
    out = []
    for v in values:
        if v is None:
            out.append(NULL)
        elif len(v) == 27 and v[26] == "Z" and v[10] == "T":  # the pipeline's own format: no parsing
            out.append(f"{v[:10]} {v[11:26]}")
        else:
            out.append(mysql_datetime(v).isoformat(" ", "microseconds"))
    return out


def mysql_datetime(value: Any) -> datetime:
    """A timestamp value (RFC 3339 text or datetime) as a naive UTC datetime."""
    parsed = parse_timestamp(value) if isinstance(value, str) else coerce(value, DataType.TIMESTAMP)
    if not isinstance(parsed, datetime):
        raise ValueError(f"{value!r} is not an RFC 3339 timestamp")
    return parsed.replace(tzinfo=None)


STAGE_FILE_ENCODERS: dict[DataType, Encoder] = {**STAGE_ENCODERS, DataType.TIMESTAMP: _timestamps}


def stream_value(value: Any, target: DataType | None) -> Any:
    """A stream row's value as the driver should send it for a column of DataType `target`."""
    if value is None or target is None:
        return value
    if target is DataType.TIMESTAMP:
        return mysql_datetime(value)
    return coerce(value, target)


def group_rows(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, ...], list[Mapping[str, Any]]]:
    """Rows by their tuple of columns, in first-seen order: one multi-row INSERT per group."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row), []).append(row)
    return groups
