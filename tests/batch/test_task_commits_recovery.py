"""Task commits (`batch.commits`) across crashes, failed units and give-ups, on the machine's
Postgres and MariaDB: splits committed by a unit are never written again, nor sent to `failed/`
when their rows are in the table; what failed a check when it was committed is still in `failed/`
after a give-up; a table keyed by the warehouse alone is committed whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from eventspark.batch import splits
from eventspark.batch.process import run_pass
from eventspark.coordination import MemoryCoordination
from eventspark.destinations import build_destination
from eventspark.destinations.base import DestinationError
from eventspark.logs.status import read_status
from eventspark.logs.store import LocalStore
from eventspark.steps.diff import TablePatch
from eventspark.steps.typing import DataType
from tests.batch.helpers import SPARK, MarkersAt, event, failed_lines, make_config, put_log
from tests.batch.test_retry import T0, run
from tests.batch.test_task_commits import Warehouse, warehouse
from tests.destinations.conftest import mysql_db

__all__ = ["mysql_db", "warehouse"]  # fixtures, used by name

pytestmark = pytest.mark.spark

GIVE_UP_SOON = {"base_sec": 10, "max_sec": 10, "max_age_hours": 0.01}
"""Retried every 10 s of the test's clock, given up after 36 s."""


def drop_stages_with(warehouse: Warehouse, column: str) -> Any:
    """A fault hook: once the table is patched, the staging tables holding `column` go missing,
    so that the units committing them fail (rolled back) and the others commit."""

    def fault(at: str) -> None:
        if at == "staged":
            for name in warehouse.stage_tables():
                if column in stage_columns(warehouse, name):
                    warehouse.execute(f"DROP TABLE {warehouse.quote(name)}")

    return fault


def stage_columns(warehouse: Warehouse, table: str) -> set[str]:
    if warehouse.kind == "postgres":
        sql = f"SELECT column_name FROM information_schema.columns WHERE table_schema = '{warehouse.name}'"
    else:
        sql = f"SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = '{warehouse.name}'"
    return {r[0] for r in warehouse.rows(f"{sql} AND table_name = '{table}'")}


def event_ids(split: splits.Split) -> list[str]:
    return [orjson.loads(line)["eventn_ctx"]["event_id"] for line in splits.read_split(split)]


