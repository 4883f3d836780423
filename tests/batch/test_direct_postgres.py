"""Direct writes into the machine's Postgres (`destinations/postgres/direct.py`): a split's rows
go straight into the target tables with their load markers, in one transaction, exactly once;
and passes on Spark that write an existing table directly, without the driver's commit."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eventspark.batch.process import run_pass
from eventspark.coordination import MemoryCoordination
from eventspark.destinations.base import LOADS_TABLE, DirectRows, TerminalError, TransientError
from eventspark.destinations.postgres.configuration import PostgresDestination
from eventspark.destinations.postgres.load import PostgresWarehouse
from eventspark.destinations.sql.statements import split_marker_select
from eventspark.steps.diff import TablePatch
from tests.batch.helpers import MarkersAt, event, make_config, pair_counts, pg_rows, postgres_destination, put_log
from tests.conftest import pg_conninfo

SPLIT = "incoming.tok.log@0-1000"
COLUMNS = {"id": "text", "n": "bigint", "x": "numeric(38,18)", "ok": "boolean", "at": "timestamptz", "t": "timestamp"}


@pytest.fixture
def app_name() -> str:
    """The writer's `application_name`: how a test finds its connection on the server."""
    return f"direct-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def warehouse(pg_datasource: dict[str, Any], app_name: str) -> Iterator[PostgresWarehouse]:
    # A session time zone far from UTC: the writer must not depend on the server's default.
    parameters = {"application_name": app_name, "options": "-c TimeZone=America/New_York"}
    dest = PostgresDestination.model_validate(
        {"type": "postgres", "datasource": {**pg_datasource, "parameters": parameters}}
    )
    adapter = PostgresWarehouse("pg", dest)
    adapter.patch(TablePatch("events", create=True, add_columns=COLUMNS))
    adapter.patch(TablePatch("other", create=True, add_columns={"id": "text"}))
    yield adapter
    adapter.close()


def rows_of(schema: str, table: str, columns: str = "*") -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_conninfo()) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        return conn.execute(f'SELECT {columns} FROM "{schema}"."{table}" ORDER BY 1').fetchall()


def ids(n: int, prefix: str = "e") -> DirectRows:
    return DirectRows(["id"], [[f"{prefix}{i}"] for i in range(n)])


def test_a_split_lands_with_one_marker_per_table(warehouse: PostgresWarehouse, pg_schema: str) -> None:
    writer = warehouse.direct_target("job1").open()
    try:
        writer.write_split(SPLIT, {"events": ids(3), "other": ids(2, "o")})
    finally:
        writer.close()
    assert [r[0] for r in rows_of(pg_schema, "events", "id")] == ["e0", "e1", "e2"]
    assert [r[0] for r in rows_of(pg_schema, "other", "id")] == ["o0", "o1"]
    assert warehouse.loaded_splits("pg", ["incoming.tok.log"]) == {(SPLIT, "events"), (SPLIT, "other")}
    # Split markers are not log markers: the pair of the whole log is not committed.
    assert warehouse.loaded_files("pg", ["incoming.tok.log"]) == set()
    assert warehouse.loaded_splits("pg", ["incoming.tok.lo"]) == set()  # a prefix of another log's name


def test_a_second_write_of_a_split_is_refused_and_duplicates_nothing(
    warehouse: PostgresWarehouse, pg_schema: str
) -> None:
    writer = warehouse.direct_target("job1").open()
    try:
        writer.write_split(SPLIT, {"events": ids(3)})
        with pytest.raises(TerminalError, match="written already"):
            writer.write_split(SPLIT, {"events": ids(3), "other": ids(2)})
        # The refused transaction left the connection usable for the task's next split.
        writer.write_split("incoming.tok.log@1000-2000", {"other": ids(1)})
    finally:
        writer.close()
    assert len(rows_of(pg_schema, "events")) == 3
    assert len(rows_of(pg_schema, "other")) == 1


