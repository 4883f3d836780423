"""Warehouses: the adapter contract (`base`), shared load SQL and one package per warehouse.

`build_destination` makes the adapter of a configured destination; drivers are imported only for
the destinations in use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eventspark.destinations.base import DestinationAdapter, DestinationError, TerminalError, TransientError

__all__ = ["DestinationAdapter", "DestinationError", "TerminalError", "TransientError", "build_destination"]

BATCH_TYPES = frozenset({"postgres", "duckdb", "clickhouse", "mysql"})
"""Destination types the batch job can load so far."""


def build_destination(dest_id: str, dest: Any, events_dir: Path) -> DestinationAdapter:
    """The adapter of destination config `dest`; does no I/O.

    `events_dir` is `log.path`: relative DuckDB paths live under it, and so does the `staging/`
    folder where executors write files for warehouses loaded from files.
    """
    if dest.type == "postgres":
        from eventspark.destinations.postgres.adapter import PostgresAdapter

        return PostgresAdapter(dest_id, dest)
    if dest.type == "duckdb":
        from eventspark.destinations.duckdb.adapter import DuckDBAdapter

        path = Path(dest.duckdb.path)
        path = path if path.is_absolute() else events_dir / path
        return DuckDBAdapter(dest_id, path, dest.duckdb.schema_ or "main", events_dir / "staging")
    if dest.type == "clickhouse":
        from eventspark.destinations.clickhouse.adapter import ClickHouseAdapter

        return ClickHouseAdapter(dest_id, dest)
    if dest.type == "mysql":
        from eventspark.destinations.mysql.adapter import MySQLAdapter

        return MySQLAdapter(dest_id, dest)
    raise TerminalError(f"destination {dest_id!r}: type {dest.type!r} has no batch loader yet")
