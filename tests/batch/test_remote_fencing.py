"""A pass over `log.remote` whose cluster lock was lost mid-pass stops before its next step that
changes shared state, and the next pass (another node) loads every event exactly once. Moto's S3
server, the shared SparkSession, the machine's Postgres and Redis (a key prefix per test)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis

from eventspark.batch.process import PassBusy, run_pass
from eventspark.config import LoadedConfig
from eventspark.config.models import CoordinationConfig, RedisConfig
from eventspark.coordination import Coordination, LockLost, build_coordination
from eventspark.logs.store import remote_lock_name
from tests.batch.helpers import event, make_config, pg_rows, postgres_destination
from tests.batch.test_remote_pass import archived, incoming_names, put_remote, remote_section, remote_status

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
LEASE_SECONDS = 0.9
"""Renewed every 0.3 s: a fault hook that waits longer than that finds the loss seen by the pass."""


@pytest.fixture
def prefix() -> Iterator[str]:
    """A key prefix of this test's own on the shared Redis, its keys removed afterwards."""
    made = f"es-fencing-{uuid.uuid4().hex[:10]}:"
    yield made
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT)
    try:
        keys = list(client.scan_iter(match=made + "*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def nodes(prefix: str) -> Iterator[dict[str, Coordination]]:
    """Three nodes sharing the test's Redis prefix, with short leases."""
    section = CoordinationConfig(
        redis=RedisConfig(host=REDIS_HOST, port=REDIS_PORT), key_prefix=prefix, lock_lease_sec=LEASE_SECONDS
    )
    made = {name: build_coordination(section, name) for name in ("node-a", "node-b", "node-c")}
    yield made
    for coordination in made.values():
        coordination.close()


def node_config(root: Path, remote: dict[str, Any], pg: dict[str, Any], name: str) -> LoadedConfig:
    """A node of its own (`log.path`, config file) sharing the store and the warehouse."""
    # Two tables, `a` and `b`: two pairs, committed one after the other.
    (root / name).mkdir(exist_ok=True)
    return make_config(
        root / name,
        {"pg": postgres_destination(pg, "{{.event_type}}")},
        log={"path": str(root / name / "events"), "remote": remote},
        server={"name": name},
        coordination={"type": "inmemory"},  # unused: each pass gets its node's Redis coordination (`nodes`)
    )


def pass_lock_key(prefix: str, loaded: LoadedConfig) -> str:
    assert loaded.config.log.remote is not None
    return f"{prefix}lock:{remote_lock_name(loaded.config.log.remote)}"


def delete_key(key: str) -> None:
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT)
    try:
        assert client.delete(key) == 1  # the pass held it
    finally:
        client.close()


def put_events(loaded: LoadedConfig) -> list[str]:
    lines = [event(str(i), event_type="a" if i % 2 else "b", n=i) for i in range(20)]
    return [put_remote(loaded, lines[:12]), put_remote(loaded, lines[12:])]


def assert_loaded_once(schema: str) -> None:
    assert pg_rows(schema, "SELECT count(*), count(DISTINCT n) FROM a") == [(10, 10)]
    assert pg_rows(schema, "SELECT count(*), count(DISTINCT n) FROM b") == [(10, 10)]


@pytest.mark.spark
def test_a_pass_whose_lock_expired_stops_before_the_next_commit_and_the_next_node_loads_the_rest(
    spark: Any,
    tmp_path: Path,
    moto_s3: str,
    s3_bucket: str,
    pg_datasource: dict[str, Any],
    prefix: str,
    nodes: dict[str, Coordination],
) -> None:
    remote = remote_section(moto_s3, s3_bucket)
    node_a = node_config(tmp_path, remote, pg_datasource, "node-a")
    names = put_events(node_a)
    key = pass_lock_key(prefix, node_a)
    commits: list[str] = []

    def expire_after_the_first_commit(at: str) -> None:
        if at == "pair committed" and not commits:
            commits.append(at)
            delete_key(key)  # what an expiry during a long pause leaves
            time.sleep(LEASE_SECONDS / 3 + 0.15)

    with pytest.raises(LockLost, match=r"lost mid-pass: stopped before the commit of pg\.b; the next pass takes over"):
        run_pass(node_a, nodes["node-a"], fault=expire_after_the_first_commit, session=spark)

    schema = pg_datasource["schema"]
    assert commits == ["pair committed"]
    assert pg_rows(schema, "SELECT count(*) FROM a") == [(10,)]  # committed before the loss
    assert pg_rows(schema, "SELECT to_regclass('b')") == [(None,)]  # its commit was not run
    assert incoming_names(node_a) == sorted(names)  # nothing settled: no status, no archive
    assert all(remote_status(node_a, name) is None for name in names) and archived(node_a) == {}

    node_b = node_config(tmp_path, remote, pg_datasource, "node-b")
    result = run_pass(node_b, nodes["node-b"], session=spark)

    assert result.ok and incoming_names(node_b) == []
    assert_loaded_once(schema)
    assert sorted(archived(node_b)) == sorted(name + ".gz" for name in names)


@pytest.mark.spark
def test_a_pass_whose_lock_was_taken_over_writes_no_status_and_the_holder_settles_it(
    spark: Any,
    tmp_path: Path,
    moto_s3: str,
    s3_bucket: str,
    pg_datasource: dict[str, Any],
    prefix: str,
    nodes: dict[str, Coordination],
) -> None:
    remote = remote_section(moto_s3, s3_bucket)
    node_a = node_config(tmp_path, remote, pg_datasource, "node-a")
    names = put_events(node_a)
    assert node_a.config.log.remote is not None
    lock_name = remote_lock_name(node_a.config.log.remote)
    held = ExitStack()

    def taken_over_after_the_commits(at: str) -> None:
        if at == "committed":
            delete_key(pass_lock_key(prefix, node_a))
            held.enter_context(nodes["node-c"].lock(lock_name, timeout=0))  # another node's now
            time.sleep(LEASE_SECONDS / 3 + 0.15)

    with held:
        with pytest.raises(LockLost, match="stopped before writing the status files and failed events"):
            run_pass(node_a, nodes["node-a"], fault=taken_over_after_the_commits, session=spark)
        assert incoming_names(node_a) == sorted(names)
        assert all(remote_status(node_a, name) is None for name in names)
        # node-a's release left node-c's lock alone: node-b waits for its turn.
        node_b = node_config(tmp_path, remote, pg_datasource, "node-b")
        with pytest.raises(PassBusy, match="node-c"):
            run_pass(node_b, nodes["node-b"], session=spark)

    result = run_pass(node_b, nodes["node-b"], session=spark)

    assert result.ok and incoming_names(node_b) == []
    assert_loaded_once(pg_datasource["schema"])  # node-a's commits found by their load markers
    assert sorted(archived(node_b)) == sorted(name + ".gz" for name in names)


@pytest.mark.spark
def test_a_pass_that_keeps_its_lock_runs_to_the_end(
    spark: Any,
    tmp_path: Path,
    moto_s3: str,
    s3_bucket: str,
    pg_datasource: dict[str, Any],
    nodes: dict[str, Coordination],
) -> None:
    # Slower than the lease (a pause at each commit): renewed, never found lost.
    remote = remote_section(moto_s3, s3_bucket)
    node_a = node_config(tmp_path, remote, pg_datasource, "node-a")
    names = put_events(node_a)

    result = run_pass(node_a, nodes["node-a"], fault=lambda at: time.sleep(LEASE_SECONDS * 0.6), session=spark)

    assert result.ok and incoming_names(node_a) == []
    assert_loaded_once(pg_datasource["schema"])
    assert sorted(archived(node_a)) == sorted(name + ".gz" for name in names)