def test_a_committed_split_read_after_a_staged_one_in_one_task_is_not_staged_again(
    spark: Any, tmp_path: Path, warehouse: Warehouse, monkeypatch: Any
) -> None:
    """A task's STAGED target is decided again at each split once some split has a marker: a split
    an earlier unit committed, read by the task after one it stages, is DONE, not staged again
    under the marker that exists (which would fail its unit, pass after pass)."""
    loaded = make_config(tmp_path, {"wh": warehouse.destination()})
    log = put_log(tmp_path, [event("s1", first=1, pad="x" * 120), event("s2", n=2, pad="y" * 120)])
    monkeypatch.setattr(splits, "SPLIT_BYTES", log.stat().st_size // 2 + 1)
    s1, s2 = splits.plan_splits([LocalStore.log_file(log)])
    assert (event_ids(s1), event_ids(s2)) == (["s1"], ["s2"])

    assert not run_pass(loaded, MemoryCoordination("t"), session=spark, fault=drop_stages_with(warehouse, "first")).ok
    assert warehouse.markers() == {s2.key}  # s2's unit committed, s1's failed
    # More logs: the failed log's two splits now go to one task (two cores, a task per two splits).
    for part in range(3):
        put_log(tmp_path, [event(f"m{part}-{i}", n=i) for i in range(20)])

    result = run_pass(loaded, MemoryCoordination("t"), session=spark)

    assert result.ok, result.pairs["wh", "t"].error
    ids = warehouse.ids()
    assert ids["s1"] == ids["s2"] == 1 and sum(ids.values()) == 62


def test_a_value_mysql_stores_with_u0000_is_not_failed_again_on_a_rerun(
    spark: Any, tmp_path: Path, mysql_db: str
) -> None:
    """A DONE split is checked as its rows were when they were staged: MySQL's text holds U+0000
    (Postgres's does not, and its rows were refused then)."""
    warehouse = Warehouse("mysql", mysql_db)
    loaded = make_config(tmp_path, {"wh": warehouse.destination()})
    put_log(tmp_path, [event("ok", s="plain"), event("nul", s="a\x00b")])

    def crash(at: str) -> None:
        if at == "committed":
            raise SystemExit("killed after the commits, before the status files")

    with pytest.raises(SystemExit):
        run_pass(loaded, MemoryCoordination("t"), session=spark, fault=crash)
    assert sorted(warehouse.ids()) == ["nul", "ok"] and warehouse.markers()

    assert run_pass(loaded, MemoryCoordination("t"), session=spark).ok

    assert sorted(warehouse.ids()) == ["nul", "ok"]
    assert failed_lines(tmp_path, "wh") == []


def test_a_give_up_unreached_fails_again_what_a_committed_split_refused(
    spark: Any, tmp_path: Path, mysql_db: str, monkeypatch: Any
) -> None:
    """The status file records a failing pair's committed splits with the types their rows were
    checked against (`PairStatus.written`, `.columns`): a give-up that cannot reach MySQL checks
    them again, so the event that did not fit goes to failed/ (not lost), and the rows do not."""
    warehouse = Warehouse("mysql", mysql_db)
    dest = {**warehouse.destination(), "retry": GIVE_UP_SOON}
    loaded = make_config(tmp_path, {"wh": dest})
    put_log(tmp_path, [event("a0", n=0)])
    assert run(spark, loaded, T0 - 100).ok  # table t, n a bigint
    monkeypatch.setattr(splits, "SPLIT_BYTES", 200)
    log = put_log(tmp_path, [event("b0", n=1), event("bx", n="x"), event("b1", n=2), event("c0", n=3, extra="new")])
    first, second = splits.plan_splits([LocalStore.log_file(log)])
    assert (event_ids(first), event_ids(second)) == (["b0", "bx", "b1"], ["c0"])

    assert not run(spark, loaded, T0, drop_stages_with(warehouse, "extra")).ok
    failing = read_status(log)["wh"]["t"]
    assert failing.written == (first.key,) and failing.columns["n"].lower().startswith("bigint")
    assert sorted(warehouse.ids()) == ["a0", "b0", "b1"]

    unreachable = make_config(tmp_path, {"wh": {**dest, "datasource": {**dest["datasource"], "port": 1}}})
    assert not run(spark, unreachable, T0 + 20).ok
    run(spark, unreachable, T0 + 40)  # past the maximum age: gives up, unreached

    assert not log.exists()
    assert sorted(f["event_id"] for f in failed_lines(tmp_path, "wh")) == ["bx", "c0"]


def test_keyed_buckets_committed_before_a_crash_are_not_failed_by_a_give_up(
    spark: Any, tmp_path: Path, pg_schema: str
) -> None:
    """Once every key bucket committed, the logs' markers: a pass that then dies before its
    status files, followed by one that gives the pair up, finds the pair committed."""
    warehouse = Warehouse("postgres", pg_schema)
    dest = {**warehouse.destination(primary_key_fields=["key"]), "retry": GIVE_UP_SOON}
    loaded = make_config(tmp_path, {"wh": dest}, spark={**SPARK, "commit_connections": 2})
    put_log(tmp_path, [event(f"e{k}", key=f"k{k}", n=k) for k in range(6)])

    def down(at: str) -> None:
        if at == "staged":
            raise DestinationError("warehouse gone")

    def crash(at: str) -> None:
        if at == "committed":
            raise SystemExit("killed before the status files")

    assert not run(spark, loaded, T0, down).ok  # failing since T0
    with pytest.raises(SystemExit):
        run(spark, loaded, T0 + 20, crash)
    assert warehouse.rows("SELECT count(*) FROM t") == [(6,)]

    assert run(spark, loaded, T0 + 40).ok  # past the maximum age, yet committed: not given up

    assert failed_lines(tmp_path, "wh") == [] and warehouse.rows("SELECT count(*) FROM t") == [(6,)]


def test_a_table_the_warehouse_keys_and_the_config_does_not_is_committed_whole(
    spark: Any, tmp_path: Path, warehouse: Warehouse, monkeypatch: Any
) -> None:
    """A primary key made by hand (or by another config) is kept by the patch: units upserting its
    keys at once would race (InnoDB deadlocks): the pair is one commit, with its logs' markers."""
    monkeypatch.setattr(splits, "SPLIT_BYTES", 600)
    loaded = make_config(tmp_path, {"wh": warehouse.destination()})
    adapter = build_destination("wh", loaded.config.destinations["wh"], tmp_path)
    try:
        types = adapter.dialect.types
        columns = {"eventn_ctx_event_id": "VARCHAR(64)", "n": types[DataType.INT64]}
        adapter.patch(TablePatch("t", create=True, add_columns=columns, primary_keys=("eventn_ctx_event_id",)))
    finally:
        adapter.close()
    logs = [put_log(tmp_path, [event(f"k{i % 30}", n=part) for i in range(30)]) for part in range(2)]

    committed = MarkersAt(warehouse.markers)
    assert run_pass(loaded, MemoryCoordination("t"), session=spark, fault=committed).ok

    assert warehouse.rows("SELECT count(*), count(DISTINCT eventn_ctx_event_id) FROM t") == [(30, 30)]
    assert committed.seen == {log.name for log in logs}  # one commit: the logs' markers
