"""The executor side of direct writes (`batch.direct`, `batch.partition`): which tables a task
writes straight into, how their values are checked, and the DIRECT / STAGED / DONE states of a
(split, destination, table), against the machine's Postgres."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import pickle
import signal
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from eventspark.batch.direct import STAGE, DirectBuffer, DirectColumns, direct_columns
from eventspark.batch.partition import process_splits
from eventspark.batch.plan import JobPlan, token_routes
from eventspark.batch.results import TaskResult
from eventspark.batch.splits import Split
from eventspark.config.models import ApiKey
from eventspark.destinations.postgres.configuration import PostgresDestination
from eventspark.destinations.postgres.load import PostgresWarehouse
from eventspark.steps.diff import TablePatch
from eventspark.steps.typing import DataType
from tests.batch.test_partition import RecordingStage
from tests.conftest import pg_conninfo

COLUMNS = {
    "event_type": "text",
    "eventn_ctx_event_id": "text",
    "n": "bigint",
    "small": "smallint",
    "x": "numeric(38,18)",
    "price": "numeric(5,2)",
    "ok": "boolean",
    "code": "character varying(3)",
    "at": "timestamp with time zone",
    "t": "timestamp without time zone",
}


def _columns(sql_types: dict[str, str]) -> DirectColumns | None:
    from eventspark.destinations.postgres.dialect import DIALECT

    return direct_columns(sql_types, {name: DIALECT.data_type_of(sql) for name, sql in sql_types.items()})


# --- the checks of values -------------------------------------------------------------------------


def test_only_tables_whose_every_column_is_checked_are_written_directly() -> None:
    assert _columns(COLUMNS) is not None
    assert _columns({"d": "double precision", "v": "character varying", "n": "numeric", "i": "integer"})
    for other in ("jsonb", "real", "character(3)", "date", "uuid", "timestamp(3) without time zone"):
        assert _columns({"event_type": "text", "odd": other}) is None, other


def test_values_are_checked_and_normalised_as_the_staged_path_would_load_them() -> None:
    columns = _columns(COLUMNS)
    assert columns is not None
    buffer = DirectBuffer(columns)
    row: dict[str, Any] = {
        "event_type": 7,  # a number into text: its text
        "n": 3.0,  # an integral float into bigint
        "small": "12",
        "x": 2,  # an int into numeric: a float, as staged
        "price": 999.994,
        "ok": "true",
        "code": "abcdef",  # cut to varchar(3), as the staged path's CAST cuts it
        "at": "2020-08-02T20:23:56.5+02:00",  # timestamptz: the server reads the offset
        "t": "2020-08-02T20:23:56.5+02:00",  # timestamp: the offset would be ignored, so UTC text
        "gone": None,  # a null for a column the table lacks: left out
    }
    assert buffer.add(row, {}) is None
    assert row == {
        "event_type": "7",
        "n": 3,
        "small": 12,
        "x": 2.0,
        "price": 999.994,
        "ok": True,
        "code": "abc",
        "at": "2020-08-02T20:23:56.5+02:00",
        "t": "2020-08-02T18:23:56.500000Z",
        "gone": None,
    }
    assert len(buffer) == 1
    assert buffer.add({"event_type": "a", "t": "2020-08-02T18:23:56Z", "at": "2020-08-02T18:23:56Z"}, {}) is None
    taken = buffer.take()
    assert taken.columns == [c for c in COLUMNS if c != "eventn_ctx_event_id"]
    assert taken.rows[1] == ["a", None, None, None, None, None, None, "2020-08-02T18:23:56Z", "2020-08-02T18:23:56Z"]


@pytest.mark.parametrize(
    ("row", "error"),
    [
        ({"n": "x"}, "column 'n': value 'x' does not fit a INT64 column"),
        ({"n": 2**63}, "column 'n': value 9223372036854775808 does not fit a INT64 column"),
        ({"small": 40000}, "column 'small': value 40000 is out of range for smallint [-32768, 32767]"),
        ({"price": 999.996}, "column 'price': '999.996' has more than 3 digit(s) before the point"),
        ({"x": 1e20}, "column 'x': '1e+20' has more than 20 digit(s) before the point"),
        ({"t": "yesterday"}, "column 't': value 'yesterday' does not fit a TIMESTAMP column"),
        ({"ok": 2}, "column 'ok': value 2 does not fit a BOOL column"),
    ],
)
def test_a_value_that_does_not_fit_fails_its_row(row: dict[str, Any], error: str) -> None:
    columns = _columns(COLUMNS)
    assert columns is not None
    buffer = DirectBuffer(columns)
    assert buffer.add({"event_type": "a", **row}, {}) == error
    assert len(buffer) == 0 and not buffer.rows


def test_a_row_with_a_field_the_table_lacks_must_be_staged() -> None:
    columns = _columns(COLUMNS)
    assert columns is not None
    buffer = DirectBuffer(columns)
    assert buffer.add({"event_type": "a", "new": 1}, {}) is STAGE
    assert buffer.add({"event_type": "a", "new": None}, {"new": "integer"}) is None  # a null adds no column
    assert len(buffer) == 1


# --- a task writing into Postgres -----------------------------------------------------------------


@pytest.fixture
def dest(pg_datasource: dict[str, Any]) -> PostgresDestination:
    return PostgresDestination.model_validate(
        {"type": "postgres", "datasource": pg_datasource, "data_layout": {"table_name_template": "{{.event_type}}"}}
    )


@pytest.fixture
def warehouse(dest: PostgresDestination) -> Iterator[PostgresWarehouse]:
    adapter = PostgresWarehouse("pg", dest)
    adapter.patch(TablePatch("a", create=True, add_columns=COLUMNS))
    adapter.patch(TablePatch("b", create=True, add_columns={"event_type": "text", "eventn_ctx_event_id": "text"}))
    yield adapter
    adapter.close()


def _plan(tmp_path: Path, warehouse: PostgresWarehouse, dest: PostgresDestination, stage: RecordingStage) -> JobPlan:
    plan = JobPlan("job", str(tmp_path / "staging"), {"pg": dest}, {}, {}, (), {"log": "web"}, {"log": 0})
    routes = token_routes([ApiKey(id="web", client_secret="s")], {"pg": dest})
    plan.secret_tokens, plan.token_destinations, plan.default_destinations = routes
    plan.stages = {"pg": stage}  # type: ignore[dict-item]
    tables = warehouse.read_tables()
    plan.existing = {
        "pg": {n: {c: warehouse.data_type_of(t) for c, t in tb.columns.items()} for n, tb in tables.items()}
    }
    plan.sql_types = {"pg": {name: dict(table.columns) for name, table in tables.items()}}
    plan.direct = {"pg": warehouse.direct_target("job")}
    return plan


def _log(tmp_path: Path, events: list[dict[str, Any]]) -> Path:
    path = tmp_path / "log"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    return path


def _run(plan: JobPlan, splits: list[Split]) -> TaskResult:
    (result,) = process_splits(plan, 0, splits)
    return result


def _whole(path: Path) -> list[Split]:
    return [Split(str(path), 0, path.stat().st_size)]


def _rows(schema: str, table: str, columns: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_conninfo()) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        return conn.execute(f'SELECT {columns} FROM "{schema}"."{table}" ORDER BY 1').fetchall()


def _counts(result: TaskResult) -> dict[str, tuple[int, int]]:
    return {c.table: (c.rows, c.failed) for c in result.counts}


def _done(
    tmp_path: Path,
    warehouse: PostgresWarehouse,
    dest: PostgresDestination,
    events: list[dict[str, Any]],
    stage: RecordingStage | None = None,
) -> tuple[JobPlan, list[Split]]:
    """The rerun of a pass that wrote the one split of `events` into table `a` (DONE for `a`)."""
    splits = _whole(_log(tmp_path, events))
    plan = _plan(tmp_path, warehouse, dest, stage or RecordingStage(set()))
    plan.split_done = frozenset({(splits[0].key, "pg", "a")})
    return plan, splits


def test_a_split_whose_rows_fit_is_written_straight_into_its_tables(
    tmp_path: Path, warehouse: PostgresWarehouse, dest: PostgresDestination, pg_schema: str
) -> None:
    stage = RecordingStage(set())
    events = [
        {"event_type": "a", "n": i, "x": i / 4, "ok": i % 2 == 0, "t": "2020-08-02T20:23:56+02:00"} for i in range(5)
    ]
    path = _log(tmp_path, [*events, {"event_type": "b"}, {"event_type": "a", "n": "x"}])
    result = _run(_plan(tmp_path, warehouse, dest, stage), _whole(path))
    assert stage.written == [] and result.staged == [] and result.errors == {}
    key = _whole(path)[0].key
    assert [(d.dest_id, d.split, d.file, d.rows) for d in result.direct] == [("pg", key, "log", {"a": 5, "b": 1})]
    assert _counts(result) == {"a": (5, 1), "b": (1, 0)}
    (spool,) = [c.spool for c in result.counts if c.spool]
    assert orjson.loads(Path(spool).read_bytes())["error"] == "column 'n': value 'x' does not fit a INT64 column"
    assert _rows(pg_schema, "a", "n, x, ok, t") == [
        (i, Decimal(i) / 4, i % 2 == 0, dt.datetime(2020, 8, 2, 18, 23, 56)) for i in range(5)
    ]
    assert warehouse.loaded_splits("pg", ["log"]) == {(key, "a"), (key, "b")}
    assert pickle.loads(pickle.dumps(result)) == result  # what Spark sends back to the driver


def test_a_row_with_a_new_field_stages_its_split_and_table_with_the_rows_before_it(
    tmp_path: Path, warehouse: PostgresWarehouse, dest: PostgresDestination, pg_schema: str
) -> None:
    stage = RecordingStage(set())
    events = [{"event_type": "a", "n": 1}, {"event_type": "b"}, {"event_type": "a", "n": 2, "new": "x"}]
    events += [{"event_type": "a", "n": 3}, {"event_type": "b"}]
    path = _log(tmp_path, events)
    # Two splits in one task: the second starts DIRECT again.
    first = len(b"".join(orjson.dumps(e) + b"\n" for e in events[:4]))
    splits = [Split(str(path), 0, first), Split(str(path), first, path.stat().st_size)]
    result = _run(_plan(tmp_path, warehouse, dest, stage), splits)
    staged = [dict(zip(columns, row, strict=True)) for columns, rows in stage.written for row in rows]
    assert [(row["n"], row.get("new")) for row in staged] == [(1, None), (2, "x"), (3, None)]
    assert [(s.table, s.chunk.rows) for s in result.staged] == [("a", 3)]
    assert result.staged[0].header.fields["new"].type is DataType.STRING
    assert [(d.split, d.rows) for d in result.direct] == [(splits[0].key, {"b": 1}), (splits[1].key, {"b": 1})]
    assert _counts(result) == {"a": (3, 0), "b": (2, 0)}
    assert _rows(pg_schema, "a", "n") == [] and len(_rows(pg_schema, "b", "event_type")) == 2


def test_a_split_written_by_an_earlier_pass_is_checked_but_not_written_again(
    tmp_path: Path, warehouse: PostgresWarehouse, dest: PostgresDestination, pg_schema: str
) -> None:
    stage = RecordingStage(set())
    path = _log(tmp_path, [{"event_type": "a", "n": 1}, {"event_type": "a", "n": "x"}, {"event_type": "b"}])
    plan = _plan(tmp_path, warehouse, dest, stage)
    first = _run(plan, _whole(path))
    assert [d.rows for d in first.direct] == [{"a": 1, "b": 1}]
    # The rerun of a pass whose pair `a` failed elsewhere: the split is DONE for `a` only.
    plan.split_done = frozenset({(_whole(path)[0].key, "pg", "a")})
    plan.direct = {"pg": warehouse.direct_target("job2")}
    again = _run(plan, _whole(path))
    assert _counts(again) == {"a": (0, 1), "b": (1, 0)}  # its failed event spooled again
    assert [c.spool is not None for c in again.counts if c.table == "a"] == [True]
    # `b` is not DONE, so it is written again: its split marker refuses it, and the pair fails.
    assert again.errors == {("pg", "b"): again.errors[("pg", "b")]}
    assert again.errors[("pg", "b")].startswith("writing: ") and "written already" in again.errors[("pg", "b")]
    assert again.direct == [] and stage.written == []
    assert _rows(pg_schema, "a", "n") == [(1,)] and len(_rows(pg_schema, "b", "event_type")) == 1


def test_tables_of_a_destination_with_primary_keys_are_staged(
    tmp_path: Path, warehouse: PostgresWarehouse, dest: PostgresDestination, pg_schema: str
) -> None:
    stage = RecordingStage(set())
    plan = _plan(tmp_path, warehouse, dest, stage)
    plan.primary_keys = {"pg": ("eventn_ctx_event_id",)}
    result = _run(plan, _whole(_log(tmp_path, [{"event_type": "a", "n": 1}])))
    assert result.direct == [] and [s.table for s in result.staged] == ["a"]
    assert _rows(pg_schema, "a", "n") == []


def test_a_destination_without_direct_writes_is_staged(
    tmp_path: Path, warehouse: PostgresWarehouse, dest: PostgresDestination
) -> None:
    stage = RecordingStage(set())
    plan = _plan(tmp_path, warehouse, dest, stage)
    plan.direct = {}
    result = _run(plan, _whole(_log(tmp_path, [{"event_type": "a", "n": 1}])))
    assert result.direct == [] and [s.table for s in result.staged] == ["a"]


def _killed_run(plan: JobPlan, splits: list[Split]) -> int | None:
    """Runs the task in a forked process; its exit code (-9: killed by SIGKILL)."""
    context = multiprocessing.get_context("fork")
    process = context.Process(target=process_splits, args=(plan, 0, splits))
    process.start()
    process.join(60)
    return process.exitcode


@pytest.mark.parametrize("when", ["before", "after"])
def test_the_executor_fault_kills_the_task_around_its_nth_split_commit(
    tmp_path: Path, warehouse: PostgresWarehouse, dest: PostgresDestination, pg_schema: str, when: str
) -> None:
    path = _log(tmp_path, [{"event_type": "a", "n": i} for i in range(4)])
    half = len(b"".join(orjson.dumps({"event_type": "a", "n": i}) + b"\n" for i in range(2)))
    splits = [Split(str(path), 0, half), Split(str(path), half, path.stat().st_size)]
    plan = _plan(tmp_path, warehouse, dest, RecordingStage(set()))
    plan.executor_fault = f"kill-{when}-commit:2"
    assert _killed_run(plan, splits) == -signal.SIGKILL
    # The first split is committed either way; the second only when killed after its commit.
    expected = {splits[0].key} | ({splits[1].key} if when == "after" else set())
    assert {key for key, _table in warehouse.loaded_splits("pg", ["log"])} == expected
    assert len(_rows(pg_schema, "a", "n")) == 2 * len(expected)


# --- review fixes ---------------------------------------------------------------------------------


def test_text_holding_nul_fails_its_row_alone() -> None:
    """Postgres text cannot store U+0000: such a value would fail the COPY of the whole split."""
    columns = _columns({**COLUMNS, "v": "character varying"})
    assert columns is not None
    buffer = DirectBuffer(columns)
    assert buffer.add({"event_type": "a"}, {}) is None  # `event_type` takes the fast path from now on
    for column, row in [
        ("event_type", {"event_type": "a\x00b"}),
        ("code", {"event_type": "a", "code": "\x00"}),  # varchar(3): cut, but not with a NUL
        ("v", {"event_type": "a", "v": "x\x00"}),
    ]:
        assert buffer.add(row, {}) == f"column {column!r}: text cannot hold the character U+0000 (NUL)"
    assert len(buffer) == 1


def test_kept_rows_tell_each_columns_one_python_type() -> None:
    columns = _columns(COLUMNS)
    assert columns is not None
    buffer = DirectBuffer(columns)
    row = {
        "event_type": 7,
        "n": 3.0,
        "small": "12",
        "x": 2,
        "price": 1,
        "ok": "true",
        "code": 5,
        "t": "2020-08-02T20:23:56+02:00",
    }
    assert buffer.add(row, {}) is None
    taken = buffer.take()
    assert taken.kinds == [str, int, int, float, float, bool, str, str]
    assert [type(value) for value in taken.rows[0]] == taken.kinds


def test_a_done_split_of_a_table_no_longer_written_directly_is_checked_against_its_types(
    tmp_path: Path, warehouse: PostgresWarehouse, dest: PostgresDestination, pg_schema: str
) -> None:
    plan, splits = _done(tmp_path, warehouse, dest, [{"event_type": "a", "n": 1}, {"event_type": "a", "n": "x"}])
    # The table's columns changed since the split was written: `x` is `jsonb` now (not checked here).
    plan.sql_types["pg"]["a"]["x"] = "jsonb"
    result = _run(plan, splits)
    assert _counts(result) == {"a": (0, 1)}  # its failed event spooled again, its row not written again
    (spool,) = [c.spool for c in result.counts if c.spool]
    assert orjson.loads(Path(spool).read_bytes())["error"] == "column 'n': value 'x' does not fit a INT64 column"
    assert result.direct == [] and result.staged == [] and result.errors == {}
    assert _rows(pg_schema, "a", "n") == []


def test_a_done_split_of_a_destination_given_primary_keys_is_not_written_again(
    tmp_path: Path, warehouse: PostgresWarehouse, dest: PostgresDestination, pg_schema: str
) -> None:
    stage = RecordingStage(set())
    plan, splits = _done(tmp_path, warehouse, dest, [{"event_type": "a", "n": 1}, {"event_type": "a", "n": "x"}], stage)
    plan.primary_keys = {"pg": ("eventn_ctx_event_id",)}
    plan.direct, plan.sql_types = {}, {}  # as the driver plans a destination with primary keys
    result = _run(plan, splits)
    assert _counts(result) == {"a": (0, 1)}
    assert result.staged == [] and stage.written == [] and result.errors == {}


def test_a_done_split_whose_table_lost_a_column_still_checks_the_rest_of_each_row(
    tmp_path: Path, warehouse: PostgresWarehouse, dest: PostgresDestination
) -> None:
    plan, splits = _done(tmp_path, warehouse, dest, [{"event_type": "a", "dropped": 1, "n": "x"}, {"event_type": "a"}])
    result = _run(plan, splits)
    assert _counts(result) == {"a": (0, 1)}
    assert result.staged == [] and result.errors == {}


def test_a_pair_giving_up_sends_only_the_failures_of_its_done_splits_to_failed(
    tmp_path: Path, warehouse: PostgresWarehouse, dest: PostgresDestination, pg_schema: str
) -> None:
    stage = RecordingStage(set())
    events = [{"event_type": "a", "n": 1}, {"event_type": "a", "n": "x"}, {"event_type": "a", "n": 2}]
    path = _log(tmp_path, events)
    half = len(orjson.dumps(events[0]) + b"\n") * 2 + 1
    splits = [Split(str(path), 0, half), Split(str(path), half, path.stat().st_size)]
    plan = _plan(tmp_path, warehouse, dest, stage)
    plan.split_done = frozenset({(splits[0].key, "pg", "a")})  # its row n=1 is in the table
    plan.give_up = {("log", "pg"): {"a": "gave up"}}
    result = _run(plan, splits)
    assert _counts(result) == {"a": (0, 2)}
    (spool,) = [c.spool for c in result.counts if c.spool]
    errors = [orjson.loads(line)["error"] for line in Path(spool).read_bytes().splitlines()]
    assert errors == ["column 'n': value 'x' does not fit a INT64 column", "gave up"]
    assert result.direct == [] and stage.written == []