def test_a_value_the_server_refuses_rolls_back_the_whole_split(warehouse: PostgresWarehouse, pg_schema: str) -> None:
    bad = DirectRows(["id", "n"], [["a", 1], ["b", 2], ["c", "not a number"]])
    writer = warehouse.direct_target("job1").open()
    try:
        with pytest.raises(TerminalError, match="bigint"):
            writer.write_split(SPLIT, {"other": ids(4), "events": bad})
    finally:
        writer.close()
    assert rows_of(pg_schema, "other") == []
    assert rows_of(pg_schema, "events") == []
    assert warehouse.loaded_splits("pg", ["incoming.tok.log"]) == set()


def test_a_lost_connection_is_transient_and_the_next_split_reconnects(
    warehouse: PostgresWarehouse, pg_schema: str, app_name: str
) -> None:
    writer = warehouse.direct_target("job1").open()
    warehouse.close()  # the writer's connection is then the only one with this application_name
    try:
        writer.write_split("incoming.tok.log@0-10", {"other": ids(1, "a")})
        with psycopg.connect(pg_conninfo(), autocommit=True) as admin:
            ended = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", [app_name]
            ).fetchall()
        assert ended == [(True,)]
        with pytest.raises(TransientError):
            writer.write_split("incoming.tok.log@10-20", {"other": ids(1, "b")})
        writer.write_split("incoming.tok.log@10-20", {"other": ids(1, "b")})
    finally:
        writer.close()
    assert rows_of(pg_schema, "other") == [("a0",), ("b0",)]


def test_values_round_trip_and_timestamps_land_in_utc(warehouse: PostgresWarehouse, pg_schema: str) -> None:
    text = "tab\there, newline\nthere, back\\slash, 'quotes' \"both\", ünïcødé, \\N"
    rows = DirectRows(
        list(COLUMNS),
        [
            ["a", 2**62, 0.1, True, "2024-03-01T12:00:00+02:00", "2024-03-01T10:00:00.123456"],
            ["b", -(2**63), 12345678901234567890, False, "2024-03-01T12:00:00", "2024-03-01T10:00:00"],
            [text, None, -1.5e-7, None, None, None],
            ["d"],  # the missing tail is NULL
        ],
    )
    writer = warehouse.direct_target("job1").open()
    try:
        writer.write_split(SPLIT, {"events": rows})
    finally:
        writer.close()
    utc = dt.UTC
    assert rows_of(pg_schema, "events") == [
        (
            "a",
            2**62,
            Decimal("0.1"),
            True,
            dt.datetime(2024, 3, 1, 10, tzinfo=utc),
            dt.datetime(2024, 3, 1, 10, 0, 0, 123456),
        ),
        # Without an offset a timestamp is UTC, whatever the connection's own time zone.
        (
            "b",
            -(2**63),
            Decimal("12345678901234567890"),
            False,
            dt.datetime(2024, 3, 1, 12, tzinfo=utc),
            dt.datetime(2024, 3, 1, 10),
        ),
        ("d", None, None, None, None, None),
        (text, None, Decimal("-1.5E-7"), None, None, None),
    ]


def test_split_markers_are_read_by_log_name_taken_literally(warehouse: PostgresWarehouse) -> None:
    writer = warehouse.direct_target("job1").open()
    try:
        for log in ("incoming.tok=a_b%.log", "incoming.tok=axbz.log", "incoming.tok=a_b%.log.gz"):
            writer.write_split(f"{log}@0-10", {"other": ids(1)})
    finally:
        writer.close()
    assert warehouse.loaded_splits("pg", ["incoming.tok=a_b%.log"]) == {("incoming.tok=a_b%.log@0-10", "other")}
    assert warehouse.loaded_splits("other-destination", ["incoming.tok=a_b%.log"]) == set()


def test_split_markers_are_read_through_an_index(warehouse: PostgresWarehouse, pg_schema: str) -> None:
    """The marker table keeps every split of every pass: the read by log prefix must not scan it."""
    select = split_marker_select(warehouse.name(LOADS_TABLE), warehouse.literal, "pg", ["incoming.tok=a_b.log"])
    with psycopg.connect(pg_conninfo()) as conn:
        conn.execute("SET enable_seqscan = off")  # the table is tiny: make the planner show what it can use
        plan = "\n".join(row[0] for row in conn.execute(f"EXPLAIN {select}").fetchall())
    assert f"{LOADS_TABLE}_split" in plan, plan


