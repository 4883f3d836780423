"""Users recognition end to end through `eventspark serve` (a subprocess) and HTTP: anonymous
events, a batch pass, an identification, another pass; the batch destination's earlier rows of
that anonymous id have the user id in every table, and so do the stream destination's."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import psycopg

from tests.collector import conftest as collector_fixtures
from tests.collector.conftest import Server
from tests.conftest import pg_conninfo
from tests.destinations import conftest as destination_fixtures
from tests.destinations.conftest import ClickHouseServer
from tests.recognition.helpers import ANONYMOUS, EXPECTED, IDENTIFY, KEY, RECOGNITION, wait_for_mutations

run_server = collector_fixtures.run_server
clickhouse_server = destination_fixtures.clickhouse_server
clickhouse_db = destination_fixtures.clickhouse_db

ADMIN = "admin-recognition"
SECRET = "s2s-recognition"


def serve_config(destinations: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "server": {"admin_token": ADMIN},
        "api_keys": [{"id": "web", "server_secret": SECRET}],
        "log": {"rotation_min": 60, "uploader_period_sec": 3600},
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        "destinations": destinations,
        **RECOGNITION,
        **extra,
    }


def send(server: Server, events: list[dict[str, Any]]) -> None:
    for event in events:
        answer = httpx.post(f"{server.url}/api/v1/s2s/event", params={"token": SECRET}, json=event, timeout=30)
        assert answer.status_code == 200, answer.text


def batch_pass(server: Server) -> dict[str, Any]:
    # The node's first pass starts Spark: slow on a loaded machine.
    answer = httpx.post(f"{server.url}/api/v1/batch/run", params={"wait": 500, "token": ADMIN}, timeout=600)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def wait_for(read: Callable[[], Any], wanted: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while (found := read()) != wanted and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def pg_reader(schema: str, prefix: str) -> Callable[[], dict[str, dict[str, Any]]]:
    def read() -> dict[str, dict[str, Any]]:
        found = {}
        with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
            for table in EXPECTED:
                try:
                    rows = conn.execute(f'SELECT {KEY}, user_id FROM "{schema}"."{prefix}{table}"').fetchall()
                except psycopg.errors.Error:
                    rows = []
                found[table] = dict(rows)
        return found

    return read


def identify_in_two_passes(server: Server, schema: str) -> Server:
    """Anonymous events, a pass, the identification, a pass: the batch (`b_`) and stream (`s_`)
    tables of `schema` end as EXPECTED, nothing failed, no traceback; returns the stopped server."""
    send(server, ANONYMOUS)
    batch_pass(server)
    send(server, IDENTIFY)
    batch_pass(server)
    assert pg_reader(schema, "b_")() == EXPECTED
    assert wait_for(pg_reader(schema, "s_"), EXPECTED) == EXPECTED
    assert not (server.events_dir / "failed").exists() or not any((server.events_dir / "failed").iterdir())
    server.stop()
    assert "Traceback" not in server.text(), server.text()[-3000:]
    return server


def test_postgres_batch_and_stream(run_server: Any, pg_datasource: dict[str, Any], pg_schema: str) -> None:
    destinations = {
        "pgb": {
            "type": "postgres",
            "datasource": pg_datasource,
            "data_layout": {"table_name_template": "b_{{.event_type}}"},
        },
        "pgs": {
            "type": "postgres",
            "mode": "stream",
            "datasource": pg_datasource,
            "data_layout": {"table_name_template": "s_{{.event_type}}", "primary_key_fields": [KEY]},
        },
    }
    server = identify_in_two_passes(run_server(serve_config(destinations)), pg_schema)
    assert "users recognition of pgb: 2 update(s), 1 id(s) settled, 0 pending" in server.text()


def test_same_pass_and_redis_index(run_server: Any, pg_datasource: dict[str, Any], pg_schema: str) -> None:
    """The anonymous events and their identification in one pass; the index in Redis."""
    import redis

    dest_id = f"pg_{uuid.uuid4().hex[:8]}"
    destinations = {
        dest_id: {
            "type": "postgres",
            "datasource": pg_datasource,
            "data_layout": {"table_name_template": "b_{{.event_type}}"},
        }
    }
    server = run_server(serve_config(destinations, meta={"storage": {"redis": {"host": "127.0.0.1", "port": 6379}}}))
    client = redis.Redis(host="127.0.0.1", port=6379)
    try:
        send(server, ANONYMOUS + IDENTIFY)
        batch_pass(server)
        assert pg_reader(pg_schema, "b_")() == EXPECTED
        # a1 is settled (its tables forgotten), its identity kept; a2 waits with its table
        # (the table and the column of its anonymous id)
        assert client.smembers(f"eventspark:recognition:{dest_id}:t:a2") == {b"b_pageview\x1fuser_anonymous_id"}
        assert not client.exists(f"eventspark:recognition:{dest_id}:t:a1")
        assert client.get(f"eventspark:recognition:{dest_id}:u:a1") == b'["u1","u1@example.com",null]'
        server.stop()
        assert "Traceback" not in server.text(), server.text()[-3000:]
    finally:
        # the index's keys, and the events cache's (meta.storage.redis turns it on too)
        keys = list(client.scan_iter(match=f"eventspark:*{dest_id}*"))
        if keys:
            client.delete(*keys)
        client.close()


def test_clickhouse_batch_one_mutation_per_table_per_pass(
    run_server: Any, clickhouse_server: ClickHouseServer, clickhouse_db: str
) -> None:
    dsn = f"{clickhouse_server.url}/{clickhouse_db}"
    dest = {"type": "clickhouse", "clickhouse": {"dsns": [dsn], "db": clickhouse_db}}
    dest["data_layout"] = {"table_name_template": "{{.event_type}}"}
    server = run_server(serve_config({"ch": dest}))
    send(server, ANONYMOUS)
    batch_pass(server)
    send(server, IDENTIFY)
    batch_pass(server)
    wait_for_mutations(clickhouse_server, clickhouse_db)

    def read() -> dict[str, dict[str, Any]]:
        found = {}
        for table in EXPECTED:
            rows = clickhouse_server.query(f"SELECT {KEY}, user_id FROM `{clickhouse_db}`.`{table}`")
            found[table] = {key: (user or None) for key, user in rows}
        return found

    assert read() == EXPECTED
    mutations = clickhouse_server.query(
        f"SELECT table, count() FROM system.mutations WHERE database = '{clickhouse_db}' GROUP BY table"
    )
    assert {table: int(count) for table, count in mutations} == {"pageview": 1, "click": 1}
    server.stop()
    assert "Traceback" not in server.text(), server.text()[-3000:]


def test_redshift_batch_and_stream(run_server: Any, pg_datasource: dict[str, Any], pg_schema: str) -> None:
    """`type: redshift` through `serve` (its SQL on PostgreSQL, as tests/destinations run it)."""
    destinations = {
        "rsb": {
            "type": "redshift",
            "datasource": pg_datasource,
            "data_layout": {"table_name_template": "b_{{.event_type}}"},
        },
        "rss": {
            "type": "redshift",
            "mode": "stream",
            "datasource": pg_datasource,
            "data_layout": {"table_name_template": "s_{{.event_type}}"},
        },
    }
    identify_in_two_passes(run_server(serve_config(destinations)), pg_schema)
