"""The SQL every warehouse's commit and stream insert share, built from data: the upsert style of
the capabilities, the dialect's quoting and literals, and one hook per warehouse for the value
expression of a staged column.

Each staged chunk has its own column types (the types its executor saw); the target's types are
the promoted ones, so the value expressions go up the promotion tree. Columns a chunk lacks are
NULL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from eventspark.destinations.base import ORDER_COLUMN, Load, StagedChunk, TerminalError, UpsertStyle
from eventspark.destinations.dialect import data_type_of_sql
from eventspark.steps.diff import Table
from eventspark.steps.typing import DataType

Quote = Callable[[str], str]
ValueExpr = Callable[[str, DataType | None, str], str]
"""(quoted staged column, its stage type or None when the chunk lacks it, target SQL type) → SQL."""


def load_columns(load: Load) -> list[str]:
    """The target columns the chunks fill, in first-seen order (the order column excluded).

    ValueError names a column the target lacks: the table must be patched before loading.
    """
    seen: dict[str, None] = {}
    for chunk in load.chunks:
        seen.update(dict.fromkeys(c for c in chunk.columns if c != ORDER_COLUMN))
    missing = [c for c in seen if c not in load.table.columns]
    if missing:
        raise ValueError(f"table {load.table.name!r} has no column {missing[0]!r}; patch it before loading")
    return list(seen)


def upsert_clause(style: UpsertStyle, quote: Quote, columns: Sequence[str], keys: Sequence[str]) -> str:
    """What follows an INSERT so that a row whose key exists replaces it ('' without a key, and for
    engines that replace rows themselves)."""
    if not keys or style == "replacing_engine":
        return ""
    updated = [c for c in columns if c not in keys]
    if style == "on_conflict":
        sets = ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in updated)
        action = f"DO UPDATE SET {sets}" if sets else "DO NOTHING"
        return f" ON CONFLICT ({', '.join(quote(k) for k in keys)}) {action}"
    sets = ", ".join(f"{quote(c)} = VALUES({quote(c)})" for c in updated)
    # Nothing to update: a no-op assignment keeps the existing row.
    return " ON DUPLICATE KEY UPDATE " + (sets or f"{quote(keys[0])} = {quote(keys[0])}")


def copy_statements(
    load: Load, style: UpsertStyle, quote: Quote, target: str, source: Callable[[StagedChunk], str], value: ValueExpr
) -> list[str]:
    """The INSERT ... SELECT statements moving a pair's chunks into `target` (run in one transaction).

    Without a primary key, one statement per chunk straight from its stage: a UNION ALL would be
    materialised first by some servers (MySQL, on disk as the rows hold TEXT). With a key, one
    statement over every chunk keeping the last row of each key (by the order column), since an
    upsert cannot touch a row twice: DISTINCT ON for `on_conflict`, rows in order for
    `on_duplicate_key` (a later row updates an earlier one).
    """
    columns = load_columns(load)
    names = ", ".join(quote(c) for c in columns)
    keys = load.table.primary_keys
    ordered = load.ordered and bool(keys)
    selects = [f"{_select(load, c, columns, quote, value, ordered)} FROM {source(c)}" for c in load.chunks]
    if not keys:
        return [f"INSERT INTO {target} ({names}) {select}" for select in selects]
    union = " UNION ALL ".join(selects)
    order = quote(ORDER_COLUMN)
    if style == "on_conflict":
        key_names = ", ".join(quote(k) for k in keys)
        body = f"SELECT DISTINCT ON ({key_names}) {names} FROM ({union}) AS s"
        body += f" ORDER BY {key_names}, {order} DESC" if ordered else ""
    elif style == "on_duplicate_key":
        body = f"SELECT {names} FROM ({union}) AS s" + (f" ORDER BY s.{order}" if ordered else "")
    else:
        raise ValueError(f"upsert style {style!r} has no shared INSERT ... SELECT")
    return [f"INSERT INTO {target} ({names}) {body}{upsert_clause(style, quote, columns, keys)}"]


def _select(load: Load, chunk: StagedChunk, columns: list[str], quote: Quote, value: ValueExpr, ordered: bool) -> str:
    exprs = [f"{value(quote(c), chunk.columns.get(c), load.table.columns[c])} AS {quote(c)}" for c in columns]
    if ordered:
        order = quote(ORDER_COLUMN)
        exprs.append(f"{order} AS {order}" if ORDER_COLUMN in chunk.columns else f"0 AS {order}")
    return f"SELECT {', '.join(exprs)}"


def cast_expr(column: str, stage: DataType | None, target_sql: str) -> str:
    """`column` (quoted) of stage type `stage` as a value of `target_sql`, with standard CASTs
    (Postgres, DuckDB). Timestamps are staged as RFC 3339 text: going through TIMESTAMPTZ keeps
    their offsets (the session runs in UTC). Booleans become numbers through INTEGER, since
    neither warehouse casts boolean to BIGINT or DECIMAL directly."""
    if stage is None:
        return f"CAST(NULL AS {target_sql})"
    target = data_type_of_sql(target_sql)
    if target is DataType.TIMESTAMP and stage in (DataType.TIMESTAMP, DataType.STRING):
        return f"CAST(CAST({column} AS TIMESTAMPTZ) AS {target_sql})"
    if stage is DataType.BOOL and target not in (DataType.BOOL, DataType.STRING, None):
        return f"CAST(CAST({column} AS INTEGER) AS {target_sql})"
    return f"CAST({column} AS {target_sql})"


# --- load markers ---------------------------------------------------------------------------------


def marker_insert(loads: str, literal: Quote, load: Load) -> str | None:
    """The INSERT of one marker per source file of a committed pair (None without files)."""
    if not load.files:
        return None
    table = literal(load.table.name)
    values = ", ".join(f"({literal(load.dest_id)}, {literal(f)}, {table})" for f in load.files)
    return f"INSERT INTO {loads} (dest_id, file, table_name) VALUES {values}"


def marker_select(loads: str, literal: Quote, dest_id: str, files: Sequence[str]) -> str:
    """The (file, table) pairs of `files` committed for `dest_id`."""
    wanted = ", ".join(literal(f) for f in files)
    return f"SELECT DISTINCT file, table_name FROM {loads} WHERE dest_id = {literal(dest_id)} AND file IN ({wanted})"


def split_marker_select(loads: str, literal: Quote, dest_id: str, logs: Sequence[str]) -> str:
    """The (split key, table) pairs of the per-split markers of `logs` committed for `dest_id`:
    keys are `<log>@<start>-<end>`, matched by their `<log>@` prefix (LIKE, `!` the escape)."""
    prefixes = [_like_escaped(name + "@") + "%" for name in logs]
    matches = " OR ".join(f"file LIKE {literal(prefix)} ESCAPE '!'" for prefix in prefixes)
    return f"SELECT DISTINCT file, table_name FROM {loads} WHERE dest_id = {literal(dest_id)} AND ({matches})"


def marker_delete(loads: str, literal: Quote, dest_id: str, logs: Sequence[str], splits: bool) -> str:
    """The DELETE of the markers of `logs` for `dest_id`: their log markers, and with `splits`
    their per-split markers (`<log>@…`, matched as `split_marker_select` matches them)."""
    matches = [f"file IN ({', '.join(literal(name) for name in logs)})"]
    if splits:
        matches += [f"file LIKE {literal(_like_escaped(name + '@') + '%')} ESCAPE '!'" for name in logs]
    return f"DELETE FROM {loads} WHERE dest_id = {literal(dest_id)} AND ({' OR '.join(matches)})"


def _like_escaped(text: str) -> str:
    return text.replace("!", "!!").replace("%", "!%").replace("_", "!_")


# --- stream inserts -------------------------------------------------------------------------------


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


def group_by_non_null(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, ...], list[Mapping[str, Any]]]:
    """Rows by the tuple of their non-NULL columns, in first-seen order: for warehouses whose
    columns cannot take NULL, each group is inserted naming only its columns (the others get
    their defaults)."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(c for c, v in row.items() if v is not None), []).append(row)
    return groups
