"""`eventspark serve` with api_keys and destinations given as URLs, changed while it runs.

Real parts: a local HTTP config server (basic auth), PostgreSQL (stream and batch destinations),
Redis (coordination `type: redis` with `meta.storage.redis`), two collector worker processes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest

from tests.collector.conftest import Server, run_server  # noqa: F401 (fixture)
from tests.config_sources.conftest import ConfigServer
from tests.conftest import pg_conninfo

ADMIN = "admin-token"
RELOAD_SEC = 0.5


def token(n: int) -> dict[str, str]:
    return {"id": f"t{n}", "client_secret": f"c{n}", "server_secret": f"s{n}"}


def pg_stream(datasource: dict[str, Any], only: str, table: str, mode: str = "stream") -> dict[str, Any]:
    return {
        "type": "postgres",
        "mode": mode,
        "only_tokens": [only],
        "datasource": datasource,
        "data_layout": {"table_name_template": table},
    }


def send(server: Server, secret: str, n: int = 1) -> list[int]:
    """`n` server events, each on a new connection (so both collector workers take some)."""
    codes = []
    for i in range(n):
        answer = httpx.post(
            f"{server.url}/api/v1/s2s/event?token={secret}", json={"event_type": "e", "n": i}, timeout=5
        )
        codes.append(answer.status_code)
    return codes


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what} not seen within {timeout} s")


def rows(schema: str, table: str) -> int:
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        found = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s AND table_name = %s",
            (schema, table),
        ).fetchone()
        if not found or not found[0]:
            return 0
        count = conn.execute(f'SELECT count(*) FROM "{schema}"."{table}"').fetchone()
        return int(count[0]) if count else 0


@pytest.fixture
def redis_prefix() -> Any:
    import redis

    client = redis.Redis(host="127.0.0.1", port=6379)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"Redis at 127.0.0.1:6379 is needed: {exc}")
    prefix = f"es-test-{uuid.uuid4().hex[:8]}:"
    yield client, prefix
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_tokens_and_stream_destinations_follow_their_urls(
    tmp_path: Path,
    config_server: ConfigServer,
    run_server: Any,  # noqa: F811
    pg_datasource: dict[str, Any],
    pg_schema: str,
    redis_prefix: Any,
) -> None:
    redis_client, prefix = redis_prefix
    config_server.payloads["/keys"] = {"tokens": [token(1)]}
    config_server.payloads["/dest"] = {"destinations": {"first": pg_stream(pg_datasource, "t1", "first")}}
    sql_dir, server_log = tmp_path / "sql", tmp_path / "serverlog"
    server = run_server(
        {
            "server": {
                "workers": 2,
                "admin_token": ADMIN,
                "api_keys_reload_sec": RELOAD_SEC,
                "destinations_reload_sec": RELOAD_SEC,
                "cache": {"enabled": False},
                "log": {"path": str(server_log)},
            },
            "api_keys": config_server.url("/keys"),
            "destinations": config_server.url("/dest"),
            "coordination": {"type": "redis", "key_prefix": prefix},
            "meta": {"storage": {"redis": {"host": "127.0.0.1", "port": 6379}}},
            "sql_debug_log": {"ddl": {"path": str(sql_dir)}, "queries": {"path": str(sql_dir)}},
        }
    )
    assert send(server, "s1") == [200]
    assert send(server, "s2") == [401]
    wait_for(lambda: rows(pg_schema, "first") == 1, 30, "the first event in table first")

    # A new token and a new destination; the old ones removed (two sources, fetched apart).
    config_server.payloads["/dest"] = {"destinations": {"second": pg_stream(pg_datasource, "t2", "second")}}
    config_server.payloads["/keys"] = {"tokens": [token(2)]}
    # Each of the two collector processes switches on its own poll: the sends below may reach either.
    wait_for(lambda: server.text().count("config reloaded:") >= 2, 10, "both collector processes reloaded")
    wait_for(lambda: send(server, "s2") == [200], 10, "token s2 accepted")
    assert send(server, "s2", 20) == [200] * 20
    assert send(server, "s1", 10) == [401] * 10
    extra = httpx.post(f"{server.url}/api/v1/s2s/event?token=s2", json={"event_type": "e", "extra": 1}, timeout=5)
    assert extra.status_code == 200
    wait_for(lambda: rows(pg_schema, "second") == 22, 30, "22 events in table second")
    assert rows(pg_schema, "first") == 1
    # Both collector worker processes switched, each on its own.
    assert server.text().count("config reloaded:") == 2, server.text()

    # A broken payload keeps the last good config, and the status says why.
    config_server.payloads["/dest"] = b"{not json"
    time.sleep(RELOAD_SEC * 4)
    assert send(server, "s2", 5) == [200] * 5
    status = httpx.get(f"{server.url}/api/v1/status", headers={"X-Admin-Token": ADMIN}, timeout=5).json()
    errors = {s["key"]: s["error"] for s in status["config_sources"]}
    assert "neither JSON nor YAML" in errors["destinations"] and errors["api_keys"] is None
    assert "s3cret" not in orjson.dumps(status).decode()
    assert server.text().count("neither JSON nor YAML") == 1  # logged once, not every period

    # coordination type redis: this node's heartbeat and the tables' versions are in Redis.
    keys = {k.decode() for k in redis_client.scan_iter(match=prefix + "*")}
    assert any(k.startswith(prefix + "node:") for k in keys), keys
    assert any(k.startswith(prefix + "version:") for k in keys), keys

    assert server.stop() == 0
    ddl = (sql_dir / "ddl.log").read_text()
    queries = (sql_dir / "queries.log").read_text()
    assert f'[second] CREATE TABLE IF NOT EXISTS "{pg_schema}"."second" (' in ddl
    assert f'[second] ALTER TABLE "{pg_schema}"."second" ADD COLUMN' in ddl and '"extra"' in ddl
    assert f'[second] INSERT INTO "{pg_schema}"."second"' in queries
    assert "[first] CREATE TABLE" in ddl  # the destination of the start config too
    log_text = (server_log / "eventspark.log").read_text()
    assert "started 2 collector workers" in log_text
    assert "config sources reloaded" in log_text


def test_a_batch_destination_added_by_a_file_source(
    tmp_path: Path,
    run_server: Any,  # noqa: F811
    pg_datasource: dict[str, Any],
    pg_schema: str,
) -> None:
    keys, dests = tmp_path / "keys.json", tmp_path / "dest.yaml"
    keys.write_bytes(orjson.dumps({"tokens": [token(1)]}))
    dests.write_bytes(orjson.dumps({"destinations": {"first": pg_stream(pg_datasource, "t1", "first")}}))
    server = run_server(
        {
            "server": {"api_keys_reload_sec": RELOAD_SEC, "destinations_reload_sec": RELOAD_SEC},
            "api_keys": f"file://{keys}",
            "destinations": f"file://{dests}",
            "log": {"path": str(tmp_path / "events"), "rotation_min": 0.02, "uploader_period_sec": 1},
        }
    )
    assert send(server, "s1") == [200]
    batch = pg_stream(pg_datasource, "t1", "batched", mode="batch")
    dests.write_bytes(orjson.dumps({"first": pg_stream(pg_datasource, "t1", "first"), "pgb": batch}))
    wait_for(lambda: "config reloaded:" in server.text(), 10, "the collector's reload")
    assert send(server, "s1", 3) == [200] * 3
    wait_for(lambda: rows(pg_schema, "batched") == 3, 120, "3 rows loaded by a batch pass into table batched")
    wait_for(lambda: rows(pg_schema, "first") == 4, 30, "4 rows streamed into table first")
    assert server.stop() == 0
