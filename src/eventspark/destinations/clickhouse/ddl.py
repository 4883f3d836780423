"""ClickHouse table DDL from the destination's `engine` and `cluster` settings, as text.

Default table (EventNative's): `ReplacingMergeTree(_timestamp) PARTITION BY (toYYYYMM(_timestamp))
ORDER BY (eventn_ctx_event_id)`, so a re-delivered event collapses into one row when parts merge.
Each default needs its column: without `_timestamp` there is no version and no partition; without
an ORDER BY key the engine is a plain MergeTree (a ReplacingMergeTree over an empty key would
collapse the whole table into one row). Columns are non-nullable (NULL becomes the type's
default) except those in `nullable_fields` that are not part of a key.

With a `cluster`, every statement runs `ON CLUSTER`, the table engine is the Replicated variant
(ZooKeeper path `/clickhouse/tables/{shard}/<db>/<table>`, replica `{replica}`) and a
`dist_<table>` Distributed table over it receives the inserts, sharded by a hash of the ORDER BY
key so that copies of one event meet on one shard and collapse.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eventspark.destinations.clickhouse.dialect import DIALECT, base_type

__all__ = ["base_type"]

DEFAULT_VERSION = "_timestamp"
DEFAULT_ORDER = "eventn_ctx_event_id"
DEFAULT_PARTITION = ("toYYYYMM", "_timestamp")
DIST_PREFIX = "dist_"
_FUNCTION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

quote = DIALECT.quote
literal = DIALECT.literal


@dataclass(frozen=True, slots=True)
class KeyField:
    """A PARTITION BY or ORDER BY element: a column, optionally wrapped in one function."""

    field: str
    function: str | None = None

    def sql(self) -> str:
        if self.function is None:
            return quote(self.field)
        if not _FUNCTION.fullmatch(self.function):
            raise ValueError(f"clickhouse: {self.function!r} is not a function name")
        return f"{self.function}({quote(self.field)})"


@dataclass(frozen=True, slots=True)
class Layout:
    """Where tables live and how they are built: the `clickhouse` config block as data."""

    db: str
    cluster: str | None = None
    raw_statement: str | None = None
    nullable_fields: frozenset[str] = frozenset()
    partition_fields: tuple[KeyField, ...] = ()
    order_fields: tuple[KeyField, ...] = ()
    primary_keys: tuple[str, ...] = ()

    def name(self, table: str) -> str:
        return f"{quote(self.db)}.{quote(table)}"

    def on_cluster(self) -> str:
        return f" ON CLUSTER {quote(self.cluster)}" if self.cluster else ""

    def insert_target(self, table: str) -> str:
        """The table inserts go to: the Distributed one with a cluster."""
        return self.name(DIST_PREFIX + table if self.cluster else table)


def column_type(layout: Layout, name: str, sql_type: str, keys: set[str]) -> str:
    """The DDL type of a column: Nullable only when configured and the column is in no key."""
    inner, nullable = base_type(sql_type)
    if (nullable or name in layout.nullable_fields) and name not in keys:
        return f"Nullable({inner})"
    return inner


def create_statements(layout: Layout, table: str, columns: Mapping[str, str], keys: Sequence[str]) -> list[str]:
    """CREATE TABLE for a new table (and its Distributed table with a cluster)."""
    order = _order_fields(layout, columns, keys)
    partition = _partition_fields(layout, columns)
    key_columns = {f.field for f in (*order, *partition)} | set(layout.primary_keys)
    defs = ", ".join(f"{quote(c)} {column_type(layout, c, t, key_columns)}" for c, t in columns.items())
    engine = _engine(layout, table, columns, order, partition)
    statements = [f"CREATE TABLE IF NOT EXISTS {layout.name(table)}{layout.on_cluster()} ({defs}) {engine}"]
    if layout.cluster:
        shard = f"cityHash64({', '.join(f.sql() for f in order)})" if order else "rand()"
        dist = (
            f"CREATE TABLE IF NOT EXISTS {layout.name(DIST_PREFIX + table)}{layout.on_cluster()} "
            f"AS {layout.name(table)} ENGINE = Distributed({literal(layout.cluster)}, {literal(layout.db)}, "
            f"{literal(table)}, {shard})"
        )
        statements.append(dist)
    return statements


def add_column_statements(layout: Layout, table: str, columns: Mapping[str, str]) -> list[str]:
    """One ALTER per column (so one that exists already fails alone), on the Distributed table too."""
    tables = [table, DIST_PREFIX + table] if layout.cluster else [table]
    return [
        f"ALTER TABLE {layout.name(t)}{layout.on_cluster()} ADD COLUMN {quote(c)} "
        f"{column_type(layout, c, sql_type, set())}"
        for c, sql_type in columns.items()
        for t in tables
    ]


def _order_fields(layout: Layout, columns: Mapping[str, str], keys: Sequence[str]) -> tuple[KeyField, ...]:
    if layout.order_fields:
        return layout.order_fields
    if keys:
        return tuple(KeyField(k) for k in keys)
    return (KeyField(DEFAULT_ORDER),) if DEFAULT_ORDER in columns else ()


def _partition_fields(layout: Layout, columns: Mapping[str, str]) -> tuple[KeyField, ...]:
    if layout.partition_fields:
        return layout.partition_fields
    function, column = DEFAULT_PARTITION
    return (KeyField(column, function),) if column in columns else ()


def _engine(
    layout: Layout,
    table: str,
    columns: Mapping[str, str],
    order: tuple[KeyField, ...],
    partition: tuple[KeyField, ...],
) -> str:
    if layout.raw_statement:
        raw = layout.raw_statement.strip()
        return raw if raw.upper().startswith("ENGINE") else f"ENGINE = {raw}"
    family = "ReplacingMergeTree" if order else "MergeTree"
    args = [quote(DEFAULT_VERSION)] if order and DEFAULT_VERSION in columns else []
    if layout.cluster:
        family = "Replicated" + family
        path = f"/clickhouse/tables/{{shard}}/{layout.db}/{table}"
        args = [literal(path), literal("{replica}"), *args]
    engine = f"ENGINE = {family}({', '.join(args)})"
    if partition:
        engine += f" PARTITION BY ({', '.join(f.sql() for f in partition)})"
    engine += f" ORDER BY ({', '.join(f.sql() for f in order)})" if order else " ORDER BY tuple()"
    if layout.primary_keys:
        engine += f" PRIMARY KEY ({', '.join(quote(k) for k in layout.primary_keys)})"
    return engine
