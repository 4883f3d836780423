"""Stream delivery into a DuckDB file: types, a poison event, a new column, redelivery."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.stream.helpers import KEY, Harness, duckdb_stream, event, make_config


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    loaded = make_config(tmp_path, {"dd": duckdb_stream(tmp_path / "warehouse.duckdb", "{{.event_type}}")})
    h = Harness.build(loaded, "dd")
    yield h
    h.close()


def query(h: Harness, sql: str) -> list[tuple[Any, ...]]:
    h.worker.delivery.adapter.close()  # the worker's connection would hold the file
    with duckdb.connect(str(h.events_dir.parent / "warehouse.duckdb")) as conn:
        return conn.execute(sql).fetchall()


def test_events_land_typed_and_a_poison_event_fails_alone(harness: Harness) -> None:
    # A constraint only DuckDB knows about: eventspark's type check passes, the insert fails.
    query(harness, f"CREATE TABLE pageview ({KEY} VARCHAR PRIMARY KEY, qty BIGINT CHECK (qty < 1000))")
    harness.append(event(0, qty=1, price=1.5, ok=True, _timestamp="2026-11-01T12:30:00+02:00"))
    harness.drain()
    batch = [event(n, qty=n, price=2.5, ok=False) for n in range(1, 21)]
    batch[4]["qty"] = "five"  # refused by eventspark's type check
    batch[9]["qty"] = 5000  # refused by DuckDB
    harness.append(*batch)
    harness.drain()

    types = dict(
        query(harness, "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'pageview'")
    )
    assert types["qty"] == "BIGINT" and types["price"] == "DOUBLE" and types["ok"] == "BOOLEAN"
    assert types["_timestamp"] == "TIMESTAMP WITH TIME ZONE"
    ids = [r[0] for r in query(harness, f"SELECT {KEY} FROM pageview ORDER BY 1")]
    assert ids == [f"e{n:06d}" for n in range(21) if n not in (5, 10)]
    first = query(harness, f"SELECT CAST(_timestamp AS VARCHAR), qty FROM pageview WHERE {KEY} = 'e000000'")
    assert first == [("2026-11-01 10:30:00+00", 1)]
    failed = {f["event_id"]: f["error"] for f in harness.failed()}
    assert set(failed) == {"e000005", "e000010"}
    assert "'qty'" in failed["e000005"] and "CHECK" in failed["e000010"].upper()


def test_a_new_field_adds_a_column_and_redelivery_is_idempotent(harness: Harness) -> None:
    harness.append(event(1), event(2))
    harness.drain()
    harness.append(event(2), event(3, utm={"source": "ads"}))
    harness.drain()
    rows = query(harness, f"SELECT {KEY}, utm_source FROM pageview ORDER BY 1")
    assert rows == [("e000001", None), ("e000002", None), ("e000003", "ads")]
