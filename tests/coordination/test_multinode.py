"""Two `eventspark serve` nodes sharing one coordination store (Redis or etcd) and one Postgres
destination in stream mode: concurrent schema changes and `/api/v1/cluster` (tests/coordination/nodes.py
has the nodes' config). A lock holder killed with SIGKILL is a test of the fault suite:
tests/faults/test_two_nodes.py.
"""

from __future__ import annotations

import re
import signal
import threading
from collections import Counter
from typing import Any

import httpx

from tests.collector.conftest import Server
from tests.coordination.conftest import Backend
from tests.coordination.nodes import (
    DEST,
    KEY,
    LOCK,
    StartNode,
    cluster,
    columns_of,
    post,
    rows_of,
    start_node_fixture,  # noqa: F401 (the fixture start_node)
    stored,
    trouble_in,
    wait_until,
)

THREADS = 6
EVENTS_PER_THREAD = 40
SHARED_COLUMNS = 20


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
