"""THE end-to-end test of issue 20: two `eventspark serve` nodes behind no shared filesystem, Redis
coordination, rotated logs on S3 (moto's server, `log.remote`), the batch pass on the standalone
cluster (`spark.master: spark://127.0.0.1:PORT`), one Postgres destination. Events posted to both
nodes end in Postgres exactly once; the nodes' incoming/ folders end empty and the logs archived
on S3.

Each node uploads its rotated logs; whichever node takes the cluster's pass lock loads every
node's logs, its executors reading byte ranges from S3; the other node's session, idle, holds no
cores (eventspark.batch.session), so both nodes' passes go through.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis

from eventspark.logs.rotated import rotated_logs
from tests.collector.conftest import Server, start_server
from tests.conftest import pg_conninfo
from tests.emulators.s3 import S3_KEY_ID, S3_REGION, S3_SECRET, s3_client
from tests.spark_cluster import StandaloneCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EVENTS = 200
S2S_TOKEN = "web-s2s"
ADMIN_TOKEN = "admin-secret"
LOADED_TIMEOUT_SEC = 180
"""Every event in Postgres by then; normally ~60 s (a pass's driver and executors start in ~20 s)."""
PASS_WAIT_SEC = 120
"""A pass asked for over HTTP; starved of cores, it would never end."""
UPLOADER_PERIOD_SEC = 600
"""The test asks for each pass (`POST /api/v1/batch/run`), so it knows which node runs it: node-b's
pass must find the cores while node-a's session idles. A periodic pass in between could take
node-b's logs and leave it nothing to do (the uploader's loop is the same code either way)."""


def node_config(
    name: str, master: str, remote: dict[str, Any], redis_prefix: str, pg: dict[str, Any]
) -> dict[str, Any]:
    return {
        "server": {"name": name, "admin_token": ADMIN_TOKEN},
        "api_keys": [{"id": "web", "client_secret": "web-js", "server_secret": S2S_TOKEN}],
        "log": {"remote": remote, "rotation_min": 0.05, "uploader_period_sec": UPLOADER_PERIOD_SEC},
        "coordination": {"type": "redis", "redis": {"host": "127.0.0.1", "port": 6379}, "key_prefix": redis_prefix},
        "spark": {"master": master},
        "retry": {"base_sec": 0.5},
        "destinations": {
            "pg": {
                "type": "postgres",
                "mode": "batch",
                "datasource": pg,
                "data_layout": {"table_name_template": "events"},
            }
        },
    }


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix of this test's own on the machine's Redis; its keys are deleted afterwards."""
    prefix = f"eventspark-cluster-test-{uuid.uuid4().hex[:10]}:"
    yield prefix
    client = redis.Redis(host="127.0.0.1", port=6379)
    try:
        keys = list(client.scan_iter(match=prefix + "*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def nodes(
    spark_cluster: StandaloneCluster,
    moto_s3: str,
    s3_bucket: str,
    redis_prefix: str,
    pg_datasource: dict[str, Any],
    tmp_path: Path,
) -> Iterator[list[Server]]:
    options = {
        "key": S3_KEY_ID,
        "secret": S3_SECRET,
        "client_kwargs": {"endpoint_url": moto_s3, "region_name": S3_REGION},
    }
    remote = {"url": f"s3://{s3_bucket}/events", "storage_options": options}
    started: list[Server] = []
    try:
        for name in ("node-a", "node-b"):
            (tmp_path / name).mkdir()
            config = node_config(name, spark_cluster.master_url, remote, redis_prefix, pg_datasource)
            started.append(start_server(tmp_path / name, config))
        yield started
    finally:
        for server in started:
            if server.process.poll() is None:
                server.stop(signal.SIGTERM, timeout=60)
        for server in started:  # a node that did not stop in time leaves no JVM behind either
            if server.process.poll() is None:
                os.kill(server.process.pid, signal.SIGKILL)
                server.process.wait()


def post_events(servers: list[Server], count: int) -> list[str]:
    """Posts `count` events, alternately to each node; their event ids."""
    ids = [f"e-{number:04d}-{uuid.uuid4().hex[:6]}" for number in range(count)]
    with httpx.Client(timeout=10) as client:
        for number, event_id in enumerate(ids):
            server = servers[number % len(servers)]
            event = {"eventn_ctx": {"event_id": event_id}, "event_type": "page", "n": number}
            answer = client.post(f"{server.url}/api/v1/s2s/event", params={"token": S2S_TOKEN}, json=event)
            assert answer.status_code == 200, answer.text
    return ids


def loaded_counts(schema: str) -> tuple[int, int]:
    """(rows, distinct event ids) in the events table; (0, 0) before it exists."""
    sql = f'SELECT count(*), count(DISTINCT eventn_ctx_event_id) FROM "{schema}".events'
    try:
        with psycopg.connect(pg_conninfo()) as conn:
            row = conn.execute(sql).fetchone()
    except psycopg.errors.UndefinedTable:
        return 0, 0
    assert row is not None
    return row[0], row[1]


def s3_keys(endpoint: str, bucket: str, prefix: str) -> list[str]:
    pages = s3_client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def run_pass_on(server: Server) -> dict[str, Any]:
    """Asks `server` for a pass now (`POST /api/v1/batch/run`: it rotates, uploads its logs, runs
    the pass under the cluster's lock) and returns its summary."""
    answer = httpx.post(
        f"{server.url}/api/v1/batch/run",
        params={"wait": PASS_WAIT_SEC},
        headers={"X-Admin-Token": ADMIN_TOKEN},
        timeout=PASS_WAIT_SEC + 10,
    )
    assert answer.status_code == 200, f"{answer.status_code} {answer.text}\n{server.text()[-3000:]}"
    summary: dict[str, Any] = answer.json()
    return summary


def rows_of(summary: dict[str, Any]) -> int:
    return sum(pair["rows"] for pair in summary["pairs"] if not pair["error"])


def test_events_posted_to_two_nodes_are_loaded_once_through_s3_and_the_cluster(
    nodes: list[Server], moto_s3: str, s3_bucket: str, pg_datasource: dict[str, Any], spark_cluster: StandaloneCluster
) -> None:
    schema, (node_a, node_b) = pg_datasource["schema"], nodes
    started = time.monotonic()
    ids = post_events(nodes, EVENTS // 2)
    first = run_pass_on(node_a)
    assert rows_of(first) > 0, first  # node-a's logs at least: its pass uploads them first
    ids += post_events(nodes, EVENTS - EVENTS // 2)
    # node-a's session stays warm and idle (keep_session: auto); node-b's pass needs the cores.
    second = run_pass_on(node_b)
    assert rows_of(second) > 0, second
    drivers = [app for app in spark_cluster.active_apps() if app["name"] == "eventspark"]
    assert len(drivers) == 2, drivers  # both nodes' sessions alive: node-b's pass did not wait for node-a's to end
    deadline = started + LOADED_TIMEOUT_SEC
    while loaded_counts(schema)[0] < EVENTS and time.monotonic() < deadline:
        run_pass_on(node_a)  # node-a's logs of the second half that node-b's pass did not find uploaded yet
    took = time.monotonic() - started
    rows, distinct = loaded_counts(schema)
    assert (rows, distinct) == (EVENTS, EVENTS), f"after {took:.0f} s: {rows} rows, {distinct} distinct\n" + "\n".join(
        server.text()[-3000:] for server in nodes
    )
    with psycopg.connect(pg_conninfo()) as conn:
        stored = {event_id for (event_id,) in conn.execute(f'SELECT eventn_ctx_event_id FROM "{schema}".events')}
    assert stored == set(ids)

    def settled() -> bool:  # the last pass's archive and status writes follow its commits
        remote_incoming = [key for key in s3_keys(moto_s3, s3_bucket, "events/incoming/") if key.endswith(".log")]
        return not remote_incoming and all(not rotated_logs(server.incoming) for server in nodes)

    deadline = time.monotonic() + 60
    while not settled() and time.monotonic() < deadline:
        time.sleep(1)
    assert settled(), s3_keys(moto_s3, s3_bucket, "events/")
    archived = s3_keys(moto_s3, s3_bucket, "events/archive/")
    nodes_archived = {node for node in ("node-a", "node-b") if any(f"n={node}" in key for key in archived)}
    assert nodes_archived == {"node-a", "node-b"}, archived
    assert loaded_counts(schema) == (EVENTS, EVENTS)  # nothing loaded again by the passes since
    print(
        f"{EVENTS} events through two nodes, S3 and the cluster: all in Postgres once after {took:.0f} s "
        f"(node-a's pass {rows_of(first)} rows, node-b's {rows_of(second)} rows while node-a's session idled)"
    )
