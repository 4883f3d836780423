"""`batch.failed_events.FailedEvents`: a job's failed events from its spools to `failed/`, once."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventspark.batch.failed_events import FailedEvents
from eventspark.batch.partition import NO_TABLE
from eventspark.config.models import RemoteLogs
from eventspark.logs.failed import failed_log_path, parked_spools
from eventspark.logs.status import LogStatus, PairStatus, write_status
from eventspark.logs.store import RemoteStore

LOG_A = "incoming.tok=web-2020-08-02T18-00-00.000.log"
LOG_B = "incoming.tok=web-2020-08-02T19-00-00.000.log"


class Crash(Exception):
    pass


def _spool(folder: Path, name: str, lines: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def _incoming(events_dir: Path, name: str) -> Path:
    path = events_dir / "incoming" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'{"a":1}\n')
    return path


def _lines(events_dir: Path) -> list[str]:
    target = failed_log_path(events_dir / "failed", "pg")
    return target.read_text().splitlines() if target.exists() else []


def _park_three(events_dir: Path, failed: FailedEvents) -> None:
    """Spools of two tables of LOG_A and template failures of LOG_A (fresh) and LOG_B (not fresh)."""
    staging = events_dir / "staging" / "job"
    failed.park(
        {
            (LOG_A, "pg", "users"): [_spool(staging, "1.log", ["u1", "u2"])],
            (LOG_A, "pg", "views"): [_spool(staging, "2.log", ["v1"])],
            (LOG_A, "pg", NO_TABLE): [_spool(staging, "3.log", ["t1"])],
            (LOG_B, "pg", NO_TABLE): [_spool(staging, "4.log", ["t2"])],
        },
        fresh={(LOG_A, "pg")},
    )


def test_park_then_append_the_settled_pairs_around_the_status_writes(tmp_path: Path) -> None:
    failed = FailedEvents(tmp_path)
    _park_three(tmp_path, failed)
    assert (tmp_path / "staging" / "job" / "4.log").exists()  # not fresh: written by an earlier pass
    assert len(parked_spools(tmp_path / "failed")) == 3
    updates: dict[str, LogStatus] = {LOG_A: {"pg": {"users": PairStatus(True), "views": PairStatus(False, "boom")}}}
    with failed.append_settled(updates):
        assert _lines(tmp_path) == ["t1", "u1", "u2"]  # appended and fsynced before the status writes
    assert _lines(tmp_path) == ["t1", "u1", "u2"]
    left = parked_spools(tmp_path / "failed")
    assert [(group.log, group.table) for group in left] == [(LOG_A, "views")]  # waits for its load marker


def test_a_crash_during_the_status_writes_is_undone_then_appended_once_settled(tmp_path: Path) -> None:
    log_a = _incoming(tmp_path, LOG_A)
    failed = FailedEvents(tmp_path)
    _park_three(tmp_path, failed)
    updates: dict[str, LogStatus] = {LOG_A: {"pg": {"users": PairStatus(True), "views": PairStatus(True)}}}
    with pytest.raises(Crash), failed.append_settled(updates):
        raise Crash  # before the status file is written
    assert _lines(tmp_path) == ["t1", "u1", "u2", "v1"]  # maybe appended: the journal says so
    FailedEvents(tmp_path).recover(["pg"])
    assert _lines(tmp_path) == []  # undone; the status file does not show the pairs settled yet
    assert len(parked_spools(tmp_path / "failed")) == 3
    write_status(log_a, updates[LOG_A])
    FailedEvents(tmp_path).recover(["pg"])
    FailedEvents(tmp_path).recover(["pg"])
    assert sorted(_lines(tmp_path)) == ["t1", "u1", "u2", "v1"]
    assert parked_spools(tmp_path / "failed") == []


def test_an_unreachable_destination_drops_the_groups_of_the_logs_giving_up(tmp_path: Path) -> None:
    for name in (LOG_A, LOG_B):
        write_status(_incoming(tmp_path, name), {"pg": {"users": PairStatus(False, "down", 1, 1.0, 1.0)}})
    crashed = FailedEvents(tmp_path)
    staging = tmp_path / "staging" / "job"
    crashed.park(
        {
            (LOG_A, "pg", "users"): [_spool(staging, "1.log", ["a"])],
            (LOG_B, "pg", "users"): [_spool(staging, "2.log", ["b"])],
        },
        fresh=set(),
    )
    FailedEvents(tmp_path).settle_unreachable("pg", {LOG_A})
    assert _lines(tmp_path) == []  # LOG_A's events go to failed/ again, with the give-up reason
    assert [group.log for group in parked_spools(tmp_path / "failed")] == [LOG_B]  # not known yet


def test_a_claim_removed_before_the_appends_drops_its_group(tmp_path: Path) -> None:
    # Review: the pass's lease could lapse after its fence check, and another node's pass remove
    # this job's claims and spool the same failed events: they were appended here all the same.
    remote = RemoteLogs(url=(tmp_path / "store").as_uri())
    store = RemoteStore(remote, tmp_path, "node-a")
    failed = FailedEvents(tmp_path, claims=store.park_claims())
    _park_three(tmp_path, failed)
    assert failed.claims is not None and all(failed.claims.held(group) for group in failed.parked)
    users = next(group for group in failed.parked if group.table == "users")
    # Another node's pass decides LOG_A's users pair again: this job's claim on it goes.
    store.park_claims().supersede([(LOG_A, "pg", "users")], keep=[])

    updates: dict[str, LogStatus] = {LOG_A: {"pg": {"users": PairStatus(True), "views": PairStatus(True)}}}
    with failed.append_settled(updates):
        assert _lines(tmp_path) == ["t1", "v1"]  # the users group is dropped, never appended
    assert _lines(tmp_path) == ["t1", "v1"]
    assert not users.manifest.parent.exists()
    assert parked_spools(tmp_path / "failed") == []
