"""The warehouse down for minutes under load, batch and stream (issue 18; docs/reliability.md).

One `eventspark serve` (a subprocess) with a batch and a stream destination on the same warehouse;
three clients post events all along. The warehouse goes away for the outage (PostgreSQL killed,
ClickHouse killed, MySQL's connections cut and refused) and comes back; batch passes run during
the outage and after it (3 s rotation, 2 s uploader period, `retry: {base_sec: 1, max_sec: 5}`).
Halfway through the outage serve itself is restarted: with SIGTERM while PostgreSQL is down, with
SIGKILL while MySQL's connections are cut (jitsu#1023 lost events to a restart after an outage).
Then every acknowledged event is in each table exactly once, `failed/` is empty (the default
maximum age is 72 h), the stream queue is acknowledged, every log archived, and serve stops
cleanly with no traceback.

The outage lasts `EVENTSPARK_FAULT_OUTAGE_SEC` seconds when set, else 120 s for PostgreSQL and 60 s
for ClickHouse and MySQL. Every server stopped here is the suite's own (a private PostgreSQL, the
private ClickHouse, a TCP proxy in front of the machine's MariaDB).
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from tests.collector import conftest as collector_fixtures
from tests.collector.conftest import Server
from tests.destinations import conftest as destination_fixtures
from tests.destinations.conftest import MYSQL_PORT, ClickHouseServer
from tests.destinations.proxy import TcpProxy
from tests.faults.warehouses import (
    BATCH,
    STREAM,
    Node,
    Outcome,
    PostgresTable,
    Table,
    as_batch,
    assert_settled,
    node_config,
    outage_sec,
    outage_under_load,
)
from tests.private_postgres import PostgresServer
from tests.stream.helpers import postgres_stream
from tests.stream.warehouses import ClickHouseTable, MySQLTable, clickhouse_stream, kill_clickhouse, mysql_stream

# Fixtures of conftests this directory does not see. Tests list `run_server` after the warehouse's
# fixtures, so that serve is gone before their teardown drops the schema or database.
run_server = collector_fixtures.run_server
clickhouse_server = destination_fixtures.clickhouse_server
clickhouse_db = destination_fixtures.clickhouse_db
mysql_db = destination_fixtures.mysql_db

POSTGRES_OUTAGE_SEC = outage_sec(120)
CLICKHOUSE_OUTAGE_SEC = outage_sec(60)
MYSQL_OUTAGE_SEC = outage_sec(60)
TABLES = {BATCH: "events_batch", STREAM: "events_stream"}


def check(outcome: Outcome) -> None:
    """The promise: nothing lost, nothing twice, nothing failed; and the outage was really seen
    (batch passes ran and failed during it, the stream worker retried)."""
    for dest in (BATCH, STREAM):
        assert outcome.lost(dest) == 0, f"{dest}: {outcome.lost(dest)} acknowledged events are not in the table"
        assert outcome.duplicated(dest) == 0, f"{dest}: {outcome.duplicated(dest)} duplicate rows"
    assert outcome.failed_lines == 0
    assert outcome.during > 0, "the collector acknowledged nothing during the outage"
    assert outcome.seen.passes >= 2, "no batch passes ran during the outage"
    assert outcome.seen.failed_passes > 0, "no batch pass saw the outage"
    assert outcome.seen.stream_retries > 0, "the stream worker never saw the outage"


def run(
    run_server: Any,
    batch: dict[str, Any],
    stream: dict[str, Any],
    tables: dict[str, Table],
    down: Callable[[], None],
    up: Callable[[], None],
    outage: float,
    figure: Callable[[str], None],
    restart: signal.Signals | None = None,
    extra: Callable[[], str] | None = None,
) -> Outcome:
    """The scenario, serve restarted halfway through the outage with `restart` when given; the
    figure is recorded before anything is asserted on the outcome."""
    config = node_config(batch, stream)
    node = Node([run_server(config)])
    if restart is not None:
        node.restart, node.restart_name = restarter(run_server, config, restart), restart.name
    outcome = outage_under_load(node, tables, down, up, outage)
    if extra is not None:
        outcome.extra.append(extra())
    figure(outcome.figure())
    assert_settled(node)
    check(outcome)
    return outcome


def restarter(run_server: Any, config: dict[str, Any], sig: signal.Signals) -> Callable[[Server], Server]:
    """Stops serve with `sig` and starts it again on the same port and events directory."""

    def restart(server: Server) -> Server:
        code = server.stop(sig)
        if sig != signal.SIGKILL:
            assert code == 0, f"serve exited with {code} on {sig.name}:\n{server.text()[-3000:]}"
        return run_server(config, port=int(server.url.rsplit(":", 1)[1]))

    return restart


@pytest.fixture
def pg_schema_private(private_postgres: PostgresServer) -> Iterator[str]:
    """A fresh schema name on the private server, dropped afterwards (the server is up again by then)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    if not private_postgres.is_up():
        private_postgres.start()
    with psycopg.connect(private_postgres.conninfo(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'.encode())


def test_postgres_killed_for_minutes_serve_restarted(
    private_postgres: PostgresServer, pg_schema_private: str, run_server: Any, figure: Callable[[str], None]
) -> None:
    stream = postgres_stream(private_postgres.datasource(pg_schema_private), TABLES[STREAM])
    conninfo = private_postgres.conninfo()
    tables: dict[str, Table] = {d: PostgresTable(conninfo, pg_schema_private, t) for d, t in TABLES.items()}

    def up() -> None:
        if not private_postgres.is_up():
            private_postgres.start()

    batch = as_batch(stream, TABLES[BATCH])
    run(run_server, batch, stream, tables, private_postgres.kill, up, POSTGRES_OUTAGE_SEC, figure, signal.SIGTERM)


def test_clickhouse_killed_for_minutes_under_load(
    clickhouse_server: ClickHouseServer, clickhouse_db: str, run_server: Any, figure: Callable[[str], None]
) -> None:
    stream = clickhouse_stream(clickhouse_server, clickhouse_db, TABLES[STREAM])
    readers = {d: ClickHouseTable(clickhouse_server, clickhouse_db, t) for d, t in TABLES.items()}

    def stored_rows() -> str:
        # Queries see each event once through FINAL (ReplacingMergeTree on the event id). Without
        # transactions a load cut between copy and marker is copied again (documented in
        # destinations/clickhouse/load.py): the rows stored before merges show whether it happened.
        rows = {d.split("_")[1]: reader.counts(final=False)[0] for d, reader in readers.items()}
        return "rows stored before merges: " + ", ".join(f"{d} {n:,}" for d, n in rows.items())

    def down() -> None:
        kill_clickhouse(clickhouse_server)

    tables: dict[str, Table] = dict(readers)
    batch = as_batch(stream, TABLES[BATCH])
    up = clickhouse_server.start
    run(run_server, batch, stream, tables, down, up, CLICKHOUSE_OUTAGE_SEC, figure, extra=stored_rows)


def test_mysql_connections_cut_for_minutes_serve_killed(
    mysql_db: str, run_server: Any, figure: Callable[[str], None]
) -> None:
    with TcpProxy("127.0.0.1", MYSQL_PORT) as proxy:
        stream = mysql_stream(proxy.port, mysql_db, TABLES[STREAM])
        # Read straight from the server: the test's own queries are not cut.
        tables: dict[str, Table] = {d: MySQLTable(MYSQL_PORT, mysql_db, t) for d, t in TABLES.items()}
        batch = as_batch(stream, TABLES[BATCH])
        run(run_server, batch, stream, tables, proxy.stop, proxy.start, MYSQL_OUTAGE_SEC, figure, signal.SIGKILL)
