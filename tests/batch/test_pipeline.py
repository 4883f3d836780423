"""End-to-end batch passes on the shared SparkSession into DuckDB and the machine's Postgres."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from eventspark.batch.job import JobResult
from eventspark.batch.load import Fault
from eventspark.batch.process import run_pass
from eventspark.config import LoadedConfig
from eventspark.coordination import MemoryCoordination
from eventspark.logs.status import read_status, status_path
from eventspark.steps.context import line_event_id
from tests.batch.helpers import (
    FIXTURE_LOG,
    MONTHLY,
    SKIPPING,
    duck_rows,
    duckdb_destination,
    event,
    failed_lines,
    make_config,
    pair_counts,
    pg_rows,
    postgres_destination,
    put_log,
)
from tests.conftest import pg_conninfo

pytestmark = pytest.mark.spark


def run(spark: Any, loaded: LoadedConfig, fault: Fault | None = None, chunk_rows: int = 50_000) -> JobResult:
    return run_pass(loaded, MemoryCoordination("test"), fault=fault, chunk_rows=chunk_rows, session=spark)


def test_fixture_log_loads_into_duckdb_and_postgres(spark: Any, tmp_path: Path, pg_datasource: dict[str, Any]) -> None:
    loaded = make_config(
        tmp_path, {"dd": duckdb_destination(), "pg": postgres_destination(pg_datasource, template=SKIPPING)}
    )
    log = put_log(tmp_path, FIXTURE_LOG)

    result = run(spark, loaded)

    assert result.ok
    tables = {"notification_2020_08": 1, "null_2020_08": 1, "user_2020_07": 1, "user_2020_08": 3}
    for table, count in tables.items():
        assert duck_rows(tmp_path, f'SELECT count(*) FROM "{table}"') == [(count,)]
        assert pg_rows(pg_datasource["schema"], f'SELECT count(*) FROM "{table}"') == [(count,)]
    # DuckDB's template keeps the "skipped" event; the Postgres one renders '' for it.
    assert duck_rows(tmp_path, 'SELECT count(*) FROM "skipped_2020_08"') == [(1,)]
    assert (result.pairs["pg", ""].skipped, result.pairs["dd", ""].skipped) == (1, 0)
    assert (result.pairs["pg", ""].failed, result.pairs["dd", ""].failed) == (1, 1)
    assert result.pairs["dd", "user_2020_08"].rows == 3
    # The event without _timestamp fails the template: one EventError line per destination.
    for dest_id in ("dd", "pg"):
        (failure,) = failed_lines(tmp_path, dest_id)
        assert failure["event"] == {"_geo_data": {}, "event_type": "views", "key1000": "super value"}
        assert "Format" in failure["error"]
    # Mixed values of one column are promoted within the batch: "k" and 50.0 → text.
    values = pg_rows(pg_datasource["schema"], 'SELECT key10_sib1_1 FROM "user_2020_08" ORDER BY 1 NULLS FIRST')
    assert values == [(None,), ("50.0",), ("k",)]
    column_types = dict(
        pg_rows(
            pg_datasource["schema"],
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'user_2020_08'",
        )
    )
    assert column_types["key10_sib1_1"] == "text"
    assert column_types["_geo_data_zip"] == "bigint"
    assert column_types["_timestamp"] == "timestamp without time zone"
    # Every pair uploaded: the log went to the archive with its status file.
    assert not log.exists() and not status_path(log).exists()
    assert result.archived and result.archived[0].name == log.name + ".gz"
    # Each phase of the pass was timed (`bench/scale.py` models a pass from them).
    assert set(result.timings) == {"plan", "stage", "load", "settle", "archive"}
    assert all(seconds > 0 for seconds in result.timings.values())


def test_types_promote_across_files_and_misfits_fail_alone(spark: Any, tmp_path: Path) -> None:
    loaded = make_config(tmp_path, {"dd": duckdb_destination(template="t")})
    put_log(tmp_path, [event("a", v=True, n=1), event("b", n=2)])
    put_log(tmp_path, [event("c", v=2, n=3, x=1), event("d", x=1.5)])
    first = run(spark, loaded, chunk_rows=1)  # one chunk per row: the driver merges the headers

    assert first.ok
    types = dict(
        duck_rows(tmp_path, "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 't'")
    )
    assert (types["v"], types["n"], types["x"]) == ("BIGINT", "BIGINT", "DOUBLE")
    rows = duck_rows(tmp_path, "SELECT eventn_ctx_event_id, v, x FROM t ORDER BY 1")
    assert rows == [("a", 1, None), ("b", None, None), ("c", 2, 1.0), ("d", None, 1.5)]

    # A later batch: the existing bigint column takes "7" but not "seven"; the rest loads.
    put_log(tmp_path, [event("e", n="7"), event("f", n="seven"), event("g", n=8, y="new")])
    second = run(spark, loaded)

    assert second.ok and second.pairs["dd", "t"].rows == 2 and second.pairs["dd", "t"].failed == 1
    assert duck_rows(tmp_path, "SELECT eventn_ctx_event_id, n, y FROM t WHERE n > 5 ORDER BY 1") == [
        ("e", 7, None),
        ("g", 8, "new"),
    ]
    (failure,) = failed_lines(tmp_path, "dd")
    assert failure["event_id"] == "f" and failure["event"]["n"] == "seven"
    assert "'n'" in failure["error"] and "'seven'" in failure["error"]


def test_primary_key_upserts_within_and_across_passes(
    spark: Any, tmp_path: Path, pg_datasource: dict[str, Any]
) -> None:
    keys = {"primary_key_fields": ["eventn_ctx_event_id"]}
    loaded = make_config(
        tmp_path,
        {"dd": duckdb_destination(template="t", **keys), "pg": postgres_destination(pg_datasource, "t", **keys)},
    )
    put_log(tmp_path, [event("a", n=1), event("b", n=1), event("a", n=2)])
    keyless = {"_timestamp": "2020-08-02T18:23:56Z", "n": 5}
    put_log(tmp_path, [event("c", n=1), keyless])
    first = run(spark, loaded)
    # issue 17: the line without an event id gets one derived from it (EventNative 1.41 gave one)
    assert first.ok and first.pairs["dd", "t"].failed == 0

    put_log(tmp_path, [event("b", n=3), keyless])  # the same line again: the same id, one row
    assert run(spark, loaded).ok

    expected = sorted([("a", 2), ("b", 3), ("c", 1), (line_event_id(orjson.dumps(keyless)), 5)])
    assert duck_rows(tmp_path, "SELECT eventn_ctx_event_id, n FROM t ORDER BY 1") == expected
    assert pg_rows(pg_datasource["schema"], "SELECT eventn_ctx_event_id, n FROM t ORDER BY 1") == expected
    assert failed_lines(tmp_path, "pg") == []


def test_failed_pair_is_retried_and_ok_pairs_are_not_reloaded(
    spark: Any, tmp_path: Path, pg_datasource: dict[str, Any]
) -> None:
    # Loads give up after 1 s waiting for a lock: the test holds one on table "bad".
    datasource = {**pg_datasource, "parameters": {"options": "-c lock_timeout=1000"}}
    loaded = make_config(tmp_path, {"pg": postgres_destination(datasource, template="{{.event_type}}")})
    schema = pg_datasource["schema"]
    put_log(tmp_path, [event("0", event_type="bad", n=0)])
    assert run(spark, loaded).ok  # table "bad" exists: n is a bigint column
    log = put_log(
        tmp_path,
        [event("1", event_type="good"), event("2", event_type="bad"), event("3", event_type="bad", n="x")],
    )
    put_log(tmp_path, [event("4", event_type="bad", n=1)])

    with psycopg.connect(pg_conninfo()) as blocker:
        blocker.execute(f'LOCK TABLE "{schema}".bad IN ACCESS EXCLUSIVE MODE')
        first = run(spark, loaded)

    assert not first.ok and "lock timeout" in first.pairs["pg", "bad"].error
    status = read_status(log)
    assert status["pg"]["good"].uploaded and not status["pg"]["bad"].uploaded
    assert "lock timeout" in status["pg"]["bad"].error
    assert failed_lines(tmp_path, "pg") == []  # the misfit of a FAILED pair waits for the retry

    second = run(spark, loaded)

    assert second.ok and ("pg", "good") not in second.pairs
    assert pg_rows(schema, "SELECT eventn_ctx_event_id FROM good") == [("1",)]
    assert pg_rows(schema, "SELECT eventn_ctx_event_id FROM bad ORDER BY 1") == [("0",), ("2",), ("4",)]
    assert [f["event_id"] for f in failed_lines(tmp_path, "pg")] == ["3"]
    assert not log.exists() and len(second.archived) == 2


@pytest.mark.parametrize("point", ["staged", "committed"])
def test_crash_and_rerun_leave_each_event_once(
    spark: Any, tmp_path: Path, pg_datasource: dict[str, Any], point: str
) -> None:
    template = "{{.event_type}}{{if .broken}}{{.broken.deeper.Format}}{{end}}"
    loaded = make_config(
        tmp_path,
        {"dd": duckdb_destination(template=template), "pg": postgres_destination(pg_datasource, template)},
    )
    bad = event("bad", event_type="t", broken={"deeper": 1})  # fails the template of both
    log = put_log(tmp_path, [*(event(str(i), event_type="t", n=i) for i in range(20)), bad])

    def crash(at: str) -> None:
        if at == point:
            raise SystemExit(f"crash at {at}")  # not an Exception: nothing may catch it

    with pytest.raises(SystemExit):
        run(spark, loaded, fault=crash)
    assert log.exists()
    assert not status_path(log).exists()

    result = run(spark, loaded)

    assert result.ok and not log.exists()
    assert duck_rows(tmp_path, "SELECT count(*), count(DISTINCT n) FROM t") == [(20, 20)]
    assert pg_rows(pg_datasource["schema"], "SELECT count(*), count(DISTINCT n) FROM t") == [(20, 20)]
    schema = pg_datasource["schema"]
    leftovers = pg_rows(schema, f"SELECT tablename FROM pg_tables WHERE schemaname = '{schema}'")
    assert sorted(leftovers) == [("_eventspark_loads",), ("t",)]
    # The template failure is written once per destination, whichever pass wrote the status.
    assert [f["event_id"] for f in failed_lines(tmp_path, "dd") + failed_lines(tmp_path, "pg")] == ["bad", "bad"]


@pytest.mark.parametrize("point", ["pair committed", "committed"])
def test_misfits_of_a_pair_committed_before_a_crash_are_not_lost(
    spark: Any, tmp_path: Path, pg_datasource: dict[str, Any], point: str
) -> None:
    loaded = make_config(tmp_path, {"pg": postgres_destination(pg_datasource, template="t")})
    put_log(tmp_path, [event("0", n=0)])
    assert run(spark, loaded).ok  # table t exists: n is a bigint column
    log = put_log(tmp_path, [event("1", n=1), event("2", n="not a number"), event("3", n=3)])

    def crash(at: str) -> None:
        if at == point:
            raise SystemExit(f"crash at {at}")

    with pytest.raises(SystemExit):
        run(spark, loaded, fault=crash)
    # The pair is committed, so a rerun never reads the log for table t again: only the parked
    # spool still knows about the misfit.
    assert not status_path(log).exists()
    assert pg_rows(pg_datasource["schema"], "SELECT count(*) FROM t") == [(3,)]
    pending = tmp_path / "events" / "failed" / "pending"
    if point == "pair committed":
        assert failed_lines(tmp_path, "pg") == [] and any(pending.iterdir())

    assert run(spark, loaded).ok

    assert pg_rows(pg_datasource["schema"], "SELECT eventn_ctx_event_id FROM t ORDER BY 1") == [("0",), ("1",), ("3",)]
    (misfit,) = failed_lines(tmp_path, "pg")
    assert misfit["event_id"] == "2" and "'n'" in misfit["error"]
    assert not log.exists() and list(pending.iterdir()) == []


def test_a_value_a_literal_cast_refuses_fails_its_event_not_the_pair(
    spark: Any, tmp_path: Path, pg_datasource: dict[str, Any]
) -> None:
    fields = [
        {"src": "/price", "action": "cast", "type": "numeric(6,2)"},
        {"src": "/code", "action": "cast", "type": "varchar(3)"},
    ]
    layout = {"mappings": {"keep_unmapped": True, "fields": fields}}
    loaded = make_config(tmp_path, {"pg": postgres_destination(pg_datasource, template="t", **layout)})
    put_log(
        tmp_path,
        [
            event("1", price=12.5, code="abc"),
            event("2", price=123456, code="abc"),  # more than 4 digits before the point
            event("3", price="9.99", code="toolong"),
            event("4", price=0.125, code="x"),
        ],
    )

    result = run(spark, loaded)

    assert result.ok and pair_counts(result) == (2, 2)
    schema = pg_datasource["schema"]
    rows = pg_rows(schema, "SELECT eventn_ctx_event_id, price::text, code FROM t ORDER BY 1")
    assert rows == [("1", "12.50", "abc"), ("4", "0.13", "x")]
    errors = {f["event_id"]: f["error"] for f in failed_lines(tmp_path, "pg")}
    assert "numeric(6,2)" in errors["2"] and "varchar(3)" in errors["3"]


def test_lines_follow_their_token_to_its_destinations(spark: Any, tmp_path: Path) -> None:
    web_only = {**duckdb_destination(template="web_only"), "only_tokens": ["web"]}
    app_only = {**duckdb_destination(template="app_only"), "only_tokens": ["app-s2s"]}
    everyone = duckdb_destination(template="everyone")
    loaded = make_config(tmp_path, {"w": web_only, "a": app_only, "e": everyone})
    put_log(tmp_path, [event("1"), event("2", api_key="app-js"), event("3", api_key="unknown")], token="web")
    put_log(tmp_path, [event("4")], token="gone")  # a token no longer configured

    assert run(spark, loaded).ok

    def ids(table: str) -> list[str]:
        return [r[0] for r in duck_rows(tmp_path, f"SELECT eventn_ctx_event_id FROM {table} ORDER BY 1")]

    assert ids("web_only") == ["1", "3"]
    assert ids("app_only") == ["2"]
    assert ids("everyone") == ["1", "2", "3", "4"]


def test_empty_logs_are_deleted_and_bad_lines_fail(spark: Any, tmp_path: Path) -> None:
    loaded = make_config(tmp_path, {"dd": duckdb_destination(template="t")})
    empty = put_log(tmp_path, [])
    put_log(tmp_path, ['{"broken', "[1, 2]", event("1")])

    result = run(spark, loaded)

    assert result.ok and result.deleted_empty == [empty] and not empty.exists()
    assert duck_rows(tmp_path, "SELECT count(*) FROM t") == [(1,)]
    errors = [f["error"] for f in failed_lines(tmp_path, "dd")]
    assert len(errors) == 2 and "not JSON" in errors[0] and "not a JSON object" in errors[1]
    assert failed_lines(tmp_path, "dd")[0]["event"] == '{"broken'


def test_unreachable_destination_keeps_the_logs_of_its_tokens(
    spark: Any, tmp_path: Path, pg_datasource: dict[str, Any]
) -> None:
    down = {**postgres_destination({**pg_datasource, "port": 1}, template=MONTHLY), "only_tokens": ["web"]}
    loaded = make_config(tmp_path, {"dd": duckdb_destination(template="t"), "pg": down})
    web_log = put_log(tmp_path, [event("1")], token="web")
    app_log = put_log(tmp_path, [event("2")], token="app")

    result = run(spark, loaded)

    assert not result.ok and "connecting" in result.pairs["pg", ""].error
    assert duck_rows(tmp_path, "SELECT count(*) FROM t") == [(2,)]
    assert web_log.exists() and not read_status(web_log)["pg"][""].uploaded
    assert not app_log.exists()  # pg does not take the app token: nothing is pending for it

    # The destination is back: the retry loads the web log into it, and DuckDB is not loaded twice.
    loaded.config.destinations["pg"].datasource.port = pg_datasource["port"]
    assert run(spark, loaded).ok
    assert not web_log.exists()
    assert duck_rows(tmp_path, "SELECT count(*) FROM t") == [(2,)]
    assert pg_rows(pg_datasource["schema"], "SELECT eventn_ctx_event_id FROM null_2020_08") == [("1",)]
