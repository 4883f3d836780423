"""`POST /api/v1/events/dry-run` over real HTTP against a running `serve`: EventNative's test
vectors in Postgres, ClickHouse and DuckDB destinations, errors, auth, and nothing written."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import httpx
import psycopg
import pytest

from eventspark.steps.flatten import flatten
from tests.collector.conftest import Server, fixture_json
from tests.conftest import pg_conninfo
from tests.tools.conftest import JS, S2S, closed_port, post
from tests.vectors import VECTOR_IP, VECTOR_USER_AGENT, with_hashed_id

VECTORS = [
    ("api_event_input_1.0.json", "api_fact_output_1.0.json"),
    ("api_event_input_2.0.json", "api_fact_output_2.0.json"),
]
SENDER_IP = VECTOR_IP
"""The vectors' `source_ip`: sent as X-Forwarded-For (with their User-Agent)."""
# EventNative's column types (its type table; DuckDB's are eventspark's own, docs/destinations/duckdb.md).
TYPES = {
    "pg": {"string": "text", "int": "bigint", "timestamp": "timestamp"},
    "ch": {"string": "String", "int": "Int64", "timestamp": "DateTime"},
    "dd": {"string": "VARCHAR", "int": "BIGINT", "timestamp": "TIMESTAMPTZ"},
}
SKIPPING = '{{if eq .event_type "skip"}}{{else}}dry_run{{end}}'


@pytest.fixture(scope="module")
def schema() -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture(scope="module")
def server(serve: Any, schema: str) -> Server:
    datasource = {"host": "127.0.0.1", "port": 5432, "db": "test", "schema": schema, "username": "postgres"}
    layout = {"table_name_template": SKIPPING}
    cast = {"keep_unmapped": True, "fields": [{"src": "/amount", "action": "cast", "type": "integer"}]}
    return serve(
        {
            "destinations": {
                "pg": {"type": "postgres", "mode": "stream", "datasource": datasource, "data_layout": layout},
                "ch": {
                    "type": "clickhouse",
                    "only_tokens": ["main"],
                    "clickhouse": {"dsns": [f"http://127.0.0.1:{closed_port()}/analytics"], "db": "analytics"},
                    "data_layout": layout,
                },
                "dd": {"type": "duckdb", "data_layout": {**layout, "mappings": cast}},
                "narrow": {
                    "type": "clickhouse",
                    "clickhouse": {"dsns": [f"http://127.0.0.1:{closed_port()}/narrow"], "db": "narrow"},
                    "data_layout": {"max_columns": 12},
                },
                "hook": {"type": "webhook", "webhook": {"url": f"http://127.0.0.1:{closed_port()}/hook"}},
                "lake": {
                    "type": "s3",
                    "s3": {"bucket": "lake", "endpoint": f"http://127.0.0.1:{closed_port()}", "format": "json"},
                    "data_layout": {"table_name_template": "{{.event_type}}"},
                },
            }
        }
    )


def dry_run(server: Server, dest_id: str, body: Any, token: str = S2S, **params: str) -> Any:
    return post(server, "/api/v1/events/dry-run", body, token=token, destination_id=dest_id, **params)


def type_of(value: Any) -> str:
    return "int" if isinstance(value, int) else "string"


