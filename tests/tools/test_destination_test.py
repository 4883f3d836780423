"""`POST /api/v1/destinations/test` over real HTTP: good and bad configs of Postgres, MySQL,
DuckDB, S3 (moto), a webhook and Google Analytics 4 (the local recorder), a black-holed host
answered within the requested time, and what the probes leave behind (nothing)."""

from __future__ import annotations

import time
from typing import Any

import duckdb
import psycopg
import pytest

from tests.collector.conftest import Server
from tests.conftest import pg_conninfo
from tests.destinations.conftest import ClickHouseServer, mysql_connect
from tests.emulators.s3 import S3_KEY_ID, S3_REGION, S3_SECRET, s3_client
from tests.http.recorder import Recorder
from tests.tools.conftest import ADMIN, closed_port, post


@pytest.fixture(scope="module")
def server(serve: Any) -> Server:
    return serve({"destinations": {}})


def test_destination(server: Server, config: Any, **params: str) -> Any:
    return post(server, "/api/v1/destinations/test", config, token=ADMIN, **params)


test_destination.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


def ok(answer: Any) -> str:
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "ok"
    return str(answer.json()["checked"])


def refused(answer: Any, *fragments: str) -> dict[str, Any]:
    assert answer.status_code == 400, answer.text
    body: dict[str, Any] = answer.json()
    assert body["message"] and body["error"]
    for fragment in fragments:
        assert fragment in body["error"], body
    return body


def pg_tables(schema: str) -> list[str]:
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", [schema]).fetchall()
    return [name for (name,) in rows]


def test_postgres(server: Server, pg_datasource: dict[str, Any], pg_schema: str) -> None:
    checked = ok(test_destination(server, {"type": "postgres", "datasource": pg_datasource}))
    assert "_eventspark_probe_" in checked
    assert not [t for t in pg_tables(pg_schema) if t.startswith("_eventspark_probe_")]
    # EventNative's newer spelling: the block under `config:`.
    ok(test_destination(server, {"type": "postgres", "config": pg_datasource}))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"port": closed_port()}, "Connection refused"),
        ({"db": "no_such_database"}, 'database "no_such_database" does not exist'),
        ({"username": "no_such_user"}, 'role "no_such_user" does not exist'),  # trust auth: no passwords
    ],
)
def test_postgres_bad(server: Server, pg_datasource: dict[str, Any], change: dict[str, Any], message: str) -> None:
    refused(test_destination(server, {"type": "postgres", "datasource": {**pg_datasource, **change}}), message)


def test_mysql(server: Server, mysql_db: str) -> None:
    datasource = {"host": "127.0.0.1", "port": 3306, "db": mysql_db, "username": "root"}
    ok(test_destination(server, {"type": "mysql", "datasource": datasource}))
    conn = mysql_connect(mysql_db)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SHOW TABLES LIKE '\\_eventspark\\_probe\\_%%'")
            assert cursor.fetchall() == ()
    finally:
        conn.close()
    bad = {**datasource, "password": "wrong"}
    refused(test_destination(server, {"type": "mysql", "datasource": bad}), "Access denied")


def test_clickhouse(server: Server, clickhouse_server: ClickHouseServer, clickhouse_db: str) -> None:
    config = {
        "type": "clickhouse",
        "clickhouse": {"dsns": [f"{clickhouse_server.url}/{clickhouse_db}"], "db": clickhouse_db},
    }
    ok(test_destination(server, config))
    tables = clickhouse_server.query(f"SELECT name FROM system.tables WHERE database = '{clickhouse_db}'")
    assert not [name for (name,) in tables if name.startswith("_eventspark_probe_")]
    bad = {"dsns": [f"http://default:@127.0.0.1:{closed_port()}/{clickhouse_db}"], "db": clickhouse_db}
    refused(test_destination(server, {"type": "clickhouse", "clickhouse": bad}))


def test_duckdb(server: Server) -> None:
    checked = ok(test_destination(server, {"type": "duckdb", "duckdb": {"path": "tested/probe.duckdb"}}))
    assert "the file was created" in checked
    path = server.events_dir / "tested" / "probe.duckdb"
    with duckdb.connect(str(path), read_only=True) as conn:
        tables = [name for (name,) in conn.execute("SELECT table_name FROM information_schema.tables").fetchall()]
    assert not [t for t in tables if t.startswith("_eventspark_probe_")]


