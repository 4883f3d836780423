"""JSON columns and the unmapped column through `eventspark serve` on real Postgres: events posted
over HTTP, loaded by the stream worker (`mode: stream`) or by the Spark executors (batch: serve
writes the incoming log, `process_once` — the CLI's `process` — loads it). A `jsonb` mapping keeps
`props` whole; `max_columns` is passed by the very first events, so the fields it leaves out land
in the unmapped column `extra` (batch: the first pass patches the table and waits, the next loads)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
from rich.console import Console

from eventspark.batch.process import process_once
from eventspark.config.loading import load_config
from tests.batch.helpers import SPARK
from tests.collector import conftest as collector_fixtures
from tests.collector.conftest import Server
from tests.conftest import pg_conninfo
from tests.stream.warehouses import S2S_PATH, STREAM_SETTINGS, TOKENS

run_server = collector_fixtures.run_server

DEST = "pg"
MAX_COLUMNS = 6
LAYOUT = {
    "table_name_template": "events",
    "mappings": {"fields": [{"src": "/props", "action": "cast", "type": "jsonb"}]},
    "unmapped_column": "extra",
    "max_columns": MAX_COLUMNS,
}
EVENTS = [
    {"eventn_ctx": {"event_id": "e0"}, "props": {"b": [1, {"c": None}], "a": "x"}, "zeta": 1, "omega": {"o": True}},
    {"eventn_ctx": {"event_id": "e1"}, "props": [3, 4], "zeta": 2},
]


def config(datasource: dict[str, Any], mode: str) -> dict[str, Any]:
    destination = {"type": "postgres", "mode": mode, "datasource": datasource, "data_layout": LAYOUT}
    return {
        "api_keys": TOKENS,
        "log": {"rotation_min": 60},
        "destinations": {DEST: destination},
        "stream": STREAM_SETTINGS,
        "spark": SPARK,  # the shared session's settings: `process_once` then reuses it
    }


def post(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for event in EVENTS:
            assert client.post(S2S_PATH, json=event).status_code == 200


def table(schema: str) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The columns of `events` with their types, and its rows as dicts without NULLs, by event id."""
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        found = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s"
            " AND table_name = 'events'",
            [schema],
        ).fetchall()
        cursor = conn.execute("SELECT * FROM events ORDER BY eventn_ctx_event_id")
        names = [d.name for d in cursor.description or ()]
        rows = [{n: v for n, v in zip(names, row, strict=True) if v is not None} for row in cursor.fetchall()]
    return dict(found), rows


def assert_loaded(schema: str) -> None:
    columns, rows = table(schema)
    assert columns["props"] == "jsonb" and columns["extra"] == "json", columns
    assert len(columns) == MAX_COLUMNS + 1, f"max_columns counts every column but the unmapped one: {columns}"
    assert {"_timestamp", "eventn_ctx_event_id"} <= columns.keys()  # kept first
    assert [row["eventn_ctx_event_id"] for row in rows] == ["e0", "e1"]
    first, second = rows
    assert first.get("props", first.get("extra", {}).get("props")) == {"a": "x", "b": [1, {"c": None}]}
    assert second.get("props", second.get("extra", {}).get("props")) == [3, 4]
    # Each field is in its column or in `extra`, never both, never lost.
    for row, fields in ((first, {"zeta": 1, "omega_o": True}), (second, {"zeta": 2})):
        extra = row.get("extra", {})
        assert not (extra.keys() & columns.keys()), extra
        for name, value in fields.items():
            assert row.get(name, extra.get(name)) == value, (name, row)
    assert any("extra" in row for row in rows)


def wait_for(check: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            check()
            return
        except (AssertionError, KeyError, psycopg.errors.UndefinedTable):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_stream_json_column_and_unmapped_column(run_server: Any, pg_datasource: dict[str, Any], pg_schema: str) -> None:
    server = run_server(config(pg_datasource, "stream"))
    post(server)
    wait_for(lambda: assert_loaded(pg_schema))
    assert not (server.events_dir / "failed" / f"failed.dst={DEST}.log").exists()
    assert server.stop() == 0
    assert "Traceback" not in server.text(), server.text()[-3000:]


def test_batch_json_column_and_unmapped_column(
    run_server: Any, spark: Any, tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str
) -> None:
    server = run_server(config(pg_datasource, "batch"))
    post(server)
    assert server.stop() == 0
    loaded = load_config(tmp_path / "eventspark.json")
    first = Console(record=True, width=300)
    assert not process_once(loaded, first, keep_session=True)  # the table is patched, the load waits
    assert "go to the unmapped column 'extra' from the next pass" in first.export_text(), first.export_text()
    assert table(pg_schema)[1] == []
    second = Console(record=True, width=300)
    assert process_once(loaded, second, keep_session=True), second.export_text()
    assert_loaded(pg_schema)
    assert not (server.events_dir / "failed").exists() or not any((server.events_dir / "failed").iterdir())
    assert "1 log(s) archived" in second.export_text()
