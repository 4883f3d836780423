"""Issue 17, item 7: the same events land in the same tables as with EventNative 1.41, end to end
through `eventspark serve` into the machine's Postgres, in batch and stream mode.

One server for the module: token `web` feeds a batch destination (`pgb`, keyed on the event id)
and a stream destination (`pgs`), each in a schema of its own, both routing events to monthly
tables with EventNative's `{{.event_type}}_{{._timestamp.Format "2006_01"}}`. The uploader period
is an hour: batch loads come from `POST /api/v1/batch/run`.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest

from eventspark.steps.context import line_event_id
from tests.collector.conftest import Server, start_server
from tests.conftest import PG_DB, PG_HOST, PG_PORT, PG_USER, pg_conninfo

ADMIN = "admin-" + uuid.uuid4().hex
JS_KEY = "js-" + uuid.uuid4().hex
S2S_KEY = "s2s-" + uuid.uuid4().hex
TEMPLATE = '{{.event_type}}_{{._timestamp.Format "2006_01"}}'
MAC_CHROME = (
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_5) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/83.0.4103.116 Safari/537.36"
)
ANDROID = (
    "Mozilla/5.0 (Linux; Android 10; SM-G973F) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/83.0.4103.106 Mobile Safari/537.36"
)
MODES = ("pgb", "pgs")


@pytest.fixture(scope="module")
def schemas() -> Iterator[dict[str, str]]:
    tag = uuid.uuid4().hex[:10]
    names = {dest_id: f"par_{dest_id}_{tag}" for dest_id in MODES}
    yield names
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        for name in names.values():
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def config_of(schemas: dict[str, str], events_dir: Path) -> dict[str, Any]:
    def destination(dest_id: str, mode: str) -> dict[str, Any]:
        layout: dict[str, Any] = {"table_name_template": TEMPLATE}
        if mode == "batch":
            layout["primary_key_fields"] = ["eventn_ctx_event_id"]
        datasource = {"host": PG_HOST, "port": PG_PORT, "db": PG_DB, "schema": schemas[dest_id], "username": PG_USER}
        routing = {"type": "postgres", "mode": mode, "only_tokens": ["web"]}
        return {**routing, "datasource": datasource, "data_layout": layout}

    return {
        "server": {"admin_token": ADMIN, "name": "parity-node"},
        "api_keys": [{"id": "web", "client_secret": JS_KEY, "server_secret": S2S_KEY}],
        "log": {"path": str(events_dir), "rotation_min": 60, "uploader_period_sec": 3600},
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        "stream": {"batch_wait_ms": 20, "retry_min_sec": 0.2, "retry_max_sec": 1.0, "poll_ms": 5},
        "destinations": {"pgb": destination("pgb", "batch"), "pgs": destination("pgs", "stream")},
    }


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, schemas: dict[str, str]) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("parity")
    server = start_server(directory, config_of(schemas, directory / "events"))
    yield server
    server.stop()
    assert "Traceback" not in server.text(), server.text()[-3000:]


def sql(statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        cursor = conn.execute(statement, params or None)
        return cursor.fetchall() if cursor.description else []


def post(server: Server, event: dict[str, Any], *, s2s: bool = False, agent: str = "parity-test/1.0") -> None:
    path, key = ("/api/v1/s2s/event", S2S_KEY) if s2s else ("/api/v1/event", JS_KEY)
    headers = {"User-Agent": agent}
    answer = httpx.post(f"{server.url}{path}", params={"token": key}, json=event, headers=headers, timeout=10)
    assert answer.status_code == 200, answer.text


def batch_run(server: Server) -> dict[str, Any]:
    answer = httpx.post(
        f"{server.url}/api/v1/batch/run",
        params={"wait": 500},
        headers={"X-Admin-Token": ADMIN},
        timeout=600,
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def rows(schema: str, table: str, columns: str, where: str = "true", timeout: float = 60.0) -> list[tuple[Any, ...]]:
    """The rows of `schema.table` (waits for the table and a row: stream workers load on their own)."""
    deadline = time.monotonic() + timeout
    while True:
        exists = sql(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = %s", schema, table
        )
        found = sql(f'SELECT {columns} FROM "{schema}"."{table}" WHERE {where} ORDER BY 1') if exists else []
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def column_types(schema: str, table: str) -> dict[str, str]:
    found = sql(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
        schema,
        table,
    )
    return dict(found)  # type: ignore[arg-type]


# --- the scenario: the tests share the server and its schemas --------------------------------------


def test_client_timestamp_ip_and_src_are_kept_and_route_backfills_to_their_month(
    node: Server, schemas: dict[str, str]
) -> None:
    post(node, {"event_type": "backfill", "_timestamp": "2021-03-04T05:06:07.000000Z", "source_ip": "10.1.2.3"})
    post(node, {"event_type": "backfill", "_timestamp": "2021-04-01T00:00:00Z", "src": "importer"}, s2s=True)
    post(node, {"event_type": "backfill", "eventn_ctx": {"event_id": "fresh"}}, s2s=True)
    body = batch_run(node)
    assert body["status"] == "ok", body
    this_month = time.strftime("%Y_%m", time.gmtime())
    for dest_id in MODES:
        schema = schemas[dest_id]
        march = rows(schema, "backfill_2021_03", "source_ip, _timestamp")
        assert [(ip, str(stamp)) for ip, stamp in march] == [("10.1.2.3", "2021-03-04 05:06:07")]
        april = rows(schema, "backfill_2021_04", "source_ip, src")
        assert april == [("127.0.0.1", "importer")]
        now = rows(schema, f"backfill_{this_month}", "eventn_ctx_event_id, src")
        assert now == [("fresh", "api")]


def test_hashed_anonymous_id_device_and_server_user_agent(node: Server, schemas: dict[str, str]) -> None:
    post(node, {"event_type": "visit", "user": {"anonymous_id": "anon-1"}}, agent=MAC_CHROME)
    post(node, {"event_type": "visit", "eventn_ctx": {"user": {"anonymous_id": "anon-2"}}}, agent=ANDROID)
    # a server event carrying its own src: EventNative 1.41 kept the src, so the UA is parsed
    post(node, {"event_type": "visit", "src": "backend", "user_agent": ANDROID, "user": {"id": "u1"}}, s2s=True)
    batch_run(node)
    table = "visit_" + time.strftime("%Y_%m", time.gmtime())
    mac_hash = hashlib.md5(f"127.0.0.1{MAC_CHROME}".encode()).hexdigest()
    android_hash = hashlib.md5(f"127.0.0.1{ANDROID}".encode()).hexdigest()
    server_hash = hashlib.md5(b"127.0.0.1parity-test/1.0").hexdigest()
    for dest_id in MODES:
        schema = schemas[dest_id]
        flat = rows(
            schema,
            table,
            "user_anonymous_id, user_hashed_anonymous_id, parsed_ua_device_family, parsed_ua_device_brand, "
            "parsed_ua_device_model",
            "user_anonymous_id IS NOT NULL",
        )
        assert flat == [("anon-1", mac_hash, "Mac", "Apple", "Mac")], dest_id
        nested = rows(
            schema,
            table,
            "eventn_ctx_user_anonymous_id, eventn_ctx_user_hashed_anonymous_id, eventn_ctx_parsed_ua_device_brand, "
            "eventn_ctx_parsed_ua_device_model",
            "eventn_ctx_user_anonymous_id IS NOT NULL",
        )
        assert nested == [("anon-2", android_hash, "Samsung", "SM-G973F")], dest_id
        columns = "user_id, user_hashed_anonymous_id, parsed_ua_ua_family, parsed_ua_os_family"
        server = rows(schema, table, columns, "src = 'backend'")
        assert server == [("u1", server_hash, "Chrome Mobile", "Android")], dest_id


def test_existing_double_precision_columns_take_floats(node: Server, schemas: dict[str, str]) -> None:
    schema = schemas["pgb"]
    sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    columns = "eventn_ctx_event_id text PRIMARY KEY, amount double precision, qty real"
    sql(f'CREATE TABLE "{schema}".price_2022_01 ({columns})')
    event = {"event_type": "price", "_timestamp": "2022-01-15T10:00:00Z", "amount": 12.5, "qty": 3, "ratio": 0.25}
    post(node, event, s2s=True)
    body = batch_run(node)
    assert body["status"] == "ok", body
    assert rows(schema, "price_2022_01", "amount, qty, ratio") == [(12.5, 3.0, pytest.approx(0.25))]
    types = column_types(schema, "price_2022_01")
    assert (types["amount"], types["qty"], types["ratio"]) == ("double precision", "real", "numeric")


def test_a_line_without_id_in_an_eventnative_named_log_loads_with_the_same_id_twice(
    node: Server, schemas: dict[str, str]
) -> None:
    line = b'{"event_type":"legacy","_timestamp":"2021-05-11T10:20:30.000000Z","api_key":"web","n":1}'
    expected = line_event_id(line)
    # EventNative's rotated names: a 4-digit fraction, and none at all
    for name in ("incoming.tok=web-2021-05-11T10-20-30.1234.log", "incoming.tok=web-2021-05-11T10-25-00.log"):
        (node.incoming / name).write_bytes(line + b"\n")
        body = batch_run(node)
        assert body["status"] == "ok", body
        assert not (node.incoming / name).exists(), "the log was not archived after its load"
        assert rows(schemas["pgb"], "legacy_2021_05", "eventn_ctx_event_id, n") == [(expected, 1)]


def test_a_log_of_an_unknown_token_stays_with_its_reason(node: Server) -> None:
    name = "incoming.tok=gone-2021-05-11T10-20-30.1234.log"
    path = node.incoming / name
    path.write_bytes(b'{"event_type":"orphan","api_key":"gone-secret"}\n')
    for _ in range(2):  # kept on every pass, never archived
        body = batch_run(node)
        assert body["held"] == {name: "token 'gone' is not in api_keys"}, body
        assert path.exists()
    assert not list((node.events_dir / "archive").rglob(f"{name}*"))
    assert "kept in incoming/, not loaded: token 'gone' is not in api_keys" in node.text()
    # and shown by the status (the HTTP one, and `eventspark status` reading the same files)
    status = httpx.get(f"{node.url}/api/v1/status", headers={"X-Admin-Token": ADMIN}, timeout=10).json()
    assert name in status["held_logs"], status
    config = node.events_dir.parent / "status.yaml"
    config.write_text(orjson.dumps(config_of({d: "unused" for d in MODES}, node.events_dir)).decode())
    done = subprocess.run(
        [str(Path(sys.executable).with_name("eventspark")), "status", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "rotated log(s) kept in incoming/, not loaded" in done.stderr and name in done.stderr, done.stderr
    path.unlink()  # the other tests' passes need not see it


def test_a_replayed_line_without_id_gets_the_same_one_in_stream_mode(node: Server, schemas: dict[str, str]) -> None:
    event = {"event_type": "imported", "_timestamp": "2021-06-01T00:00:00.000000Z", "api_key": "web", "n": 2}
    failed = node.events_dir / "failed"
    failed.mkdir(parents=True, exist_ok=True)
    name = "failed.dst=pgs-2021-06-01T00-00-00.000.log"
    (failed / name).write_bytes(orjson.dumps({"event": event, "error": "from EventNative"}) + b"\n")
    answer = httpx.post(
        f"{node.url}/api/v1/replay",
        json={"file_name": name, "destination_id": "pgs"},
        headers={"X-Admin-Token": ADMIN},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    found = rows(schemas["pgs"], "imported_2021_06", "eventn_ctx_event_id, n")
    assert len(found) == 1 and found[0][1] == 2, found
    assert uuid.UUID(found[0][0]).version == 8  # derived from the line, not random


HOSTILE_TIMESTAMPS: list[Any] = [
    "not a time",
    "",
    12345,
    True,
    {"a": 1},
    ["2021-01-01T00:00:00Z"],
    "2021-02-30T00:00:00Z",
    "0000-01-01T00:00:00Z",
    "2021-01-01T00:00:00+25:00",
    "9" * 5000,
]


def failed_events(events_dir: Path, dest_id: str) -> dict[int, str]:
    """n → error of the failed `hostile` events of `dest_id`."""
    found = {}
    for path in (events_dir / "failed").glob(f"failed.dst={dest_id}*"):
        for line in path.read_bytes().splitlines():
            record = orjson.loads(line)
            if record["event"].get("event_type") == "hostile":
                found[record["event"]["n"]] = record["error"]
    return found


def hostile_request(server: Server) -> None:
    """One request: the good event between the hostile ones (the same pass, micro-batch, table)."""
    events = [{"event_type": "hostile", "n": n, "_timestamp": stamp} for n, stamp in enumerate(HOSTILE_TIMESTAMPS)]
    events.insert(3, {"event_type": "hostile", "n": 99, "_timestamp": "2020-07-08T09:10:11Z"})
    answer = httpx.post(f"{server.url}/api/v1/s2s/event", params={"token": S2S_KEY}, json=events, timeout=10)
    assert answer.status_code == 200, answer.text


def check_hostile(server: Server, schemas: dict[str, str], table: str, reason: str) -> None:
    body = batch_run(server)
    assert body["status"] == "ok", body
    for dest_id in MODES:
        assert rows(schemas[dest_id], table, "n") == [(99,)], dest_id
        deadline = time.monotonic() + 30
        while len(failed := failed_events(server.events_dir, dest_id)) < len(HOSTILE_TIMESTAMPS):
            assert time.monotonic() < deadline, (dest_id, failed)
            time.sleep(0.2)
        assert sorted(failed) == list(range(len(HOSTILE_TIMESTAMPS))), (dest_id, failed)
        for n, error in failed.items():
            assert reason in error, (dest_id, n, error)


def test_a_hostile_client_timestamp_fails_only_its_event_in_a_monthly_table(
    node: Server, schemas: dict[str, str]
) -> None:
    hostile_request(node)
    check_hostile(node, schemas, "hostile_2020_07", "table_name_template")


def test_a_hostile_client_timestamp_fails_only_its_event_at_load(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:10]
    schemas = {dest_id: f"par_ts_{dest_id}_{tag}" for dest_id in MODES}
    config = config_of(schemas, tmp_path / "events")
    for dest in config["destinations"].values():
        dest["data_layout"]["table_name_template"] = "{{.event_type}}"
    server = start_server(tmp_path, config)
    try:
        hostile_request(server)
        check_hostile(server, schemas, "hostile", "_timestamp")
    finally:
        server.stop()
        with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
            for name in schemas.values():
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    assert "Traceback" not in server.text(), server.text()[-3000:]
