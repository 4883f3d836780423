"""The batch retry policy: back-off between attempts, attempts counted across passes, give-up.

Passes run on the shared SparkSession with a clock of the test's own (`BatchJob(clock=...)`), so
minutes of back-off and hours of maximum age pass without sleeping.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventspark.batch import job as job_module
from eventspark.batch import splits as splits_module
from eventspark.batch.job import BatchJob, JobResult
from eventspark.batch.splits import plan_splits, read_split
from eventspark.collector.metrics import render
from eventspark.config import LoadedConfig
from eventspark.coordination import MemoryCoordination
from eventspark.destinations.base import DestinationError
from eventspark.logs.rotated import rotated_logs
from eventspark.logs.status import (
    PairStatus,
    all_uploaded,
    merge_status,
    parse_status,
    read_status,
    status_path,
    write_status,
)
from eventspark.ops.metrics import Sample
from eventspark.ops.status import StatusReader
from tests.batch.helpers import (
    duck_rows,
    duckdb_destination,
    event,
    failed_lines,
    make_config,
    pg_rows,
    postgres_destination,
    put_log,
)

pytestmark = pytest.mark.spark

T0 = 1_700_000_000.0
TEMPLATE = "t{{if .broken}}{{.broken.deeper.Format}}{{end}}"
"""Table t; an event with `broken` fails the template (a failure written once per log and destination)."""


class Warehouse:
    """A fault hook: while `down`, every load fails when it commits (a DestinationError, as a
    warehouse gone mid-load gives); counts the loads attempted."""

    def __init__(self) -> None:
        self.down = False
        self.loads = 0

    def __call__(self, at: str) -> None:
        if at == "staged":
            self.loads += 1
            if self.down:
                raise DestinationError("warehouse gone")


def run(spark: Any, loaded: LoadedConfig, now: float, fault: Any = None) -> JobResult:
    incoming = Path(loaded.config.log.path) / "incoming"
    job = BatchJob(loaded, MemoryCoordination("test"), fault, clock=lambda: now)
    return job.run(spark, rotated_logs(incoming))


def ids(root: Path) -> list[str]:
    return [row[0] for row in duck_rows(root, "SELECT eventn_ctx_event_id FROM t ORDER BY 1")]


def test_back_off_is_respected_and_a_recovered_pair_loads_each_event_once(spark: Any, tmp_path: Path) -> None:
    retry = {"base_sec": 10, "max_sec": 40, "max_age_hours": 1}
    loaded = make_config(tmp_path, {"dd": duckdb_destination(template=TEMPLATE)}, retry=retry)
    warehouse = Warehouse()
    put_log(tmp_path, [event("0", n=0)])
    assert run(spark, loaded, T0, warehouse).ok  # table t: n is a bigint column
    log = put_log(tmp_path, [event("1", n=1), event("2", n="x"), event("3", broken={"deeper": 1}), event("4", n=4)])
    warehouse.down = True

    first = run(spark, loaded, T0 + 100, warehouse)

    pair = read_status(log)["dd"]["t"]
    assert not first.ok and "warehouse gone" in first.pairs["dd", "t"].error
    assert (pair.attempts, pair.first_failed, pair.last_attempt, pair.next_attempt) == (1, T0 + 100, T0 + 100, T0 + 110)
    assert [f["event_id"] for f in failed_lines(tmp_path, "dd")] == ["3"]  # the template failure, at once
    (status,) = StatusReader(loaded.config).read(now=T0 + 130)  # `eventspark status`, /prometheus gauges
    assert (status.retry_pending_pairs, status.retry_attempts, status.retry_oldest_age) == (1, 1, 30.0)
    assert status.pending_logs == 1
    gauges = render(Sample(), [status]).decode()
    assert 'eventspark_retry_pending_pairs{destination="dd"} 1.0' in gauges

    loads = warehouse.loads
    early = run(spark, loaded, T0 + 108, warehouse)  # before next_attempt: the log is not even read

    assert early.waiting == [log] and early.kept == [log] and not early.pairs
    assert warehouse.loads == loads and read_status(log)["dd"]["t"] == pair

    second = run(spark, loaded, T0 + 109, warehouse)  # a tenth of the back-off early: due (jitter)
    third = run(spark, loaded, T0 + 120, warehouse)  # 10 s later: the back-off doubled to 20 s
    fourth = run(spark, loaded, T0 + 130, warehouse)

    assert "warehouse gone" in second.pairs["dd", "t"].error and third.waiting == [log]
    assert "warehouse gone" in fourth.pairs["dd", "t"].error
    pair = read_status(log)["dd"]["t"]
    assert (pair.attempts, pair.first_failed, pair.next_attempt) == (3, T0 + 100, T0 + 170)  # 40 s: the cap

    warehouse.down = False
    recovered = run(spark, loaded, T0 + 170, warehouse)

    assert recovered.ok and len(recovered.archived) == 1 and not log.exists()
    assert ids(tmp_path) == ["0", "1", "4"]
    # The misfit (its pair failed three times) and the template failure: once each.
    assert sorted(f["event_id"] for f in failed_lines(tmp_path, "dd")) == ["2", "3"]
    assert list((tmp_path / "events" / "failed" / "pending").iterdir()) == []


def test_a_pair_past_the_maximum_age_gives_up_into_failed_once(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    retry = {"base_sec": 10, "max_sec": 10, "max_age_hours": 0.01}  # 36 s
    loaded = make_config(tmp_path, {"dd": duckdb_destination(template=TEMPLATE)}, retry=retry)
    warehouse = Warehouse()
    warehouse.down = True
    log = put_log(tmp_path, [event("1", n=1), event("2", n=2), event("3", broken={"deeper": 1})])
    assert not run(spark, loaded, T0, warehouse).ok
    assert not run(spark, loaded, T0 + 20, warehouse).ok
    assert read_status(log)["dd"]["t"].attempts == 2
    warehouse.down = False
    healthy = put_log(tmp_path, [event("4", n=4)])  # the same table, from a log that never failed

    result = run(spark, loaded, T0 + 40, warehouse)

    assert result.ok and len(result.archived) == 2 and result.gave_up == {"dd": 2}
    logged = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("batch dd: 2 event(s) failed for longer" in m for m in logged), logged
    assert not log.exists() and not healthy.exists()
    assert ids(tmp_path) == ["4"]
    failed = failed_lines(tmp_path, "dd")
    assert Counter(f["event_id"] for f in failed) == {"1": 1, "2": 1, "3": 1}
    reasons = {f["event_id"]: f["error"] for f in failed}
    assert reasons["1"].startswith("gave up after 2 attempts in 40 s: ") and "warehouse gone" in reasons["1"]
    assert failed[0]["event"] == event("3", broken={"deeper": 1})  # the original line, as received
    assert {f["event"]["n"] for f in failed if f["event_id"] != "3"} == {1, 2}

    again = run(spark, loaded, T0 + 100, warehouse)  # nothing left: nothing read, nothing written twice
    assert not again.pairs and failed_lines(tmp_path, "dd") == failed


def test_an_unreachable_destination_waits_then_gives_up_without_a_connection(
    spark: Any, tmp_path: Path, pg_datasource: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    retry = {"base_sec": 10, "max_sec": 10, "max_age_hours": 0.01}
    down = {**postgres_destination({**pg_datasource, "port": 1}, template="t"), "only_tokens": ["web"], "retry": retry}
    loaded = make_config(tmp_path, {"dd": duckdb_destination(template="t"), "pg": down})
    built: Counter[str] = Counter()
    build = job_module.build_destination

    def counting(dest_id: str, *args: Any) -> Any:
        built[dest_id] += 1
        return build(dest_id, *args)

    monkeypatch.setattr(job_module, "build_destination", counting)
    log = put_log(tmp_path, [event("1"), event("2")], token="web")

    first = run(spark, loaded, T0)

    assert "connecting" in first.pairs["pg", ""].error and built == {"dd": 1, "pg": 1}
    whole = read_status(log)["pg"][""]
    assert (whole.attempts, whole.next_attempt, whole.gave_up) == (1, T0 + 10, False)
    assert duck_rows(tmp_path, "SELECT count(*) FROM t") == [(2,)]

    early = run(spark, loaded, T0 + 5)  # not due: not connected, the log not read
    assert early.waiting == [log] and built == {"dd": 1, "pg": 1}

    assert not run(spark, loaded, T0 + 10).ok
    assert built == {"dd": 1, "pg": 2} and read_status(log)["pg"][""].attempts == 2  # dd: done, not reconnected

    last = run(spark, loaded, T0 + 40)  # past the maximum age: a last attempt, then failed/

    assert built["pg"] == 3 and len(last.archived) == 1 and not log.exists() and last.gave_up == {"pg": 2}
    failed = failed_lines(tmp_path, "pg")
    assert sorted(f["event_id"] for f in failed) == ["1", "2"]
    assert all(f["error"].startswith("gave up after 2 attempts in 40 s: ") for f in failed)
    assert duck_rows(tmp_path, "SELECT count(*) FROM t") == [(2,)] and failed_lines(tmp_path, "dd") == []
    assert pg_rows(pg_datasource["schema"], "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()") == [
        (0,)
    ]


def test_splits_written_directly_stay_out_of_failed_when_their_destination_gives_up_unreached(
    spark: Any, tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    retry = {"base_sec": 10, "max_sec": 10, "max_age_hours": 0.01}  # 36 s
    pg = {**postgres_destination(pg_datasource, template="t"), "retry": retry}
    loaded = make_config(tmp_path, {"pg": pg})
    put_log(tmp_path, [event("a0", n=0)])
    assert run(spark, loaded, T0 - 100).ok  # creates the table: the next log's splits are written directly
    monkeypatch.setattr(splits_module, "SPLIT_BYTES", 200)
    lines = [event("b0", n=1), event("bx", n="x"), event("b1", n=2), event("c0", n=3, extra="new column")]
    log = put_log(tmp_path, lines)
    first, second = plan_splits([log])
    assert [[orjson.loads(line)["eventn_ctx"]["event_id"] for line in read_split(s)] for s in (first, second)] == [
        ["b0", "bx", "b1"],
        ["c0"],
    ]
    warehouse = Warehouse()
    warehouse.down = True  # the new column's split is staged, and its commit fails

    assert not run(spark, loaded, T0, warehouse).ok

    failing = read_status(log)["pg"]["t"]
    assert failing.written == (first.key,) and failing.columns["n"] == "bigint"  # with its marker, in the table
    assert pg_rows(pg_schema, "SELECT eventn_ctx_event_id FROM t ORDER BY 1") == [("a0",), ("b0",), ("b1",)]
    down = make_config(tmp_path, {"pg": {**pg, "datasource": {**pg_datasource, "port": 1}}})
    assert not run(spark, down, T0 + 20).ok  # unreachable: waits, its splits still known
    assert read_status(log)["pg"]["t"].written == (first.key,)

    last = run(spark, down, T0 + 40)  # unreachable past the maximum age: gives up, markers unread

    assert last.gave_up == {"pg": 2} and not log.exists()
    # b0, b1 are in the table; bx, which did not fit when its split was written, is checked again
    # against the column types the status file recorded.
    reasons = {f["event_id"]: f["error"] for f in failed_lines(tmp_path, "pg")}
    assert reasons.keys() == {"bx", "c0"} and "column 'n'" in reasons["bx"]
    assert reasons["c0"] == "gave up after 1 attempt in 40 s: warehouse gone"  # its table's last error


def test_status_files_keep_the_counters_and_older_files_still_read(tmp_path: Path) -> None:
    log = tmp_path / "incoming.tok=web-2020-08-02T18-00-00.000.log"
    failing = PairStatus(False, "refused", 2, 10.0, 20.0, 80.0)
    given_up = PairStatus(False, "gave up after 3 attempts in 72.00 h: refused", 3, 1.0, 2.0, 0.0, gave_up=True)
    write_status(log, {"pg": {"t": failing, "u": given_up, "v": PairStatus(True)}})

    raw = orjson.loads(status_path(log).read_bytes())
    assert raw["pg"]["v"] == {"uploaded": True, "error": ""}  # EventNative's form while nothing fails
    assert raw["pg"]["t"] == {
        "uploaded": False,
        "error": "refused",
        "attempts": 2,
        "first_failed": 10.0,
        "last_attempt": 20.0,
        "next_attempt": 80.0,
    }
    assert raw["pg"]["u"]["gave_up"] is True
    assert read_status(log) == {"pg": {"t": failing, "u": given_up, "v": PairStatus(True)}}
    assert not all_uploaded({"pg": {"t": failing}}) and all_uploaded({"pg": {"u": given_up, "v": PairStatus(True)}})
    odd = parse_status({"pg": {"t": {"uploaded": False, "error": "x", "attempts": "many", "first_failed": True}}})
    assert odd == {"pg": {"t": PairStatus(False, "x")}}

    again = merge_status({"pg": {"t": failing}}, {"pg": {"t": PairStatus(False, "timeout", 1, 50.0, 50.0)}})
    assert again["pg"]["t"] == PairStatus(False, "timeout", 3, 10.0, 50.0, 80.0)
    settled = merge_status({"pg": {"u": given_up}}, {"pg": {"u": PairStatus(False, "late", 1, 60.0, 60.0)}})
    assert settled["pg"]["u"] == given_up  # a given-up pair never goes back to failing


def test_status_files_keep_the_splits_written_directly_while_their_pair_is_not_settled(tmp_path: Path) -> None:
    log = tmp_path / "incoming.tok=web-2020-08-02T18-00-00.000.log"
    failing = PairStatus(False, "refused", 1, 10.0, 10.0, 20.0, written=(f"{log.name}@0-10",), columns={"n": "bigint"})
    done = PairStatus(True, written=(f"{log.name}@10-20",), columns={"n": "bigint"})
    write_status(log, {"pg": {"t": failing, "v": done}})

    raw = orjson.loads(status_path(log).read_bytes())
    assert raw["pg"]["t"]["written"] == [f"{log.name}@0-10"] and raw["pg"]["t"]["columns"] == {"n": "bigint"}
    assert raw["pg"]["v"] == {"uploaded": True, "error": ""}
    assert read_status(log)["pg"]["t"] == failing
    assert parse_status({"pg": {"t": {"uploaded": False, "written": [f"{log.name}@0-10", 3]}}})["pg"]["t"].written == (
        f"{log.name}@0-10",
    )
    later = PairStatus(False, "timeout", 1, 30.0, 30.0, written=(f"{log.name}@10-20",))
    again = merge_status({"pg": {"t": failing}}, {"pg": {"t": later}})
    assert again["pg"]["t"].written == (f"{log.name}@0-10", f"{log.name}@10-20")
    deferred = merge_status({"pg": {"t": failing}}, {"pg": {"t": PairStatus(False, "locked")}})
    assert deferred["pg"]["t"].written == (f"{log.name}@0-10",)
    uploaded = merge_status({"pg": {"t": failing}}, {"pg": {"t": PairStatus(True)}})
    assert uploaded["pg"]["t"] == PairStatus(True)
