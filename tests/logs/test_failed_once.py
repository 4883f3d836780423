"""Failed lines exactly once: a batch pass killed at any point of its failed-log appends, then rerun.

The journal of `logs.failed` (unit tests first), then whole passes on the shared SparkSession
crashed at every point (a SystemExit nothing catches, like a kill) and rerun: each failed line
is in `failed/` once, each loaded row in the table once.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventspark.batch.job import BatchJob
from eventspark.batch.process import run_pass
from eventspark.coordination import MemoryCoordination
from eventspark.logs.failed import (
    PENDING_DIR,
    append_groups,
    appending,
    event_error_line,
    failed_log_path,
    journal_path,
    park_spools,
    parked_spools,
    recover_journal,
    settle_recovered,
)
from eventspark.ops.replay import hand_over, plan_replay
from tests.batch.helpers import duck_rows, duckdb_destination, event, failed_lines, make_config, put_log
from tests.batch.test_retry import T0, Warehouse, run


def spools(folder: Path, *texts: bytes) -> list[Path]:
    found = []
    for index, text in enumerate(texts):
        found.append(folder / f"spool-{index}.log")
        found[-1].write_bytes(text)
    return found


class Crash(BaseException):
    """Not an Exception: nothing in the pass may catch it."""


def test_a_journal_not_done_is_undone_and_its_settled_groups_appended_once(tmp_path: Path) -> None:
    failed_dir = tmp_path / "failed"
    failed_dir.mkdir()
    target = failed_log_path(failed_dir, "pg")
    target.write_bytes(b"old\n")
    groups = [
        park_spools(failed_dir, "log-1", "pg", "t", spools(tmp_path, b"a\n")),
        park_spools(failed_dir, "log-2", "pg", "t", spools(tmp_path, b"b\n")),
    ]

    def crash(_at: str) -> None:
        raise Crash

    with pytest.raises(Crash):  # cut short after the first group
        append_groups(failed_dir, "pg", groups, crash)
    assert target.read_bytes() == b"old\na\n" and journal_path(failed_dir, "pg").exists()

    assert recover_journal(failed_dir, "pg")
    assert target.read_bytes() == b"old\n" and not journal_path(failed_dir, "pg").exists()
    assert not recover_journal(failed_dir, "pg")  # idempotent: nothing left to undo
    found = parked_spools(failed_dir)
    assert settle_recovered(failed_dir, "pg", found, lambda group: group.log == "log-2") == (1, 1)
    assert target.read_bytes() == b"old\nb\n"
    assert list((failed_dir / PENDING_DIR).iterdir()) == []


def test_a_done_journal_only_removes_its_groups(tmp_path: Path) -> None:
    failed_dir = tmp_path / "failed"
    group = park_spools(failed_dir, "log-1", "pg", "t", spools(tmp_path, b"a\n"))
    journal = append_groups(failed_dir, "pg", [group])
    assert journal is not None
    # Cut short between the journal marked done and the removal of its groups.
    journal.write_bytes(journal.read_bytes().replace(b'"done":false', b'"done":true'))

    assert recover_journal(failed_dir, "pg")

    assert failed_log_path(failed_dir, "pg").read_bytes() == b"a\n"
    assert list((failed_dir / PENDING_DIR).iterdir()) == []


def test_a_failed_log_moved_away_is_never_truncated(tmp_path: Path) -> None:
    failed_dir = tmp_path / "failed"
    group = park_spools(failed_dir, "log-1", "pg", "t", spools(tmp_path, b"a\n"))
    append_groups(failed_dir, "pg", [group])
    target = failed_log_path(failed_dir, "pg")
    target.rename(tmp_path / "moved.log")  # a replay moved it; a new one was written since
    target.write_bytes(b"new line 1\nnew line 2\n")

    recover_journal(failed_dir, "pg")

    assert target.read_bytes() == b"new line 1\nnew line 2\n"
    assert (tmp_path / "moved.log").read_bytes() == b"a\n"


def line(event_id: str) -> bytes:
    return event_error_line(event(event_id), "refused")


def died_appending(failed_dir: Path, log_name: str) -> None:
    """A pass that parked groups 'a' and 'b' of `log_name` and died after appending 'a'."""
    first, second = spools(failed_dir.parent, line("a"), line("b"))
    groups = [
        park_spools(failed_dir, log_name, "dd", "t", [first]),
        park_spools(failed_dir, log_name, "dd", "t", [second]),
    ]

    def crash(_at: str) -> None:
        raise Crash

    with pytest.raises(Crash):
        append_groups(failed_dir, "dd", groups, crash)


def test_a_replay_after_a_pass_died_appending_takes_each_line_once(tmp_path: Path) -> None:
    loaded = make_config(tmp_path, {"dd": duckdb_destination(template="t")})
    failed_dir = tmp_path / "events" / "failed"
    failed_dir.mkdir(parents=True)
    failed_log_path(failed_dir, "dd").write_bytes(line("old"))
    died_appending(failed_dir, "incoming.tok=web-2020-08-02T18-00-00.000.log")  # archived since: settled

    hand_over(loaded.config, plan_replay(loaded.config, "failed.dst=dd.log"))
    (replay_log,) = (tmp_path / "events" / "incoming").glob("replay.dst=dd-*.log")
    replayed = [orjson.loads(text)["eventn_ctx"]["event_id"] for text in replay_log.read_bytes().splitlines()]
    BatchJob(loaded, MemoryCoordination("test")).recover_failed()  # what the next pass starts with

    assert replayed == ["old"]  # not 'a': the dead pass's line was cut off before the move
    assert sorted(f["event_id"] for f in failed_lines(tmp_path, "dd")) == ["a", "b"]


def test_a_replay_waits_for_the_appends_of_a_pass(tmp_path: Path) -> None:
    loaded = make_config(tmp_path, {"dd": duckdb_destination(template="t")})
    failed_dir = tmp_path / "events" / "failed"
    failed_dir.mkdir(parents=True)
    failed_log_path(failed_dir, "dd").write_bytes(line("old"))
    plan = plan_replay(loaded.config, "failed.dst=dd.log")
    replay = threading.Thread(target=hand_over, args=(loaded.config, plan))

    with appending(failed_dir):  # a pass between its journal and its removal
        replay.start()
        replay.join(0.3)
        assert replay.is_alive() and failed_log_path(failed_dir, "dd").exists()
    replay.join(10)

    assert not replay.is_alive() and not failed_log_path(failed_dir, "dd").exists()


def test_a_pass_without_logs_repairs_a_pass_cut_short(tmp_path: Path) -> None:
    loaded = make_config(tmp_path, {"dd": duckdb_destination(template="t")})
    failed_dir = tmp_path / "events" / "failed"
    failed_dir.mkdir(parents=True)
    failed_log_path(failed_dir, "dd").write_bytes(line("old"))
    died_appending(failed_dir, "incoming.tok=web-2020-08-02T18-00-00.000.log")

    run_pass(loaded, MemoryCoordination("test"))  # incoming/ is empty: no job

    assert sorted(f["event_id"] for f in failed_lines(tmp_path, "dd")) == ["a", "b", "old"]
    assert list((failed_dir / PENDING_DIR).iterdir()) == []


POINTS = ["staged", "pair committed", "committed", "failed group appended", "failed appended", "statuses written"]


class CrashAt:
    """Raises Crash the first `times` times the pass reaches `point`."""

    def __init__(self, point: str, times: int) -> None:
        self.point, self.left = point, times

    def __call__(self, at: str) -> None:
        if at == self.point and self.left:
            self.left -= 1
            raise Crash(at)


@pytest.mark.spark
@pytest.mark.parametrize("point", POINTS)
def test_each_failed_line_once_after_a_crash_at_any_point(spark: Any, tmp_path: Path, point: str) -> None:
    template = "{{.event_type}}{{if .broken}}{{.broken.deeper.Format}}{{end}}"
    loaded = make_config(tmp_path, {"dd": duckdb_destination(template=template)})
    put_log(tmp_path, [event("0", event_type="t", n=0), event("u0", event_type="u", n=0)])
    assert run(spark, loaded, T0).ok  # tables t and u: n is a bigint column
    log = put_log(
        tmp_path,
        [
            event("1", event_type="t", n=1),
            event("2", event_type="t", n="x"),  # a misfit of a committed pair
            event("3", event_type="u", n="y"),  # the only event of its table, failed: nothing to commit
            event("4", event_type="t", broken={"deeper": 1}),  # a template failure
            event("5", event_type="t", n=5),
        ],
    )
    crash = CrashAt(point, 2)

    with pytest.raises(Crash):
        run(spark, loaded, T0 + 1, crash)
    with contextlib.suppress(Crash):  # the rerun is cut short at the same point again, if it gets there
        run(spark, loaded, T0 + 2, crash)
    assert run(spark, loaded, T0 + 3).ok

    assert not log.exists()
    assert Counter(f["event_id"] for f in failed_lines(tmp_path, "dd")) == {"2": 1, "3": 1, "4": 1}
    assert duck_rows(tmp_path, "SELECT eventn_ctx_event_id FROM t ORDER BY 1") == [("0",), ("1",), ("5",)]
    assert duck_rows(tmp_path, "SELECT eventn_ctx_event_id FROM u") == [("u0",)]
    assert list((tmp_path / "events" / "failed" / PENDING_DIR).iterdir()) == []


@pytest.mark.spark
@pytest.mark.parametrize("point", ["failed group appended", "failed appended", "statuses written"])
def test_a_give_up_cut_short_writes_each_event_once(spark: Any, tmp_path: Path, point: str) -> None:
    retry = {"base_sec": 10, "max_sec": 10, "max_age_hours": 0.01}
    loaded = make_config(tmp_path, {"dd": duckdb_destination(template="t")}, retry=retry)
    warehouse = Warehouse()
    warehouse.down = True
    log = put_log(tmp_path, [event("1", n=1), event("2", n=2)])
    assert not run(spark, loaded, T0, warehouse).ok
    crash = CrashAt(point, 1)

    with pytest.raises(Crash):
        run(spark, loaded, T0 + 40, crash)  # gives up, cut short
    result = run(spark, loaded, T0 + 50)

    assert not log.exists() and result.ok
    failed = failed_lines(tmp_path, "dd")
    assert Counter(f["event_id"] for f in failed) == {"1": 1, "2": 1}
    assert all(f["error"].startswith("gave up after 1 attempt in ") for f in failed)
