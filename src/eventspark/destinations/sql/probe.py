"""The SQL warehouses' probe (`DestinationType.probe`): create a small table, see it, drop it.

The table is named `_eventspark_probe_<job id>` (a job id sorts by time, so a leftover is easy
to date) and has the two columns every event table has, in the dialect's types. It is created
through the adapter's own `patch` (so the same DDL, engine and permissions as a real table),
read back with `read_table`, and dropped. Connecting runs what every connection runs (the schema
and the marker table, created when missing), as the node itself would on its first load.
"""

from __future__ import annotations

import time
from typing import Any

from eventspark.destinations.base import TerminalError, new_job_id
from eventspark.steps.diff import TablePatch
from eventspark.steps.typing import DataType

PROBE_PREFIX = "_eventspark_probe_"
PROBE_COLUMNS = {"eventn_ctx_event_id": DataType.STRING, "_timestamp": DataType.TIMESTAMP}


def probe_table_name() -> str:
    return PROBE_PREFIX + new_job_id(time.time())


def probe(adapter: Any, send_event: bool = False) -> str:
    """Creates, reads back and drops a probe table; DestinationError with the warehouse's message."""
    table = probe_table_name()
    columns = {name: adapter.dialect.types[data_type] for name, data_type in PROBE_COLUMNS.items()}
    try:
        adapter.patch(TablePatch(table, create=True, add_columns=columns))
        try:
            if adapter.read_table(table) is None:
                raise TerminalError(f"{adapter.dialect.name}: table {table!r} was created but cannot be read back")
        finally:
            drop_table(adapter, table)
    finally:
        adapter.close()
    return f"created, read and dropped table {table}"


def drop_table(adapter: Any, table: str) -> None:
    """Drops the probe table: the adapter's `drop_statements(table)` when it has its own (a
    ClickHouse cluster's), else `DROP TABLE <schema>.<table>`."""
    own = getattr(adapter, "drop_statements", None)
    statements = own(table) if own is not None else [f"DROP TABLE {adapter.name(table)}"]
    with adapter._session() as client:
        for statement in statements:
            client.execute(statement, f"dropping probe table {table!r}")
