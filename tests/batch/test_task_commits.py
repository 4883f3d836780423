"""Task commits (`batch.commits`, `Capabilities.task_commits`) on the machine's Postgres and
MariaDB: the driver patches a table once, then the rows each Spark task staged are committed on
their own, in parallel, each with the markers of its splits; a unit that fails is rolled back
alone, and the rerun loads its splits, every event once."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eventspark.batch import splits
from eventspark.batch.commits import CommitPool, TaskUnit, UnitCommit, bucket_rows
from eventspark.batch.process import run_pass
from eventspark.coordination import MemoryCoordination
from eventspark.destinations import build_destination
from eventspark.destinations.base import LOADS_TABLE, TerminalError
from eventspark.logs.store import LocalStore
from eventspark.steps.diff import TablePatch
from eventspark.steps.template import STAGE_PREFIX
from eventspark.steps.typing import DataType
from tests.batch.helpers import SPARK, MarkersAt, event, make_config, postgres_destination, put_log
from tests.conftest import pg_conninfo
from tests.destinations.conftest import MYSQL_HOST, MYSQL_PORT, MYSQL_USER, mysql_connect, mysql_db
from tests.destinations.test_mysql import rows_of

__all__ = ["mysql_db"]  # the fixture, used by name

SMALL_SPLIT_BYTES = 600
"""A few events a split: each log of the tests is cut into several, read by several tasks."""


@dataclass
class Warehouse:
    """One destination of the tests and plain SQL on its database."""

    kind: str
    name: str
    """The Postgres schema or the MySQL database."""

    def destination(self, **layout: Any) -> dict[str, Any]:
        if self.kind == "postgres":
            source = {"host": "127.0.0.1", "port": 5432, "db": "test", "schema": self.name, "username": "postgres"}
            return postgres_destination(source, template="t", **layout)
        source = {"host": MYSQL_HOST, "port": MYSQL_PORT, "db": self.name, "username": MYSQL_USER}
        return {"type": self.kind, "datasource": source, "data_layout": {"table_name_template": "t", **layout}}

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        if self.kind == "postgres":
            with psycopg.connect(pg_conninfo()) as conn:
                conn.execute(f'SET search_path = "{self.name}"')
                return [tuple(r) for r in conn.execute(sql).fetchall()]
        return rows_of(self.name, sql)

    def execute(self, sql: str) -> None:
        if self.kind == "postgres":
            with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
                conn.execute(f'SET search_path = "{self.name}"')
                conn.execute(sql)
            return
        conn = mysql_connect(self.name)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
            conn.commit()
        finally:
            conn.close()

    def ids(self, column: str = "eventn_ctx_event_id") -> Counter[str]:
        return Counter(r[0] for r in self.rows(f"SELECT {column} FROM t"))

    def markers(self) -> set[str]:
        return {r[0] for r in self.rows(f"SELECT file FROM {LOADS_TABLE} WHERE table_name = 't'")}

    def stage_tables(self) -> list[str]:
        if self.kind == "postgres":
            sql = f"SELECT tablename FROM pg_tables WHERE schemaname = '{self.name}'"
        else:
            sql = f"SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{self.name}'"
        return sorted(r[0] for r in self.rows(sql) if r[0].startswith(STAGE_PREFIX))

    def quote(self, name: str) -> str:
        return f'"{name}"' if self.kind == "postgres" else f"`{name}`"


@pytest.fixture(params=["postgres", "mysql"])
def warehouse(request: Any) -> Warehouse:
    if request.param == "postgres":
        return Warehouse("postgres", request.getfixturevalue("pg_schema"))
    return Warehouse("mysql", request.getfixturevalue("mysql_db"))


def split_keys(logs: list[Path]) -> set[str]:
    """The keys of the splits a pass cuts these logs into (no marker yet)."""
    return {split.key for split in splits.plan_splits([LocalStore.log_file(p) for p in logs], {})}


def put_logs(root: Path, prefix: str, **fields: Any) -> list[Path]:
    return [put_log(root, [event(f"{prefix}{part}-{i}", n=i, **fields) for i in range(12)]) for part in range(2)]


def two_logs_of_small_splits(
    tmp_path: Path, warehouse: Warehouse, monkeypatch: Any
) -> tuple[Any, list[Path], set[str]]:
    """The config, two logs of 12 events cut into splits of a few events, and their split keys."""
    monkeypatch.setattr(splits, "SPLIT_BYTES", SMALL_SPLIT_BYTES)
    loaded = make_config(tmp_path, {"wh": warehouse.destination()})
    logs = put_logs(tmp_path, "a")
    return loaded, logs, split_keys(logs)


@pytest.mark.spark
def test_a_new_table_is_patched_then_each_tasks_rows_commit_with_their_splits_markers(
    spark: Any, tmp_path: Path, warehouse: Warehouse, monkeypatch: Any
) -> None:
    loaded, _logs, keys = two_logs_of_small_splits(tmp_path, warehouse, monkeypatch)
    assert len(keys) >= 4  # several splits, in several tasks of local[2]

    committed = MarkersAt(warehouse.markers)
    result = run_pass(loaded, MemoryCoordination("test"), session=spark, fault=committed)

    assert result.ok and result.pairs["wh", "t"].rows == 24
    assert warehouse.ids() == Counter(f"a{part}-{i}" for part in range(2) for i in range(12))
    assert committed.seen == keys  # a marker per split, none per log: no serial commit of the pair
    assert warehouse.markers() == set()  # the logs archived: their markers removed
    assert warehouse.stage_tables() == []  # dropped with their commits

    # A pass that adds a column: patched once, committed per task again.
    wider = split_keys(put_logs(tmp_path, "b", extra="x"))
    committed = MarkersAt(warehouse.markers)
    assert run_pass(loaded, MemoryCoordination("test"), session=spark, fault=committed).ok
    assert committed.seen == wider and warehouse.markers() == set()
    assert warehouse.rows("SELECT count(*), count(extra), count(DISTINCT eventn_ctx_event_id) FROM t") == [(48, 24, 48)]


@pytest.mark.spark
def test_a_unit_that_fails_is_rolled_back_alone_and_the_rerun_loads_its_splits_once(
    spark: Any, tmp_path: Path, warehouse: Warehouse, monkeypatch: Any
) -> None:
    loaded, logs, keys = two_logs_of_small_splits(tmp_path, warehouse, monkeypatch)
    dropped: list[str] = []

    def lose_a_stage(at: str) -> None:
        if at == "staged" and not dropped:  # the table is patched: one task's chunk goes missing
            dropped.append(warehouse.stage_tables()[0])
            warehouse.execute(f"DROP TABLE {warehouse.quote(dropped[0])}")

    result = run_pass(loaded, MemoryCoordination("test"), session=spark, fault=lose_a_stage)

    assert not result.ok and result.pairs["wh", "t"].error
    committed = warehouse.markers()
    assert committed and committed < keys  # the other units committed, with their markers
    first = warehouse.ids()
    assert 0 < sum(first.values()) < 24 and max(first.values()) == 1
    assert all(log.exists() for log in logs)

    rerun = MarkersAt(warehouse.markers)
    assert run_pass(loaded, MemoryCoordination("test"), session=spark, fault=rerun).ok

    assert warehouse.ids() == Counter(f"a{part}-{i}" for part in range(2) for i in range(12))
    assert rerun.seen == keys
    assert not any(log.exists() for log in logs) and warehouse.markers() == set()


def test_units_commit_in_parallel_and_a_failure_leaves_the_others(tmp_path: Path, warehouse: Warehouse) -> None:
    """`CommitPool` alone: four units on two connections; one whose chunk is gone fails,
    rolled back (no marker, no row), and the three others commit with their markers."""
    loaded = make_config(tmp_path, {"wh": warehouse.destination()})
    dest = loaded.config.destinations["wh"]
    adapter = build_destination("wh", dest, tmp_path)
    try:
        adapter.patch(TablePatch("t", create=True, add_columns={"id": adapter.dialect.types[DataType.STRING]}))
        table = adapter.read_table("t")
        writer = adapter.stage_target("job1").open()
        try:
            chunks = [writer.write({"id": DataType.STRING}, [[f"u{unit}-{i}"] for i in range(3)]) for unit in range(4)]
        finally:
            writer.close()
    finally:
        adapter.close()
    assert table is not None
    units = [UnitCommit("wh", table, TaskUnit([chunk], [f"log{n}@0-1"])) for n, chunk in enumerate(chunks)]
    warehouse.execute(f"DROP TABLE {warehouse.quote(chunks[2].ref)}")
    threads: set[str] = set()

    def seen(at: str) -> None:
        import threading

        threads.add(threading.current_thread().name)

    with CommitPool(loaded.config.destinations, tmp_path, workers=2, fault=seen) as pool:
        pool.commit(units)

    assert [bool(u.error) for u in units] == [False, False, True, False] and all(u.done != bool(u.error) for u in units)
    assert warehouse.markers() == {"log0@0-1", "log1@0-1", "log3@0-1"}
    assert warehouse.ids("id") == Counter(f"u{unit}-{i}" for unit in (0, 1, 3) for i in range(3))
    assert len(threads) == 2  # two connections, each in its own thread
    with pytest.raises(TerminalError):  # a marker already there: a second commit of a unit is refused
        reloaded = build_destination("wh", dest, tmp_path)
        try:
            from eventspark.destinations.base import Load

            reloaded.commit(Load("wh", table, [], ["log0@0-1"]))
        finally:
            reloaded.close()


def test_a_key_falls_in_one_bucket_whatever_the_type_it_was_staged_in() -> None:
    rows = [[1, "a"], ["1", "b"], [1.0, "c"], [2, "d"], [2.5, "e"], ["x", "f"]]
    cut = bucket_rows(rows, [0], 7)
    where = {row[1]: bucket for bucket, found in cut.items() for row in found}
    assert where["a"] == where["b"] == where["c"]
    assert sorted(row[1] for found in cut.values() for row in found) == list("abcdef")
    assert bucket_rows(rows, [0], 7) == cut  # the same on every executor: no per-process hash seed
    assert bucket_rows(rows, [0], 1) == {0: rows}


def test_one_instant_or_one_boolean_falls_in_one_bucket_whatever_its_spelling_and_stage_type() -> None:
    instants = ["2024-01-01T00:00:00Z", "2024-01-01T00:00:00+00:00", "2024-01-01T01:00:00.000+01:00"]
    for stage in (DataType.TIMESTAMP, DataType.STRING):  # one chunk may stage it as either
        for buckets in (5, 8):
            found = {next(iter(bucket_rows([[i]], [0], buckets, [stage]))) for i in instants}
            assert len(found) == 1, (stage, buckets)
            timestamp_bucket = next(iter(bucket_rows([[instants[0]]], [0], buckets, [DataType.TIMESTAMP])))
            assert found == {timestamp_bucket}
    for buckets in (3, 5, 8):
        assert len({next(iter(bucket_rows([[value]], [0], buckets))) for value in (True, "true")}) == 1


def keyed_events(prefix: str, n: int, keys: range) -> list[dict[str, Any]]:
    return [event(f"{prefix}-{k}", key=f"k{k}", n=n) for k in keys]


@pytest.mark.spark
def test_keyed_rows_commit_per_key_bucket_and_the_last_row_of_each_key_wins(
    spark: Any, tmp_path: Path, pg_schema: str, monkeypatch: Any
) -> None:
    """Postgres (`keyed_task_commits`): the rows of a table with a primary key are upserted per
    key bucket, one unit per commit connection; a pass cut short after some buckets committed is
    loaded again whole by the rerun (upserts are idempotent): each key once, its last row."""
    monkeypatch.setattr(splits, "SPLIT_BYTES", SMALL_SPLIT_BYTES)
    warehouse = Warehouse("postgres", pg_schema)
    dest = warehouse.destination(primary_key_fields=["key"])
    loaded = make_config(tmp_path, {"wh": dest}, spark={**SPARK, "commit_connections": 3})
    logs = [put_log(tmp_path, keyed_events("old", 1, range(24)))]
    logs.append(put_log(tmp_path, keyed_events("new", 2, range(12)) + keyed_events("newer", 3, range(6))))
    commits: list[str] = []

    def crash_after_a_bucket(at: str) -> None:
        if at == "task committed":
            commits.append(at)
            if len(commits) == 1:
                raise SystemExit("killed after a bucket's commit")

    with pytest.raises(SystemExit):
        run_pass(loaded, MemoryCoordination("test"), session=spark, fault=crash_after_a_bucket)
    assert len(commits) == 3  # three buckets, three units: the pool finished those it had started
    assert all(log.exists() for log in logs) and warehouse.markers() == set()

    rerun = MarkersAt(warehouse.markers)
    result = run_pass(loaded, MemoryCoordination("test"), session=spark, fault=rerun)

    assert result.ok and rerun.steps.count("task committed") == 3  # the rerun's three buckets, again
    latest = {f"k{k}": 3 if k < 6 else 2 if k < 12 else 1 for k in range(24)}
    assert dict(warehouse.rows("SELECT key, n FROM t")) == latest
    assert warehouse.rows("SELECT count(*) FROM t") == [(24,)]
    # Once every bucket committed, the logs' markers (a crash before them: the rerun upserts again).
    assert rerun.seen == {log.name for log in logs}
    assert warehouse.markers() == set()  # then the archive: removed
