"""Stream delivery into the machine's Postgres: types, poison events, schema changes, redelivery."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from eventspark.steps.context import line_event_id
from tests.conftest import pg_conninfo
from tests.stream.helpers import KEY, Harness, event, make_config, postgres_stream


def query(sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_conninfo()) as conn:
        return conn.execute(sql).fetchall()


def execute(sql: str) -> None:
    with psycopg.connect(pg_conninfo()) as conn:
        conn.execute(sql)


def column_types(schema: str, table: str) -> dict[str, str]:
    rows = query(
        "SELECT column_name, data_type FROM information_schema.columns "
        f"WHERE table_schema = '{schema}' AND table_name = '{table}'"
    )
    return dict(rows)  # type: ignore[arg-type]


@pytest.fixture
def harness(tmp_path: Path, pg_datasource: dict[str, Any]) -> Iterator[Harness]:
    loaded = make_config(tmp_path, {"pg": postgres_stream(pg_datasource, "{{.event_type}}")})
    h = Harness.build(loaded, "pg")
    yield h
    h.close()


def test_events_land_with_the_right_types(harness: Harness, pg_schema: str) -> None:
    harness.append(
        event(1, price=9.5, qty=3, ok=True, tags=["a", "b"], page={"url": "/x", "title": "X"}),
        event(2, price=10, qty=4, ok=False, page={"url": "/y"}),
    )
    harness.drain()
    types = column_types(pg_schema, "pageview")
    assert types["price"] == "numeric"
    assert types["qty"] == "bigint"
    assert types["ok"] == "boolean"
    assert types["tags"] == "text"
    assert types["page_url"] == "text"
    assert types["_timestamp"] == "timestamp without time zone"
    rows = query(
        f"SELECT {KEY}, price::float8, qty, ok, tags, page_url, page_title, _timestamp::text "
        f'FROM "{pg_schema}".pageview ORDER BY 1'
    )
    assert rows == [
        ("e000001", 9.5, 3, True, '["a","b"]', "/x", "X", "2026-11-01 10:00:00"),
        ("e000002", 10.0, 4, False, None, "/y", None, "2026-11-01 10:00:00"),
    ]
    assert [e["eventn_ctx"]["event_id"] for e in harness.archived()] == ["e000001", "e000002"]
    assert harness.failed() == []


def test_timestamps_with_offsets_are_stored_in_utc(harness: Harness, pg_schema: str) -> None:
    harness.append(event(1, _timestamp="2026-11-01T12:30:00+02:00"))
    harness.drain()
    assert query(f'SELECT _timestamp::text FROM "{pg_schema}".pageview') == [("2026-11-01 10:30:00",)]


def test_a_poison_event_goes_to_failed_while_its_neighbours_load(harness: Harness, pg_schema: str) -> None:
    harness.append(event(0, qty=1, note="ok"))
    harness.drain()  # qty is a bigint column now
    batch = [event(n, qty=n, note="ok") for n in range(1, 41)]
    batch[7]["qty"] = "not a number"  # refused by eventspark's own type check
    batch[21]["note"] = "nul \x00 byte"  # refused by Postgres: text cannot hold NUL
    batch[33]["big"] = 1e30  # numeric(38,18) overflows in Postgres
    batch[34]["big"] = 1.5
    harness.append(*batch)
    harness.drain()

    ids = [r[0] for r in query(f'SELECT {KEY} FROM "{pg_schema}".pageview ORDER BY 1')]
    assert ids == [f"e{n:06d}" for n in range(41) if n not in (8, 22, 34)]
    failed = {f["event_id"]: f["error"] for f in harness.failed()}
    assert failed.keys() == {"e000008", "e000022", "e000034"}
    assert "'qty'" in failed["e000008"] and "INT64" in failed["e000008"]
    assert "Unicode escape" in failed["e000022"]  # \u0000 cannot become text
    assert "overflow" in failed["e000034"]
    # The failed line holds the event as it was queued.
    original = next(f for f in harness.failed() if f["event_id"] == "e000008")["event"]
    assert original["eventn_ctx"] == {"event_id": "e000008"} and original["qty"] == "not a number"


def test_a_new_field_mid_stream_adds_a_column(harness: Harness, pg_schema: str) -> None:
    harness.append(event(1))
    harness.drain()
    assert "campaign" not in column_types(pg_schema, "pageview")
    harness.append(event(2, campaign={"source": "news", "id": 7}), event(3))
    harness.drain()
    types = column_types(pg_schema, "pageview")
    assert types["campaign_source"] == "text" and types["campaign_id"] == "bigint"
    rows = query(f'SELECT {KEY}, campaign_source, campaign_id FROM "{pg_schema}".pageview ORDER BY 1')
    assert rows == [("e000001", None, None), ("e000002", "news", 7), ("e000003", None, None)]


def test_a_schema_changed_behind_the_cache_is_read_again(harness: Harness, pg_schema: str) -> None:
    harness.append(event(1, extra="x"))
    harness.drain()
    execute(f'ALTER TABLE "{pg_schema}".pageview DROP COLUMN extra')
    harness.append(event(2, extra="y"))
    harness.drain()  # the insert fails on the cached schema, the refreshed one gets the column back
    assert query(f'SELECT {KEY}, extra FROM "{pg_schema}".pageview ORDER BY 1') == [
        ("e000001", None),
        ("e000002", "y"),
    ]
    assert harness.failed() == []


def test_a_column_type_fixed_by_hand_is_read_again_before_failing(harness: Harness, pg_schema: str) -> None:
    harness.append(event(1, qty=1))
    harness.drain()  # qty is a bigint column now, cached as INT64
    reads = []
    read_table = harness.worker.delivery.adapter.read_table

    def counted(table: str) -> Any:
        reads.append(table)
        return read_table(table)

    harness.worker.delivery.adapter.read_table = counted  # type: ignore[method-assign]
    harness.append(event(2, qty="abc"))
    harness.drain()  # does not fit bigint: read again (still bigint), then failed
    assert len(reads) == 1
    assert ["does not fit" in f["error"] for f in harness.failed()] == [True]
    harness.append(event(3, qty="abc"))
    harness.drain()  # read again at most once per table every REFRESH_SECONDS
    assert len(reads) == 1 and len(harness.failed()) == 2

    execute(f'ALTER TABLE "{pg_schema}".pageview ALTER COLUMN qty TYPE text')  # the operator's fix
    harness.worker.delivery._refreshed.clear()  # as if REFRESH_SECONDS had passed
    harness.append(event(4, qty="007"), event(5, qty="xyz"))
    harness.drain()  # "xyz" does not fit the cached bigint: the fresh schema says text
    assert len(reads) == 2 and len(harness.failed()) == 2
    rows = query(f'SELECT {KEY}, qty FROM "{pg_schema}".pageview ORDER BY 1')
    # "007" was checked against the stale bigint first: it is stored as sent, not as 7.
    assert rows == [("e000001", "1"), ("e000004", "007"), ("e000005", "xyz")]


def test_redelivered_events_are_loaded_once(harness: Harness, pg_schema: str) -> None:
    harness.append(*[event(n) for n in range(5)])
    harness.drain()
    harness.append(*[event(n) for n in range(3, 8)])  # 3 and 4 again, as after a crash before the ack
    harness.drain()
    assert query(f'SELECT count(*), count(DISTINCT {KEY}) FROM "{pg_schema}".pageview') == [(8, 8)]


def test_template_skips_and_failures(tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str) -> None:
    template = '{{if eq .event_type "bot"}}{{else}}{{.event_type}}{{end}}'
    loaded = make_config(tmp_path, {"pg": postgres_stream(pg_datasource, template)})
    h = Harness.build(loaded, "pg")
    try:
        h.append(event(1), event(2, event_type="bot"), event(3, event_type="click"))
        h.writer.append(b"not json\n")
        h.drain()
        assert h.worker.delivered == 2 and h.worker.skipped == 1 and h.worker.failed == 1
        assert [f["event"] for f in h.failed()] == ["not json"]
        assert query(f'SELECT {KEY} FROM "{pg_schema}".click') == [("e000003",)]
    finally:
        h.close()


def test_an_event_without_id_gets_one_derived_from_its_line(harness: Harness, pg_schema: str) -> None:
    # issue 17: EventNative 1.41 gave a line without an event id one at load; eventspark derives it
    # from the line (a missing key of another `primary_key_fields` still fails: test_chunks)
    no_id = event(2)
    del no_id["eventn_ctx"]
    harness.append(event(1), no_id)
    harness.drain()
    derived = line_event_id(orjson.dumps(no_id))
    assert query(f'SELECT {KEY} FROM "{pg_schema}".pageview ORDER BY 1') == sorted([("e000001",), (derived,)])
    assert harness.failed() == []


def test_the_order_column_is_reserved_as_in_batch(harness: Harness, pg_schema: str) -> None:
    reserved = {**event(2), "_es_seq": 5}
    harness.append(event(1), reserved)
    harness.drain()
    assert query(f'SELECT {KEY} FROM "{pg_schema}".pageview') == [("e000001",)]
    assert ["'_es_seq' is reserved" in f["error"] for f in harness.failed()] == [True]
    columns = query(
        f"SELECT column_name FROM information_schema.columns WHERE table_schema = '{pg_schema}' "
        "AND table_name = 'pageview'"
    )
    assert ("_es_seq",) not in columns
