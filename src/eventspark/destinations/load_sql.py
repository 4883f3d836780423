"""SQL shared by the warehouses that load staged chunks with INSERT ... SELECT (Postgres, DuckDB...).

Each chunk has its own column types (the types its executor saw); the target's types are the
promoted ones, so every cast below goes up the promotion tree and cannot fail for values that
passed the executor's checks. Columns a chunk lacks are NULL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from eventspark.destinations.base import ORDER_COLUMN, Load, StagedChunk, TerminalError, data_type_of_sql
from eventspark.steps.diff import Table
from eventspark.steps.typing import DataType

Quote = Callable[[str], str]


def cast_expr(column: str, stage: DataType, target_sql: str) -> str:
    """`column` (already quoted) of stage type `stage` as a value of the target column type.

    Timestamps are staged as RFC 3339 text: going through TIMESTAMPTZ keeps their offsets (the
    session runs in UTC). Booleans become numbers through INTEGER, since neither warehouse casts
    boolean to BIGINT or DECIMAL directly.
    """
    target = data_type_of_sql(target_sql)
    if target is DataType.TIMESTAMP and stage in (DataType.TIMESTAMP, DataType.STRING):
        return f"CAST(CAST({column} AS TIMESTAMPTZ) AS {target_sql})"
    if stage is DataType.BOOL and target not in (DataType.BOOL, DataType.STRING, None):
        return f"CAST(CAST({column} AS INTEGER) AS {target_sql})"
    return f"CAST({column} AS {target_sql})"


def load_columns(load: Load) -> list[str]:
    """The target columns the chunks fill, in first-seen order (the order column excluded)."""
    seen: dict[str, None] = {}
    for chunk in load.chunks:
        seen.update(dict.fromkeys(c for c in chunk.columns if c != ORDER_COLUMN))
    return list(seen)


def insert_select(load: Load, quote: Quote, target: str, source: Callable[[StagedChunk], str]) -> str:
    """INSERT INTO `target` (the qualified table name) SELECT from every chunk (`source` names a
    chunk in SQL): a plain append, or with a primary key an upsert where the last row of each key
    (by the order column) wins."""
    table = load.table
    columns = load_columns(load)
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"table {table.name!r} has no column {missing[0]!r}; patch it before loading")
    names = ", ".join(quote(c) for c in columns)
    keep_order = load.ordered and bool(table.primary_keys)
    selects = " UNION ALL ".join(
        _chunk_select(chunk, columns, load, quote, keep_order) + f" FROM {source(chunk)}" for chunk in load.chunks
    )
    if not table.primary_keys:
        return f"INSERT INTO {target} ({names}) SELECT {names} FROM ({selects}) AS s"
    keys = ", ".join(quote(k) for k in table.primary_keys)
    body = f"SELECT DISTINCT ON ({keys}) {names} FROM ({selects}) AS s"
    if keep_order:
        body += f" ORDER BY {keys}, {quote(ORDER_COLUMN)} DESC"
    updates = [f"{quote(c)} = EXCLUDED.{quote(c)}" for c in columns if c not in table.primary_keys]
    action = f"DO UPDATE SET {', '.join(updates)}" if updates else "DO NOTHING"
    return f"INSERT INTO {target} ({names}) {body} ON CONFLICT ({keys}) {action}"


def _chunk_select(chunk: StagedChunk, columns: list[str], load: Load, quote: Quote, keep_order: bool) -> str:
    exprs = []
    for name in columns:
        target_sql = load.table.columns[name]
        stage = chunk.columns.get(name)
        value = f"CAST(NULL AS {target_sql})" if stage is None else cast_expr(quote(name), stage, target_sql)
        exprs.append(f"{value} AS {quote(name)}")
    if keep_order:
        exprs.append(quote(ORDER_COLUMN))
    return f"SELECT {', '.join(exprs)}"


def insert_plan(
    warehouse: str, table: Table, rows: Sequence[Mapping[str, Any]]
) -> tuple[list[str], Sequence[Mapping[str, Any]]]:
    """Every column any of `rows` has, and the rows to insert. With a primary key only the last row
    of each key is kept (an upsert cannot touch a row twice), and it replaces the stored values of
    these columns, as a batch load does. A column the table lacks is a TerminalError."""
    if table.primary_keys:
        keys = table.primary_keys
        rows = list({tuple(row.get(k) for k in keys): row for row in rows}.values())
    columns = list(dict.fromkeys(c for row in rows for c in row))
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise TerminalError(f"{warehouse}: table {table.name!r} has no column {missing[0]!r}")
    return columns, rows
