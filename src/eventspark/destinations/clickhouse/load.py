"""The SQL of a ClickHouse commit: staged chunks → a prepared table of the target's exact types.

Staging columns are Nullable stage types (timestamps as RFC 3339 text). Every value is cast to
the target column's type here; for a non-nullable column a NULL becomes the type's default
(`assumeNotNull(CAST(NULL AS Nullable(T)))`: 0, '', the zero date). Text going to a non-text
column is cast *after* replacing NULL, because ClickHouse 18 casts unparsable text to NULL when
the cast goes to a Nullable type but raises when it does not: a bad value must fail the load.

ClickHouse has no transaction to undo half an INSERT ... SELECT, so when a cast can be refused the
casts go into a prepared table first and only a fully cast copy reaches the target. When every
staged column meets a target type that takes any of its values (`casts_cannot_fail`), the cast
rows go straight into the target: one copy of the data fewer.

ClickHouse writes the rows of one INSERT (sorting them, compressing each column) on one thread, so
a large copy is cut into a few INSERTs of whole chunks (`copy_groups`) that run at once.
"""

from __future__ import annotations

from dataclasses import replace

from eventspark.destinations.base import ORDER_COLUMN, Load, StagedChunk, data_type_of_sql
from eventspark.destinations.clickhouse.ddl import base_type, quote
from eventspark.steps.typing import DataType

MAX_COPY_STREAMS = 4
MIN_COPY_ROWS = 100_000
"""Rows below which a copy is not cut further: each INSERT makes a part per partition."""
_TEXT_STAGES = (DataType.STRING, DataType.TIMESTAMP)
# Stage type → the target column types (inside Nullable) its cast can never refuse. A staged
# TIMESTAMP is RFC 3339 text the executor has already parsed.
_SAFE_TARGETS: dict[DataType, frozenset[str]] = {
    DataType.BOOL: frozenset({"UInt8", "Int64", "Float64", "String"}),
    DataType.INT64: frozenset({"Int64", "Float64", "String"}),
    DataType.FLOAT64: frozenset({"Float64", "String"}),
    DataType.STRING: frozenset({"String"}),
    DataType.TIMESTAMP: frozenset({"DateTime", "String"}),
}


def default_of(sql_type: str) -> str:
    """An expression giving the default value of (non-nullable) `sql_type`."""
    return f"assumeNotNull(CAST(NULL AS Nullable({sql_type})))"


def value_expr(column: str, stage: DataType | None, target_sql: str, target: DataType | None) -> str:
    """The staged `column` (quoted) of stage type `stage` (None: the chunk lacks it) as a value of
    the target column type `target_sql`, whose DataType is `target`."""
    inner, nullable = base_type(target_sql)
    if stage is None:
        return f"CAST(NULL AS Nullable({inner}))" if nullable else default_of(inner)
    if target is DataType.TIMESTAMP and stage in _TEXT_STAGES:
        value = f"CAST(parseDateTimeBestEffort({column}, 'UTC') AS Nullable({inner}))"
    elif stage in _TEXT_STAGES and target is not DataType.STRING:
        if not nullable:
            return f"CAST(ifNull({column}, toString({default_of(inner)})) AS {inner})"
        value = f"CAST({column} AS Nullable({inner}))"
    elif stage is DataType.BOOL and target is DataType.STRING:
        # As the other warehouses print booleans.
        text = f"if(assumeNotNull({column}) = 1, 'true', 'false')"
        value = f"CAST(if(isNull({column}), NULL, {text}) AS Nullable({inner}))"
    else:
        value = f"CAST({column} AS Nullable({inner}))"
    return value if nullable else f"ifNull({value}, {default_of(inner)})"


def casts_cannot_fail(load: Load, columns: list[str]) -> bool:
    """True when no staged value can be refused by its target column's type (module docstring)."""
    for chunk in load.chunks:
        for name in columns:
            stage = chunk.columns.get(name)
            if stage is not None and base_type(load.table.columns[name])[0] not in _SAFE_TARGETS[stage]:
                return False
    return True


def copy_groups(load: Load, streams: int = MAX_COPY_STREAMS) -> list[Load]:
    """`load` cut into at most `streams` loads of whole chunks, at most one per MIN_COPY_ROWS rows,
    spread to be about equal in rows; one when only the last row of each key is kept (that needs
    every chunk)."""
    total = sum(chunk.rows for chunk in load.chunks)
    count = min(streams, len(load.chunks), max(1, total // MIN_COPY_ROWS))
    if count <= 1 or (load.ordered and load.table.primary_keys):
        return [load]
    groups: list[list[StagedChunk]] = [[] for _ in range(count)]
    sizes = [0] * count
    for chunk in sorted(load.chunks, key=lambda c: -c.rows):  # largest first, to the emptiest group
        smallest = sizes.index(min(sizes))
        groups[smallest].append(chunk)
        sizes[smallest] += chunk.rows
    return [replace(load, chunks=group) for group in groups]


def prepare_select(load: Load, columns: list[str], source: dict[str, str]) -> str:
    """SELECT of every chunk (`source`: chunk ref → qualified name) as the target's types, columns
    named c0, c1...; with a primary key and an order column, only the last row of each key."""
    key_columns = [f"c{columns.index(k)}" for k in load.table.primary_keys if k in columns]
    keep_last = load.ordered and bool(key_columns)
    branches = [_branch(load, chunk, columns, source[chunk.ref], keep_last) for chunk in load.chunks]
    names = ", ".join(f"c{i}" for i in range(len(columns)))
    select = f"SELECT {names} FROM ({' UNION ALL '.join(branches)})"
    if keep_last:
        select += f" ORDER BY seq DESC LIMIT 1 BY {', '.join(key_columns)}"
    return select


def _branch(load: Load, chunk: StagedChunk, columns: list[str], source: str, keep_last: bool) -> str:
    exprs = []
    for index, name in enumerate(columns):
        target_sql = load.table.columns[name]
        target = data_type_of(target_sql)
        exprs.append(f"{value_expr(quote(name), chunk.columns.get(name), target_sql, target)} AS c{index}")
    if keep_last:
        seq = quote(ORDER_COLUMN) if ORDER_COLUMN in chunk.columns else "toInt64(0)"
        exprs.append(f"ifNull({seq}, toInt64(0)) AS seq")
    return f"SELECT {', '.join(exprs)} FROM {source}"


_FAMILIES: dict[str, DataType] = {
    **dict.fromkeys(["uint8", "bool", "boolean"], DataType.BOOL),
    **dict.fromkeys(["int8", "int16", "int32", "int64", "uint16", "uint32", "uint64"], DataType.INT64),
    **dict.fromkeys(["float32", "float64", "decimal", "decimal32", "decimal64", "decimal128"], DataType.FLOAT64),
    **dict.fromkeys(["string", "fixedstring"], DataType.STRING),
    **dict.fromkeys(["datetime", "datetime64"], DataType.TIMESTAMP),
}


def data_type_of(sql_type: str) -> DataType | None:
    """The DataType of a ClickHouse column type, looking through Nullable and LowCardinality."""
    inner = sql_type.strip()
    while True:
        stripped, _nullable = base_type(inner)
        if stripped.startswith("LowCardinality(") and stripped.endswith(")"):
            stripped = stripped[len("LowCardinality(") : -1].strip()
        if stripped == inner:
            break
        inner = stripped
    family = inner.split("(", 1)[0].strip().lower()
    found = _FAMILIES.get(family)
    return found if found is not None else data_type_of_sql(inner)
