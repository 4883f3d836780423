"""Two or more `eventspark serve` nodes sharing one coordination store (Redis or etcd) and one
Postgres destination in stream mode: the node config, the `start_node` fixture and the helpers of
tests/coordination/test_multinode.py and tests/faults/test_two_nodes.py.

Leases and heartbeat TTLs are 3 s here (`coordination.lock_lease_sec`, `heartbeat_ttl_sec`), and
each test has its own key prefix, Postgres schema and node names.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from eventspark.coordination import Coordination, LockTimeout
from tests.collector.conftest import Server, start_server
from tests.conftest import pg_conninfo
from tests.coordination.conftest import Backend

DEST = "pg"
LOCK = f"{DEST}_events"
KEY = "eventn_ctx_event_id"
S2S_TOKEN = "web-s2s"
ADMIN_TOKEN = "admin-secret"
LEASE_SEC = 3.0
HEARTBEAT_TTL_SEC = 3.0
TROUBLE = re.compile(r" (WARNING|ERROR|CRITICAL) |Traceback|refreshing the schema|already exists|deadlock")
"""Log lines that must not appear: refused DDL or inserts, retried batches, lost leases, crashes."""

StartNode = Callable[[str], Server]


def node_config(backend: Backend, datasource: dict[str, Any], name: str) -> dict[str, Any]:
    coordination = {
        backend.kind: backend.config,
        "key_prefix": backend.key_prefix,
        "lock_lease_sec": LEASE_SEC,
        "heartbeat_ttl_sec": HEARTBEAT_TTL_SEC,
    }
    layout = {"table_name_template": "events", "primary_key_fields": [KEY]}
    return {
        "server": {"name": name, "admin_token": ADMIN_TOKEN, "max_columns": 1000},
        "api_keys": [{"id": "web", "client_secret": "web-js", "server_secret": S2S_TOKEN}],
        "log": {"rotation_min": 60},
        "coordination": coordination,
        "stream": {"batch_wait_ms": 20, "retry_min_sec": 0.2, "retry_max_sec": 1, "poll_ms": 5},
        "destinations": {DEST: {"type": "postgres", "mode": "stream", "datasource": datasource, "data_layout": layout}},
    }


@pytest.fixture(name="start_node")  # a module that uses it imports start_node_fixture
def start_node_fixture(shared_backend: Backend, pg_datasource: dict[str, Any], tmp_path: Path) -> Iterator[StartNode]:
    """Starts `eventspark serve` nodes (each in its own directory); none outlives the test."""
    started: list[Server] = []

    def start(name: str) -> Server:
        directory = tmp_path / name
        directory.mkdir(exist_ok=True)
        server = start_server(directory, node_config(shared_backend, pg_datasource, name))
        started.append(server)
        return server

    yield start
    for server in started:
        if server.process.poll() is None:
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait()


# --- helpers ------------------------------------------------------------------------------------


def post(client: httpx.Client, server: Server, event: dict[str, Any]) -> bool:
    answer = client.post(f"{server.url}/api/v1/s2s/event", params={"token": S2S_TOKEN}, json=event)
    return answer.status_code == 200


def cluster(server: Server) -> list[str]:
    answer = httpx.get(f"{server.url}/api/v1/cluster", headers={"X-Admin-Token": ADMIN_TOKEN}, timeout=10)
    answer.raise_for_status()
    return [instance["name"] for instance in answer.json()["instances"]]


def query(sql: str, *args: Any) -> list[tuple[Any, ...]]:
    # A lock timeout: a query queued behind a blocked ALTER TABLE fails instead of hanging the suite.
    with psycopg.connect(pg_conninfo(), options="-c lock_timeout=10s") as conn:
        return conn.execute(sql, args).fetchall()


def stored(schema: str) -> list[dict[str, Any]]:
    """Every row of the events table as {column: value}; [] before the table exists."""
    try:
        return [row for (row,) in query(f'SELECT to_jsonb(e) FROM "{schema}".events e')]
    except psycopg.errors.UndefinedTable:
        return []


def rows_of(schema: str) -> dict[str, dict[str, Any]]:
    """The stored rows by event id."""
    return {row[KEY]: row for row in stored(schema)}


def columns_of(schema: str) -> set[str]:
    sql = "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = 'events'"
    return {name for (name,) in query(sql, schema)}


def wait_until(condition: Callable[[], bool], timeout: float, period: float = 0.05) -> float:
    """Seconds it took `condition` to hold; fails the test after `timeout`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            pytest.fail(f"{condition.__name__} still false after {timeout} s")
        time.sleep(period)
    return time.monotonic() - started


def trouble_in(server: Server) -> list[str]:
    return [line for line in server.text().splitlines() if TROUBLE.search(line)]


def lock_holder(probe: Coordination) -> str | None:
    """The node holding the table lock, found by trying it without waiting (None: it was free)."""
    try:
        with probe.lock(LOCK, timeout=0):
            return None
    except LockTimeout as exc:
        return exc.holder
