"""Transforms end to end on real Postgres: events posted to `eventspark serve` go through a
destination's transform in the stream worker (`mode: stream`) and in the Spark executors
(batch: serve writes the incoming log, `process_once` — the CLI's `process` — loads it). The
transform is EventNative's documented kinds (skip, multiply, rename table, typed fields) plus a
hostile branch (endless loop, huge allocation, throw): hostile events land in `events/failed`
with the reason, the others load, and the worker / executors keep going."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest
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
TRANSFORM = """
if ($.kind == "skip") return null
if ($.kind == "loop") { while (true) {} }
if ($.kind == "alloc") { var a = []; while (true) a.push("x".repeat(65536) + a.length) }
if ($.kind == "throw") throw new Error("bad event " + $.n)
if ($.kind == "half") {
  return [{JITSU_TABLE_NAME: "halves", n: $.n}, {JITSU_TABLE_NAME: "tiny", v: 12345, __sql_type_v: "numeric(3,0)"}]
}
if ($.kind == "order") {
  return $.items.map(function (item, i) {
    return {JITSU_TABLE_NAME: "order_items", order: $.n, sku: item.sku, price: item.price,
            __sql_type_price: "numeric(12,2)"}
  })
}
return {...$, JITSU_TABLE_NAME: "renamed", amount: $.n * 1.5, __sql_type_amount: ["numeric", "numeric(12,2)"]}
"""
HOSTILE = {"loop": "ran longer than", "alloc": "used more than", "throw": "Error: bad event"}


def body(n: int, kind: str) -> dict[str, Any]:
    event: dict[str, Any] = {"eventn_ctx": {"event_id": f"e{n}"}, "n": n, "kind": kind}
    if kind == "order":
        event["items"] = [{"sku": f"s{n}-{i}", "price": 9.99 + i} for i in range(3)]
    return event


EVENTS = [
    body(n, kind) for n, kind in enumerate(["plain", "skip", "order", "loop", "plain", "alloc", "throw", "plain"])
]


def destination(datasource: dict[str, Any], mode: str) -> dict[str, Any]:
    return {
        "type": "postgres",
        "mode": mode,
        "datasource": datasource,
        "transform": TRANSFORM,
        "transform_timeout_ms": 300,
        "transform_memory_mb": 32,
    }


def config(datasource: dict[str, Any], mode: str) -> dict[str, Any]:
    return {
        "api_keys": TOKENS,
        "log": {"rotation_min": 60},
        "destinations": {DEST: destination(datasource, mode)},
        "stream": STREAM_SETTINGS,
        "spark": SPARK,  # the shared test session's settings: `process_once` reuses it
    }


def post(server: Server, events: list[dict[str, Any]]) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for event in events:
            assert client.post(S2S_PATH, json=event).status_code == 200


def rows(schema: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        return conn.execute(sql).fetchall()


def column_type(schema: str, table: str, column: str) -> str:
    found = rows(
        schema,
        f"SELECT data_type, numeric_precision, numeric_scale FROM information_schema.columns"
        f" WHERE table_schema = '{schema}' AND table_name = '{table}' AND column_name = '{column}'",
    )
    kind, precision, scale = found[0]
    return f"{kind}({precision},{scale})" if kind == "numeric" else kind


def failed_lines(events_dir: Path) -> dict[str, str]:
    """Event id → error of every line in the destination's failed log(s)."""
    found = {}
    for path in (events_dir / "failed").glob(f"failed.dst={DEST}*.log"):
        for line in path.read_bytes().splitlines():
            record = orjson.loads(line)
            found[record["event_id"]] = record["error"]
    return found


def assert_loaded(schema: str, events_dir: Path) -> None:
    """What TRANSFORM makes of EVENTS: plain events in `renamed` with a typed amount, the order
    as three typed rows in `order_items`, the skipped one nowhere, the hostile ones failed."""
    assert rows(schema, "SELECT eventn_ctx_event_id, n, amount FROM renamed ORDER BY n") == [
        ("e0", 0, 0),
        ("e4", 4, 6),
        ("e7", 7, 10.5),
    ]
    assert column_type(schema, "renamed", "amount") == "numeric(12,2)"
    assert rows(schema, "SELECT eventn_ctx_event_id, sku, price FROM order_items ORDER BY sku") == [
        ("e2", "s2-0", Decimal("9.99")),
        ("e2_1", "s2-1", Decimal("10.99")),
        ("e2_2", "s2-2", Decimal("11.99")),
    ]
    assert column_type(schema, "order_items", "price") == "numeric(12,2)"
    failed = failed_lines(events_dir)
    assert sorted(failed) == ["e3", "e5", "e6"]
    for event_id, kind in (("e3", "loop"), ("e5", "alloc"), ("e6", "throw")):
        assert failed[event_id].startswith("transform: ") and HOSTILE[kind] in failed[event_id], failed[event_id]
    tables = {
        name
        for (name,) in rows(schema, f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{schema}'")
    }
    assert "events" not in tables  # every event was renamed, skipped or failed


def wait_for(check: Any, timeout: float = 60) -> None:
    """Until `check()` neither raises nor returns False (the last failure when `timeout` passes)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            assert check() is not False, "not yet"
            return
        except (AssertionError, psycopg.errors.UndefinedTable, IndexError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_stream_worker_transforms_and_survives_hostile_events(
    run_server: Any, pg_datasource: dict[str, Any], pg_schema: str
) -> None:
    server = run_server(config(pg_datasource, "stream"))
    post(server, EVENTS)
    wait_for(lambda: assert_loaded(pg_schema, server.events_dir))
    post(server, [body(100, "plain")])  # the worker is still alive after the hostile events
    wait_for(lambda: rows(pg_schema, "SELECT n FROM renamed WHERE n = 100") == [(100,)])
    # An event whose second row the table refuses is not delivered: it fails with that row's reason.
    post(server, [body(101, "half")])
    wait_for(lambda: "e101" in failed_lines(server.events_dir))
    reason = failed_lines(server.events_dir)["e101"]
    assert "numeric" in reason and reason.endswith("(its rows in halves were loaded)"), reason
    assert rows(pg_schema, "SELECT n FROM halves") == [(101,)]  # the row that was accepted stays
    assert server.stop() == 0
    assert "Traceback" not in server.text(), server.text()[-3000:]


@pytest.mark.spark
def test_spark_executors_transform_and_survive_hostile_events(
    run_server: Any, spark: Any, tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str
) -> None:
    server = run_server(config(pg_datasource, "batch"))
    post(server, EVENTS)
    assert server.stop() == 0
    loaded = load_config(tmp_path / "eventspark.json")
    console = Console(record=True, width=300)
    assert process_once(loaded, console, keep_session=True), console.export_text()
    assert_loaded(pg_schema, server.events_dir)
    text = console.export_text()
    assert "│ pg          │ -           │ 0    │ 3      │ 1       │ OK" in text, text  # hostile, skipped
    assert "│ pg          │ order_items │ 3    │ 0      │ 0       │ OK" in text, text
    assert "│ pg          │ renamed     │ 3    │ 0      │ 0       │ OK" in text, text
    assert "1 log(s) archived" in text