def test_duckdb_file_open_elsewhere_is_left_alone(server: Server) -> None:
    """A file another process holds (as a node's stream worker holds its warehouse): the probe
    answers DuckDB's lock error, and the holder's data and connection are unharmed."""
    path = server.events_dir / "held.duckdb"
    holder = duckdb.connect(str(path))
    try:
        holder.execute("CREATE TABLE kept AS SELECT 42 AS answer")
        refused(test_destination(server, {"type": "duckdb", "duckdb": {"path": "held.duckdb"}}), "lock")
        assert holder.execute("SELECT answer FROM kept").fetchall() == [(42,)]
        holder.execute("INSERT INTO kept VALUES (43)")
    finally:
        holder.close()
    with duckdb.connect(str(path), read_only=True) as conn:
        assert conn.execute("SELECT count(*) FROM kept").fetchone() == (2,)


def test_duckdb_outside_the_events_folder(server: Server, tmp_path: Any) -> None:
    outside = tmp_path / "elsewhere.duckdb"
    body = refused(test_destination(server, {"type": "duckdb", "duckdb": {"path": str(outside)}}), "log.path")
    assert body["message"] == "The destination config cannot be used"
    assert not outside.exists()
    refused(test_destination(server, {"type": "duckdb", "duckdb": {"path": "../escape.duckdb"}}), "log.path")


def test_duckdb_named_like_a_log_is_refused(server: Server) -> None:
    """log.path holds the node's logs too: a database created under a rotated log's name would be
    read by the next batch pass as events."""
    name = "incoming/incoming.tok=main-2026-01-01T00-00-00.000.log"
    body = refused(test_destination(server, {"type": "duckdb", "duckdb": {"path": name}}), "*.duckdb")
    assert body["message"] == "The destination config cannot be used"
    assert not (server.events_dir / name).exists()


@pytest.mark.parametrize(
    "config",
    [
        {"type": "gcs", "google": {"gcs_bucket": "b", "key_file": "/etc/hostname"}},
        {"type": "bigquery", "google": {"project": "p", "dataset": "d", "key_file": "keys/sa.json"}},
        {"type": "gcs", "google": {"gcs_bucket": "b", "gcs_endpoint": "http://127.0.0.1:9"}},
        {"type": "s3", "s3": {"bucket": "b", "endpoint": "http://127.0.0.1:9"}},
    ],
)
def test_node_credentials_are_not_lent(server: Server, config: dict[str, Any]) -> None:
    """Over HTTP keys come in the body: a key file path, or an endpoint without keys (the node's
    environment's credentials), would send the node's credentials to a host the caller chose."""
    body = refused(test_destination(server, config), "tested over HTTP")
    assert body["message"] == "The destination config cannot be used"


def s3_config(endpoint: str, bucket: str, folder: str = "") -> dict[str, Any]:
    block = {"endpoint": endpoint, "bucket": bucket, "region": S3_REGION, "folder": folder}
    return {"type": "s3", "s3": {**block, "access_key_id": S3_KEY_ID, "secret_access_key": S3_SECRET}}


def test_s3(server: Server, moto_s3: str, s3_bucket: str) -> None:
    checked = ok(test_destination(server, s3_config(moto_s3, s3_bucket, "lake")))
    assert f"s3://{s3_bucket}/lake/_eventspark_probe/" in checked
    assert s3_client(moto_s3).list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0
    refused(test_destination(server, s3_config(moto_s3, "no-such-bucket-here")), "NoSuchBucket")


def test_webhook_connects_without_sending(server: Server, recorder: Recorder) -> None:
    config = {"type": "webhook", "webhook": {"url": f"{recorder.url}/hook?key=x"}}
    assert "no event sent" in ok(test_destination(server, config))
    assert recorder.requests == []
    refused(test_destination(server, {"type": "webhook", "webhook": {"url": f"http://127.0.0.1:{closed_port()}/"}}))


def test_webhook_sends_a_probe_event_when_asked(server: Server, recorder: Recorder) -> None:
    config = {"type": "webhook", "webhook": {"url": f"{recorder.url}/hook", "retries": 0}}
    ok(test_destination(server, config, send_event="true"))
    (request,) = recorder.wait_for(1)
    assert request.path == "/hook" and b'"event_type":"eventspark_probe"' in request.body
    recorder.answer(403, "no such hook")
    refused(test_destination(server, config, send_event="true"), "403", "no such hook")


