"""Two `eventspark serve` nodes sharing one coordination store (Redis or etcd) and one Postgres
destination in stream mode: concurrent schema changes, a lock holder killed with SIGKILL, and
`/api/v1/cluster`.

Leases and heartbeat TTLs are 3 s here (`coordination.lock_lease_sec`, `heartbeat_ttl_sec`), and
each test has its own key prefix, Postgres schema and node names.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import Counter
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
THREADS = 6
EVENTS_PER_THREAD = 40
SHARED_COLUMNS = 20
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


@pytest.fixture
def start_node(shared_backend: Backend, pg_datasource: dict[str, Any], tmp_path: Path) -> Iterator[StartNode]:
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


# --- concurrent schema changes ------------------------------------------------------------------


def make_event(thread: int, n: int) -> dict[str, Any]:
    """The n-th event of a posting thread; every thread sends the same shared columns at about the
    same time (to both nodes), plus a few columns only it sends."""
    return {
        "eventn_ctx": {"event_id": f"t{thread}-{n:03d}"},
        "event_type": "multinode",
        "thread": thread,
        "n": n,
        f"shared_{n % SHARED_COLUMNS}": n,
        f"own_{thread}_{n % 4}": f"{thread}/{n}",
    }


def post_concurrently(nodes: list[Server]) -> list[str]:
    """THREADS threads post their events alternately to each node; returns the acknowledged ids."""
    acknowledged: list[str] = []
    guard = threading.Lock()
    barrier = threading.Barrier(THREADS)

    def run(thread: int) -> None:
        with httpx.Client(timeout=30) as client:
            barrier.wait()
            for n in range(EVENTS_PER_THREAD):
                event = make_event(thread, n)
                if post(client, nodes[(thread + n) % len(nodes)], event):
                    with guard:
                        acknowledged.append(event["eventn_ctx"]["event_id"])

    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return acknowledged


def expected_row(thread: int, n: int) -> dict[str, Any]:
    """The stored row of `make_event(thread, n)`: its own values, null in every other event column."""
    row: dict[str, Any] = {f"shared_{k}": None for k in range(SHARED_COLUMNS)}
    row |= {f"own_{t}_{k}": None for t in range(THREADS) for k in range(4)}
    event = make_event(thread, n)
    row |= {name: value for name, value in event.items() if name != "eventn_ctx"}
    row[KEY] = event["eventn_ctx"]["event_id"]
    return row


def test_two_nodes_add_columns_at_once_without_ddl_errors_or_lost_events(
    start_node: StartNode, shared_backend: Backend, pg_schema: str
) -> None:
    nodes = [start_node("node-a"), start_node("node-b")]
    assert cluster(nodes[0]) == cluster(nodes[1]) == ["node-a", "node-b"]

    acknowledged = post_concurrently(nodes)
    assert len(acknowledged) == THREADS * EVENTS_PER_THREAD

    def all_delivered() -> bool:
        return len(rows_of(pg_schema)) >= len(acknowledged)

    wait_until(all_delivered, timeout=30)
    assert Counter(row[KEY] for row in stored(pg_schema)) == Counter(acknowledged)  # each exactly once
    rows = rows_of(pg_schema)
    expected = {f"t{t}-{n:03d}": expected_row(t, n) for t in range(THREADS) for n in range(EVENTS_PER_THREAD)}
    assert {key: {c: row[c] for c in expected[key]} for key, row in rows.items()} == expected
    assert set(expected_row(0, 0)) <= columns_of(pg_schema)

    for node in nodes:
        assert trouble_in(node) == [], node.text()
        assert not any((node.events_dir / "failed").glob("*")), "events were sent to failed/"
    # Every patch, by either node, bumped the table version exactly once; both nodes patched.
    patches = [len(re.findall(rf"{DEST}/events: patched", node.text())) for node in nodes]
    assert all(patches), patches
    assert shared_backend.node("probe").table_version(LOCK) == sum(patches)

    assert nodes[1].stop(signal.SIGTERM) == 0
    assert cluster(nodes[0]) == ["node-a"]  # a node that stops cleanly leaves at once


# --- a lock holder killed ------------------------------------------------------------------------


def waiting_ddl(schema: str) -> list[int]:
    """Backends whose ALTER TABLE on `schema` waits for a table lock."""
    found = query(
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'ALTER TABLE%%' "
        "AND position(%s in query) > 0",
        f'"{schema}"',
    )
    return [pid for (pid,) in found]


def block_node_a_in_ddl(node_a: Server, blocker: psycopg.Connection[Any], schema: str, probe: Coordination) -> int:
    """Makes node A take the table lock and stay in its ALTER TABLE (a Postgres lock taken by the
    test keeps the DDL waiting); returns the pid of A's waiting backend.

    Until the blocker lets go, nothing may read the table: reads queue behind the ALTER TABLE."""
    blocker.execute(f'LOCK TABLE "{schema}".events IN ACCESS SHARE MODE')
    with httpx.Client(timeout=10) as client:
        assert post(client, node_a, {"eventn_ctx": {"event_id": "from-a"}, "from_a": 1})

    def a_waits_in_ddl() -> bool:
        return len(waiting_ddl(schema)) == 1

    wait_until(a_waits_in_ddl, timeout=15)
    assert lock_holder(probe) == "node-a"
    return waiting_ddl(schema)[0]


def test_lock_of_a_killed_node_expires_and_the_other_node_proceeds(
    start_node: StartNode, shared_backend: Backend, pg_schema: str
) -> None:
    node_a, node_b = start_node("node-a"), start_node("node-b")
    probe = shared_backend.node("probe")
    with httpx.Client(timeout=10) as client:
        assert post(client, node_a, {"eventn_ctx": {"event_id": "first"}, "base": 1})

        def table_exists() -> bool:
            return "first" in rows_of(pg_schema)

        wait_until(table_exists, timeout=15)
        with psycopg.connect(pg_conninfo()) as blocker:
            ddl_of_a = block_node_a_in_ddl(node_a, blocker, pg_schema, probe)
            assert post(client, node_b, {"eventn_ctx": {"event_id": "from-b"}, "from_b": 2})
            time.sleep(LEASE_SEC * 1.5)  # longer than the lease: only its renewal keeps A's lock
            assert lock_holder(probe) == "node-a"
            # B has had ample time to reach its own ALTER TABLE: it waits for the coordination lock.
            assert waiting_ddl(pg_schema) == [ddl_of_a]
            os.kill(node_a.process.pid, signal.SIGKILL)
            killed = time.monotonic()
            node_a.process.wait()
            blocker.rollback()  # A's DDL is rolled back by Postgres when it sees A's connection gone
            assert cluster(node_b) == ["node-a", "node-b"]  # listed until its heartbeat expires

    def b_delivered() -> bool:
        return rows_of(pg_schema).get("from-b", {}).get("from_b") == 2

    wait_until(b_delivered, timeout=LEASE_SEC + 10)
    lock_freed = time.monotonic() - killed

    def a_unlisted() -> bool:
        return cluster(node_b) == ["node-b"]

    wait_until(a_unlisted, timeout=HEARTBEAT_TTL_SEC + 10, period=0.1)
    unlisted = time.monotonic() - killed
    # The lease had between 2/3 and all of its length left at the kill, the heartbeat likewise.
    assert LEASE_SEC * 0.5 <= lock_freed <= LEASE_SEC + 3, f"lock freed {lock_freed:.2f} s after the kill"
    assert HEARTBEAT_TTL_SEC * 0.5 <= unlisted <= HEARTBEAT_TTL_SEC + 3, f"unlisted after {unlisted:.2f} s"
    assert "from_a" not in columns_of(pg_schema)
    assert trouble_in(node_b) == [], node_b.text()

    # The killed node's event was received, so it is delivered when the node comes back.
    restarted = start_node("node-a")

    def a_delivered() -> bool:
        return rows_of(pg_schema).get("from-a", {}).get("from_a") == 1

    wait_until(a_delivered, timeout=15)
    assert cluster(restarted) == ["node-a", "node-b"]
    assert sorted(rows_of(pg_schema)) == ["first", "from-a", "from-b"]
