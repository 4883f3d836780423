"""Two `eventspark serve` nodes (Redis or etcd coordination, one Postgres destination in stream
mode); one is killed with SIGKILL while it holds the table lock: the other proceeds once the lock's
lease runs out (`coordination.lock_lease_sec`, 3 s here), nothing acknowledged is lost, and the
killed node delivers its own event once it is back (tests/coordination/nodes.py: the nodes)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx
import psycopg

from eventspark.coordination import Coordination
from tests.collector.conftest import Server
from tests.conftest import pg_conninfo
from tests.coordination.conftest import (  # noqa: F401 (fixtures: start_node needs a shared_backend)
    Backend,
    etcd_config,
    redis_config,
    shared_backend_fixture,
)
from tests.coordination.nodes import (
    HEARTBEAT_TTL_SEC,
    LEASE_SEC,
    StartNode,
    cluster,
    columns_of,
    lock_holder,
    post,
    query,
    rows_of,
    start_node_fixture,  # noqa: F401 (the fixture start_node)
    stored,
    trouble_in,
    wait_until,
)


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
    start_node: StartNode, shared_backend: Backend, pg_schema: str, figure: Any
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
    # Upper bounds with room: etcd finds expired leases on its own timer, its revoke is a disk write.
    assert LEASE_SEC * 0.5 <= lock_freed <= LEASE_SEC + 5, f"lock freed {lock_freed:.2f} s after the kill"
    assert HEARTBEAT_TTL_SEC * 0.5 <= unlisted <= HEARTBEAT_TTL_SEC + 5, f"unlisted after {unlisted:.2f} s"
    assert "from_a" not in columns_of(pg_schema)
    assert trouble_in(node_b) == [], node_b.text()

    # The killed node's event was received, so it is delivered when the node comes back.
    restarted = start_node("node-a")

    def a_delivered() -> bool:
        return rows_of(pg_schema).get("from-a", {}).get("from_a") == 1

    wait_until(a_delivered, timeout=15)
    assert cluster(restarted) == ["node-a", "node-b"]
    acknowledged = ["first", "from-a", "from-b"]
    delivered = [row["eventn_ctx_event_id"] for row in stored(pg_schema)]
    lost = len(set(acknowledged) - set(delivered))
    assert sorted(delivered) == acknowledged and lost == 0
    figure(
        f"{shared_backend.kind}: lease {LEASE_SEC:g} s, the other node proceeded after {lock_freed:.1f} s, "
        f"the killed node unlisted after {unlisted:.1f} s, acknowledged {len(acknowledged)}, lost {lost}"
    )