# --- the driver's side: passes on Spark ----------------------------------------------------------


def markers(schema: str) -> set[tuple[str, str]]:
    """(file, table) of every load marker: a log's name, or a split key (`<log>@<start>-<end>`)."""
    with psycopg.connect(pg_conninfo()) as conn:
        return set(conn.execute(f'SELECT file, table_name FROM "{schema}"._eventspark_loads').fetchall())


@pytest.mark.spark
def test_passes_into_an_existing_table_write_it_directly_and_a_new_column_is_staged(
    spark: Any, tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str
) -> None:
    loaded = make_config(tmp_path, {"pg": postgres_destination(pg_datasource, template="t")})
    coordination = MemoryCoordination("test")
    created = put_log(tmp_path, [event(f"a{i}", n=i) for i in range(3)])
    first = (f"{created.name}@0-{created.stat().st_size}", "t")
    # No table yet: staged; the driver patches, the task's rows are committed with their split's marker.
    committed = MarkersAt(lambda: markers(pg_schema))
    assert run_pass(loaded, coordination, session=spark, fault=committed).ok
    assert committed.seen == {first}
    assert markers(pg_schema) == set()  # the log archived: its markers removed

    direct = put_log(tmp_path, [event(f"b{i}", n=i) for i in range(4)] + [event("misfit", n="x")])
    size = direct.stat().st_size
    committed = MarkersAt(lambda: markers(pg_schema))
    result = run_pass(loaded, coordination, session=spark, fault=committed)

    assert result.ok and pair_counts(result) == (4, 1)
    # One split, written by its executor with its marker; no commit by the driver (no log marker).
    assert committed.seen == {(f"{direct.name}@0-{size}", "t")}
    assert not direct.exists() and markers(pg_schema) == set()  # uploaded: archived, markers removed
    assert [r[0] for r in pg_rows(pg_schema, "SELECT eventn_ctx_event_id FROM t ORDER BY 1")] == [
        "a0",
        "a1",
        "a2",
        "b0",
        "b1",
        "b2",
        "b3",
    ]

    widened = put_log(tmp_path, [event("c0", n=1), event("c1", n=2, extra="new column")])
    wide = (f"{widened.name}@0-{widened.stat().st_size}", "t")
    committed = MarkersAt(lambda: markers(pg_schema))
    assert run_pass(loaded, coordination, session=spark, fault=committed).ok
    assert committed.seen == {wide}  # staged for the new column, committed with its split's marker: no log marker
    assert pg_rows(pg_schema, "SELECT eventn_ctx_event_id, extra FROM t WHERE extra IS NOT NULL") == [
        ("c1", "new column")
    ]
    assert pg_rows(pg_schema, "SELECT count(*), count(DISTINCT eventn_ctx_event_id) FROM t") == [(9, 9)]


def test_rows_telling_their_python_types_are_copied_with_one_encoder_per_column(
    warehouse: PostgresWarehouse, pg_schema: str
) -> None:
    kinds = [str, int, float, bool, str, str]
    rows = DirectRows(
        list(COLUMNS),
        [["a", 2**63 - 1, 1.5e19, True, "2024-03-01T12:00:00+02:00", "2024-03-01T10:00:00Z"], ["b", None, -0.25]],
        kinds,
    )
    writer = warehouse.direct_target("job1").open()
    try:
        writer.write_split(SPLIT, {"events": rows})
    finally:
        writer.close()
    assert rows_of(pg_schema, "events") == [
        (
            "a",
            2**63 - 1,
            Decimal("1.5E+19"),
            True,
            dt.datetime(2024, 3, 1, 10, tzinfo=dt.UTC),
            dt.datetime(2024, 3, 1, 10),
        ),
        ("b", None, Decimal("-0.25"), None, None, None),
    ]
