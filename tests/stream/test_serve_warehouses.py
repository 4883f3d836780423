"""ClickHouse and MySQL in `mode: stream`, end to end through `eventspark serve` (a subprocess):
events posted over HTTP reach the table; a warehouse killed with SIGKILL under load and started
again, or serve itself killed and restarted, leaves every acknowledged event in the table once
and none in `failed`."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import httpx

from eventspark.stream.queue import QueueReader, queue_dir
from tests.collector import conftest as collector_fixtures
from tests.collector.conftest import Server
from tests.destinations import conftest as destination_fixtures
from tests.destinations.conftest import MYSQL_PORT, ClickHouseServer
from tests.stream import warehouses
from tests.stream.warehouses import (
    S2S_PATH,
    ClickHouseTable,
    Load,
    MariaDBServer,
    MySQLTable,
    clickhouse_stream,
    event_id,
    kill_clickhouse,
    mysql_stream,
    queued_bytes,
    serve_config,
    wait_for_counts,
)

# Fixtures of conftests this directory does not see.
run_server = collector_fixtures.run_server
clickhouse_server = destination_fixtures.clickhouse_server
clickhouse_db = destination_fixtures.clickhouse_db
mysql_db = destination_fixtures.mysql_db
private_mariadb = warehouses.private_mariadb

DEST = "live"
OUTAGE_SEC = 3.0


def failed_events(server: Server) -> list[bytes]:
    path = server.events_dir / "failed" / f"failed.dst={DEST}.log"
    return path.read_bytes().splitlines() if path.exists() else []


def assert_every_acknowledged_event_once(table: ClickHouseTable | MySQLTable, load: Load, *servers: Server) -> None:
    """Waits for the acknowledged events, then: each is in the table once, nothing else is, none
    failed, the worker acknowledged its whole queue, and no process logged a traceback."""
    wanted = {event_id(n) for n in load.acknowledged}
    stored = wait_for_ids(table, wanted, 60)
    missing = wanted - stored.keys()
    assert not missing, f"{len(missing)} acknowledged events are not in the table, e.g. {sorted(missing)[:5]}"
    rows, distinct = table.counts()
    assert rows == distinct == len(stored), f"{rows - distinct} duplicate rows"
    assert stored.keys() <= load.sent_ids(), "the table holds events nobody sent"
    assert all(key == event_id(n) for key, n in stored.items()), "an event's fields were mixed up"
    last = servers[-1]
    assert failed_events(last) == []
    queue = queue_dir(last.events_dir, DEST)
    deadline = time.monotonic() + 30
    while queued_bytes(queue) > 0:
        assert time.monotonic() < deadline, "every event is in the table, yet the worker does not acknowledge them"
        time.sleep(0.1)
    for server in servers:
        assert "Traceback" not in server.text(), server.text()[-3000:]


def wait_for_ids(table: ClickHouseTable | MySQLTable, wanted: set[str], timeout: float) -> dict[str, int]:
    """Polls the table until it holds every id of `wanted` or `timeout` passes; its last content."""
    deadline = time.monotonic() + timeout
    stored = table.ids_and_numbers()
    while not wanted <= stored.keys() and time.monotonic() < deadline:
        time.sleep(0.2)
        stored = table.ids_and_numbers()
    return stored


def post_numbered(url: str, numbers: range) -> None:
    with httpx.Client(base_url=url, timeout=10) as client:
        for n in numbers:
            body = {"event_type": "load", "eventn_ctx": {"event_id": event_id(n)}, "n": n, "page": {"path": f"/p{n}"}}
            assert client.post(S2S_PATH, json=body).status_code == 200


def wait_for_rows(table: ClickHouseTable | MySQLTable, at_least: int, server: Server) -> None:
    """Until the worker created the table and loaded `at_least` events (the load is flowing)."""
    found = wait_for_counts(table.counts, at_least, 60)
    assert found[1] >= at_least, f"only {found} rows after 60 s:\n{server.text()[-3000:]}"


# --- events arrive ------------------------------------------------------------------------------


def test_clickhouse_stream_events_arrive(
    run_server: Any, clickhouse_server: ClickHouseServer, clickhouse_db: str
) -> None:
    server = run_server(serve_config({DEST: clickhouse_stream(clickhouse_server, clickhouse_db)}))
    post_numbered(server.url, range(50))
    table = ClickHouseTable(clickhouse_server, clickhouse_db)
    assert wait_for_counts(table.counts, 50, 60) == (50, 50)
    assert table.ids_and_numbers() == {event_id(n): n for n in range(50)}
    assert table.values_of("page_path", 7) == ["/p7"]
    assert failed_events(server) == []
    assert server.stop() == 0


def test_mysql_stream_events_arrive(run_server: Any, mysql_db: str) -> None:
    server = run_server(serve_config({DEST: mysql_stream(MYSQL_PORT, mysql_db)}))
    post_numbered(server.url, range(50))
    table = MySQLTable(MYSQL_PORT, mysql_db)
    assert wait_for_counts(table.counts, 50, 60) == (50, 50)
    assert table.ids_and_numbers() == {event_id(n): n for n in range(50)}
    assert table.values_of("page_path", 7) == ["/p7"]
    assert failed_events(server) == []
    assert server.stop() == 0


# --- the warehouse killed under load ------------------------------------------------------------


def _outage_under_load(
    server: Server, table: ClickHouseTable | MySQLTable, kill: Callable[[], None], start: Callable[[], None]
) -> None:
    """Posts events while the warehouse is killed, down for OUTAGE_SEC and started again."""
    load = Load(server.url, threads=2, pause=0.002)
    load.start()
    try:
        wait_for_rows(table, 200, server)
        kill()
        during = len(load.acknowledged)
        time.sleep(OUTAGE_SEC)
        # The collector keeps accepting while the warehouse is away.
        assert len(load.acknowledged) > during + 100
        start()
        time.sleep(2)  # events keep coming while the worker reconnects
    finally:
        start()  # idempotent; others need the server whatever happened here
        load.stop()
    assert load.refused == [] and load.transport_errors == 0
    assert_every_acknowledged_event_once(table, load, server)


def test_clickhouse_killed_under_load_loses_and_duplicates_nothing(
    run_server: Any, clickhouse_server: ClickHouseServer, clickhouse_db: str
) -> None:
    server = run_server(serve_config({DEST: clickhouse_stream(clickhouse_server, clickhouse_db)}))
    table = ClickHouseTable(clickhouse_server, clickhouse_db)
    _outage_under_load(server, table, lambda: kill_clickhouse(clickhouse_server), clickhouse_server.start)
    assert server.stop() == 0


def test_mariadb_killed_under_load_loses_and_duplicates_nothing(
    run_server: Any, private_mariadb: MariaDBServer
) -> None:
    server = run_server(serve_config({DEST: mysql_stream(private_mariadb.port, "analytics")}))
    table = MySQLTable(private_mariadb.port, "analytics")
    _outage_under_load(server, table, private_mariadb.kill, private_mariadb.start)
    assert server.stop() == 0


# --- serve killed under load --------------------------------------------------------------------


def _pending_bytes(server: Server) -> int:
    reader = QueueReader(queue_dir(server.events_dir, DEST))
    reader.open()
    try:
        return reader.pending_bytes()
    finally:
        reader.close()


def _wait_until_queued(server: Server, load: Load, timeout: float = 30) -> None:
    """Until the queue holds events the worker has not acknowledged yet: the moment to kill."""
    queue = queue_dir(server.events_dir, DEST)
    deadline = time.monotonic() + timeout
    while queued_bytes(queue) == 0:
        assert time.monotonic() < deadline, f"the worker kept the queue empty for {timeout} s"
        assert load.refused == [], load.refused[:5]
        time.sleep(0.001)


def _serve_killed_under_load(run_server: Any, config: dict[str, Any], table: ClickHouseTable | MySQLTable) -> None:
    server = run_server(config)
    port = int(server.url.rsplit(":", 1)[1])
    load = Load(server.url, threads=4)
    load.start()
    try:
        wait_for_rows(table, 300, server)
        servers, pending = [server], 0
        # A fast worker can drain the queue between the check and the kill: kill again (on the
        # restarted process, under the same load) until a kill lands with events unacknowledged.
        for _attempt in range(3):
            _wait_until_queued(servers[-1], load)
            servers[-1].stop(signal.SIGKILL)
            pending = _pending_bytes(servers[-1])
            servers.append(run_server(config, port=port))
            if pending > 0:
                break
        time.sleep(2)  # the posters go on against the new process
    finally:
        load.stop()
    assert pending > 0, "the queue was empty at each of 3 kills: the test proves nothing"
    assert load.refused == []
    assert_every_acknowledged_event_once(table, load, *servers)
    assert servers[-1].stop() == 0


def test_serve_killed_under_load_clickhouse(
    run_server: Any, clickhouse_server: ClickHouseServer, clickhouse_db: str
) -> None:
    config = serve_config({DEST: clickhouse_stream(clickhouse_server, clickhouse_db)})
    _serve_killed_under_load(run_server, config, ClickHouseTable(clickhouse_server, clickhouse_db))


def test_serve_killed_under_load_mysql(run_server: Any, mysql_db: str) -> None:
    config = serve_config({DEST: mysql_stream(MYSQL_PORT, mysql_db)})
    _serve_killed_under_load(run_server, config, MySQLTable(MYSQL_PORT, mysql_db))