@pytest.mark.parametrize("dest_id", ["pg", "ch", "dd"])
@pytest.mark.parametrize(("given", "expected"), VECTORS)
def test_vectors(server: Server, dest_id: str, given: str, expected: str) -> None:
    answer = httpx.post(
        f"{server.url}/api/v1/events/dry-run",
        params={"token": S2S, "destination_id": dest_id},
        json=fixture_json(given),
        headers={"X-Forwarded-For": SENDER_IP, "User-Agent": VECTOR_USER_AGENT},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    record = answer.json()  # one event object: the spec's flat [{field, type, value}]
    assert isinstance(record, list) and all(isinstance(f, dict) for f in record)
    fields = {f["field"]: f for f in record}
    assert all(set(f) == {"field", "type", "value"} for f in record)
    want = flatten(with_hashed_id(fixture_json(expected)))  # the vector plus what 1.41 adds
    assert set(fields) == set(want)
    types = TYPES[dest_id]
    for name, value in want.items():
        got = fields[name]
        if name == "_timestamp":  # fixed in the vector; the receive time here
            assert got["type"] == types["timestamp"]
            received = datetime.fromisoformat(got["value"])
            assert abs(datetime.now(UTC) - received) < timedelta(minutes=5)
        elif value == "mockeduuid":  # a generated id in the vector
            assert str(uuid.UUID(got["value"])) == got["value"]
            assert got["type"] == types["string"]
        else:
            assert got["value"] == value, name
            assert got["type"] == types[type_of(value)], name


def test_answer_shape_follows_the_body(server: Server) -> None:
    """One object: a flat field list (the spec); an array or a template body: one list per
    event, even of one event (EventNative v1.41); `format=lists`: one list per event always."""
    event = {"event_type": "shape", "n": 1}
    expected = {"field": "event_type", "type": "text", "value": "shape"}
    flat = dry_run(server, "pg", event).json()
    assert expected in flat and all(isinstance(f, dict) for f in flat)
    for body in ([event], [event, {**event, "n": 2}], {"template": {"event_type": "shape"}, "events": [{"n": 1}]}):
        lists = dry_run(server, "pg", body).json()
        assert len(lists) == len(body if isinstance(body, list) else body["events"])
        assert all(isinstance(record, list) and expected in record for record in lists)
    forced = dry_run(server, "pg", event, format="lists").json()
    assert len(forced) == 1 and expected in forced[0]
    named = dry_run(server, "pg", event, format="eventnative").json()  # the default's name
    assert [f["field"] for f in named] == [f["field"] for f in flat]


def test_full_format_names_the_table(server: Server) -> None:
    answer = dry_run(server, "pg", [{"event_type": "a"}, {"event_type": "skip"}], format="full")
    assert answer.status_code == 200
    first, second = answer.json()["events"]
    assert first["status"] == "ok" and first["table"] == "dry_run" and first["error"] == ""
    assert {"field": "event_type", "type": "text", "value": "a"} in first["fields"]
    assert second["status"] == "skipped" and second["table"] == "" and "skipped" in second["error"]


def test_skipped_event_is_eventnatives_400(server: Server) -> None:
    answer = dry_run(server, "pg", {"event_type": "skip"})
    assert answer.status_code == 400
    assert answer.json()["message"] == "Error getting dry run response for destination with id=[pg]"
    assert "skipped" in answer.json()["error"]


def test_value_that_does_not_fit_its_cast_fails(server: Server) -> None:
    good = dry_run(server, "dd", {"amount": "12"}, format="full").json()["events"][0]
    assert good["status"] == "ok"
    assert {"field": "amount", "type": "BIGINT", "value": 12} in good["fields"]
    bad = dry_run(server, "dd", {"amount": "twelve"}, format="full")
    assert bad.status_code == 200
    event = bad.json()["events"][0]
    assert event["status"] == "failed" and "does not fit a INT64 column" in event["error"]
    assert dry_run(server, "dd", {"amount": "twelve"}).status_code == 400


def test_more_columns_than_the_table_may_have_fails(server: Server) -> None:
    """12 columns fit `max_columns: 12`, 13 fail, as the load's column check would refuse them."""
    enriched = len(dry_run(server, "narrow", {}).json())  # `_timestamp`, `api_key`, ...
    fitting = dry_run(server, "narrow", {f"f{n}": n for n in range(12 - enriched)}, format="full").json()["events"][0]
    assert fitting["status"] == "ok" and len(fitting["fields"]) == 12
    wide = dry_run(server, "narrow", {f"f{n}": n for n in range(13 - enriched)}, format="full").json()["events"][0]
    assert wide["status"] == "failed" and "13 columns, more than max_columns 12" in wide["error"]
    assert dry_run(server, "narrow", {f"f{n}": n for n in range(13 - enriched)}).status_code == 400


def test_auth_and_destination_errors(server: Server) -> None:
    assert dry_run(server, "pg", {}, token="").status_code == 401
    client = dry_run(server, "pg", {}, token=JS)
    assert client.status_code == 401 and "isn't a server token" in client.json()["message"]
    assert dry_run(server, "ch", {}, token="other-secret").status_code == 403  # only_tokens: [main]
    assert dry_run(server, "pg", {}, token="other-secret").status_code == 200  # every token
    missing = dry_run(server, "nope", {})
    assert missing.status_code == 404 and "nope" in missing.json()["message"]
    assert dry_run(server, "", {}).status_code == 400
    assert dry_run(server, "pg", {}, format="xml").status_code == 400
    bad = post(server, "/api/v1/events/dry-run", content=b"{not json", token=S2S, destination_id="pg")
    assert bad.status_code == 400 and bad.json()["message"] == "Failed to parse body"
    too_many = dry_run(server, "pg", [{"n": n} for n in range(101)])
    assert too_many.status_code == 400


def test_nothing_is_written(server: Server, schema: str) -> None:
    server.mark()
    for dest_id in ("pg", "ch", "dd"):
        assert dry_run(server, dest_id, {"event_type": "x", "n": 1}).status_code == 200
    assert server.new_events() == []
    assert server.queued_events("pg") == []
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        found = conn.execute("SELECT to_regclass(%s)", [f'"{schema}".dry_run']).fetchone()
    assert found == (None,)
    warehouse = server.events_dir / "warehouse.duckdb"
    if warehouse.exists():  # the node may have opened it; it holds no table
        with duckdb.connect(str(warehouse), read_only=True) as conn:
            assert conn.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_name = 'dry_run'"
            ).fetchone() == (0,)


@pytest.mark.parametrize("dest_id", ["hook", "lake"])
def test_destinations_without_tables_show_the_event(server: Server, dest_id: str) -> None:
    """HTTP services and the files family's `json` format take the event as an object: shown flat."""
    answer = dry_run(server, dest_id, {"event_type": "signup", "user": {"id": 3, "tags": ["a"]}}, format="full")
    assert answer.status_code == 200, answer.text
    (event,) = answer.json()["events"]
    assert event["status"] == "ok"
    fields = {f["field"]: f for f in event["fields"]}
    assert fields["user_id"]["value"] == 3 and fields["user_tags"]["value"] == '["a"]'
    if dest_id == "lake":
        assert event["table"] == "signup"
    else:
        assert {f["type"] for f in event["fields"]} == {"string"}  # HTTP services send text
