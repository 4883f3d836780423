"""Users recognition across nodes and restarts (stream workers on real Postgres, DuckDB and Redis):
- two nodes share the Redis index: the identification one node receives settles the anonymous rows
  the other node loaded, and the user column it adds goes through the coordination store (lock,
  version) like any table patch, so the other node reads the table again;
- a worker that dies after its flush's acknowledgement, before settling, loses no id;
- the user columns obey `schema_freeze`."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
import redis

from eventspark.coordination import Coordination, MemoryCoordination
from eventspark.destinations.sync import table_lock
from eventspark.stream.manager import StreamWorkers
from eventspark.stream.queue import QueueWriter, queue_dir
from tests.conftest import pg_conninfo
from tests.recognition.helpers import ANONYMOUS, EXPECTED, IDENTIFY, KEY, RECOGNITION, page
from tests.stream.helpers import FAST, Harness, duckdb_stream, make_config, postgres_stream

REDIS_META = {"storage": {"redis": {"host": "127.0.0.1", "port": 6379}}}


@pytest.fixture
def dest_id() -> Iterator[str]:
    """A destination id of its own: the Redis keys of the test (index, events cache) are its."""
    client = redis.Redis(host="127.0.0.1", port=6379)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"Redis at 127.0.0.1:6379 is needed (scripts/test-services.sh): {exc}")
    found = f"pg{uuid.uuid4().hex[:10]}"
    yield found
    keys = list(client.scan_iter(match=f"eventspark:*{found}*"))
    if keys:
        client.delete(*keys)
    client.close()


def node(root: Path, dest_id: str, dest: dict[str, Any], coordination: Coordination, **extra: Any) -> Harness:
    """One node's stream worker of `dest` (its own log.path), on a coordination store it shares."""
    root.mkdir(exist_ok=True)
    loaded = make_config(root, {dest_id: dest}, **RECOGNITION, **extra)
    worker = StreamWorkers(loaded, coordination, FAST).build(dest_id, loaded.config.destinations[dest_id])
    worker.open()
    return Harness(loaded, dest_id, worker, QueueWriter(queue_dir(Path(loaded.config.log.path), dest_id)))


def pg_read(schema: str, table: str) -> dict[str, Any]:
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        return dict(conn.execute(f'SELECT {KEY}, user_id FROM "{schema}"."{table}"').fetchall())


def test_two_nodes_share_the_redis_index(
    tmp_path: Path, dest_id: str, pg_datasource: dict[str, Any], pg_schema: str
) -> None:
    coordination = MemoryCoordination("shared")  # as a Redis or etcd store both nodes use
    dest = postgres_stream(pg_datasource, "{{.event_type}}")
    first = node(tmp_path / "n1", dest_id, dest, coordination, meta=REDIS_META)
    second = node(tmp_path / "n2", dest_id, dest, coordination, meta=REDIS_META)
    try:
        first.append(*ANONYMOUS)
        first.drain()
        version = coordination.table_version(table_lock(dest_id, "pageview"))
        second.append(*IDENTIFY)  # the login reaches the other node
        second.drain()
        assert {table: pg_read(pg_schema, table) for table in EXPECTED} == EXPECTED
        # user_id was added to pageview as a table patch: its version moved (node 1 reads it again)
        assert coordination.table_version(table_lock(dest_id, "pageview")) == version + 1
        first.append(page(6, "a1"), page(8, "a2", id="u2"))  # node 1 learns a2's user in a flush
        first.drain()
        assert pg_read(pg_schema, "pageview") == {**EXPECTED["pageview"], "e0003": "u2", "e0006": "u1", "e0008": "u2"}
        assert first.failed() == [] and second.failed() == []
    finally:
        first.close()
        second.close()


def test_a_worker_dying_before_it_settles_loses_no_id(
    tmp_path: Path, dest_id: str, pg_datasource: dict[str, Any], pg_schema: str
) -> None:
    dest = postgres_stream(pg_datasource, "{{.event_type}}")
    dying = node(tmp_path, dest_id, dest, MemoryCoordination("a"), meta=REDIS_META)
    recognition = dying.worker.recognition
    assert recognition is not None
    recognition.interval = 3600.0  # settles later (as ClickHouse does): the ids wait in the index
    dying.append(*ANONYMOUS, *IDENTIFY)
    dying.drain()
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        sql = "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = 'pageview'"
        assert "user_id" not in {row[0] for row in conn.execute(sql, [pg_schema])}  # not settled yet
    dying.worker.recognition = None  # it dies: no settle at close
    dying.close()
    restarted = node(tmp_path, dest_id, dest, MemoryCoordination("b"), meta=REDIS_META)
    try:
        restarted.append(page(9, "a9"))  # its first flush settles what the dead worker left
        restarted.drain()
        expected = {**EXPECTED, "pageview": {**EXPECTED["pageview"], "e0009": None}}
        assert {table: pg_read(pg_schema, table) for table in EXPECTED} == expected
    finally:
        restarted.close()


def test_user_columns_obey_schema_freeze(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    dest = duckdb_stream(path, "{{.event_type}}", schema_freeze=True)
    harness = node(tmp_path, "dd", dest, MemoryCoordination("a"))
    try:
        harness.append(*ANONYMOUS)
        harness.drain()
        harness.append(*IDENTIFY)
        harness.drain()
        harness.worker.delivery.adapter.close()
        with duckdb.connect(str(path)) as conn:
            columns = {row[0] for row in conn.execute("DESCRIBE pageview").fetchall()}
            identify = conn.execute(f"SELECT {KEY}, user_id FROM identify").fetchall()
        assert "user_id" not in columns  # frozen: the rows stay anonymous, nothing fails
        assert identify == [("e0005", "u1")]
        assert harness.failed() == []
    finally:
        harness.close()