def test_google_analytics_4_validation_server(server: Server, recorder: Recorder) -> None:
    block = {"measurement_id": "G-TEST", "api_secret": "s3cr3t-value", "endpoint": recorder.url}
    config = {"type": "google_analytics", "google_analytics": block}
    recorder.answer(200, '{"validationMessages": []}')
    ok(test_destination(server, config))
    (request,) = recorder.wait_for(1)
    assert request.path == "/debug/mp/collect" and ("measurement_id", "G-TEST") in request.query
    recorder.answer(200, '{"validationMessages": [{"description": "api_secret s3cr3t-value is not valid"}]}')
    body = refused(test_destination(server, config), "is not valid")
    assert "s3cr3t-value" not in body["error"]  # secrets are redacted
    recorder.answer(200, '{"validationMessages": "not a list"}')
    refused(test_destination(server, config), "not the expected JSON")


def test_universal_analytics_validation_server(server: Server, recorder: Recorder) -> None:
    config = {"type": "google_analytics", "google_analytics": {"tracking_id": "UA-1-1", "endpoint": recorder.url}}
    recorder.answer(200, '{"hitParsingResult": [{"valid": true, "parserMessage": []}]}')
    ok(test_destination(server, config))
    (request,) = recorder.wait_for(1)
    assert request.method == "GET" and request.path == "/debug/collect" and ("tid", "UA-1-1") in request.query
    invalid = '{"hitParsingResult": [{"valid": false, "parserMessage": [{"description": "tid is not valid"}]}]}'
    recorder.answer(200, invalid)
    refused(test_destination(server, config), "tid is not valid")


def test_facebook_reads_eventnatives_error_codes(server: Server, recorder: Recorder) -> None:
    block = {"pixel_id": "1234", "access_token": "tok-secret-123", "endpoint": recorder.url}
    config = {"type": "facebook", "facebook": block}
    recorder.answer(400, '{"error": {"code": 100, "type": "OAuthException", "message": "data is empty"}}')
    ok(test_destination(server, config))  # the empty list is refused after token and pixel passed
    (request,) = recorder.wait_for(1)
    assert request.method == "POST" and request.path == "/v11.0/1234/events" and request.body == b'{"data":[]}'
    recorder.answer(400, '{"error": {"code": 190, "type": "OAuthException", "message": "Invalid OAuth token"}}')
    body = refused(test_destination(server, config), "access token is not valid")
    assert "tok-secret-123" not in body["error"]
    # An outage or a rate limit proves nothing; an answer that is not the Graph API's is no pass.
    recorder.answer(500, '{"error": {"code": 2, "message": "Service temporarily unavailable"}}')
    refused(test_destination(server, config), "HTTP 500", "temporarily unavailable")
    recorder.answer(400, '{"error": "not the Graph API"}')
    refused(test_destination(server, config), "HTTP 400")


def test_black_holed_host_answers_in_time(server: Server, black_hole: int) -> None:
    config = {"type": "postgres", "datasource": {"host": "127.0.0.1", "port": black_hole, "db": "test"}}
    started = time.monotonic()
    body = refused(test_destination(server, config, timeout="2"), "no answer within 2 s")
    assert time.monotonic() - started < 5
    assert body["message"] == "The destination did not answer in time"
    # The server goes on answering while the probe's thread waits for its driver's own timeout.
    assert post(server, "/api/v1/templates/evaluate", {"object": {}}, token=ADMIN).status_code == 200


def test_bad_requests(server: Server) -> None:
    assert post(server, "/api/v1/destinations/test", {"type": "postgres"}).status_code == 401  # no admin token
    unknown = refused(test_destination(server, {"type": "nosuch"}), "unknown destination type 'nosuch'")
    assert unknown["message"] == "Invalid destination config"
    refused(test_destination(server, {"type": "postgres", "datasource": {"host": "h"}}), "datasource.db")
    refused(test_destination(server, ["not", "an", "object"]), "JSON object")
    not_json = post(server, "/api/v1/destinations/test", content=b"{", token=ADMIN)
    assert not_json.status_code == 400 and not_json.json()["message"] == "Failed to parse body"
    assert test_destination(server, {"type": "duckdb"}, timeout="0").status_code == 400
    assert test_destination(server, {"type": "duckdb"}, timeout="nan").status_code == 400
