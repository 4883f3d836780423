"""Retention of archive/ and failed/ (`eventspark.logs.retention`): the policy on planted files,
and `eventspark serve` applying it by itself."""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from eventspark.config.models import LogConfig
from eventspark.logs import retention
from eventspark.logs.retention import (
    GIB,
    Retention,
    after_pass,
    apply_retention,
    archive_retention,
    failed_retention,
    read_usage,
)
from eventspark.ops.metrics import pipeline_metrics
from tests.collector import conftest as collector_fixtures

run_server = collector_fixtures.run_server

DAY = 86400.0
NOW = time.time()
TODAY = datetime.fromtimestamp(NOW, UTC).date()


def plant(path: Path, size: int, age_days: float, now: float = NOW) -> Path:
    """A file of `size` bytes last modified `age_days` ago."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * (size - 1) + b"\n")
    moment = now - age_days * DAY
    os.utime(path, (moment, moment))
    return path


def day_folder(log_path: Path, days_ago: int) -> Path:
    return log_path / "archive" / (TODAY - timedelta(days=days_ago)).isoformat()


def replayed(log_path: Path, name: str, age_days: float, size: int, state: str = "handed", source: str = "") -> Path:
    """A replay's folder as `ops.replay` leaves it: the moved failed file and `replay.json`."""
    folder = log_path / "failed" / "replayed" / name
    plant(folder / "failed.dst=pg.log", size, age_days)
    at = datetime.fromtimestamp(NOW - age_days * DAY, UTC).isoformat()
    record = {"id": name, "at": at, "state": state, "source": source or f"failed/{name}", "destinations": {}}
    (folder / "replay.json").write_bytes(orjson.dumps(record))
    return folder


def gib(size: int) -> float:
    return size / GIB


# --- archive/ -------------------------------------------------------------------------------------


def test_unset_keeps_everything_and_measures(tmp_path: Path) -> None:
    plant(day_folder(tmp_path, 400) / "a.log.gz", 1000, 400)
    plant(tmp_path / "failed" / "failed.dst=pg.log", 500, 400)
    replayed(tmp_path, "r1", 400, 300)
    before = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    results = apply_retention(LogConfig(path=str(tmp_path)), NOW)
    assert [(r.directory, r.removed) for r in results] == [("archive", []), ("failed", [])]
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file() and "state" not in p.parts) == before
    usage = read_usage(tmp_path)
    record = (tmp_path / "failed/replayed/r1/replay.json").stat().st_size
    assert usage is not None and usage["archive"] == {"bytes": 1000, "files": 1, "removed_files": 0, "removed_bytes": 0}
    assert usage["failed"] == {"bytes": 800 + record, "files": 3, "removed_files": 0, "removed_bytes": 0}


def test_archive_age_removes_old_files_and_their_empty_day(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old = plant(day_folder(tmp_path, 10) / "incoming.tok=a-2020.log.gz", 2000, 10)
    new = plant(day_folder(tmp_path, 0) / "incoming.tok=a-2026.log.gz", 3000, 0.5)
    empty_old, empty_yesterday = day_folder(tmp_path, 5), day_folder(tmp_path, 1)
    empty_old.mkdir()
    empty_yesterday.mkdir()
    caplog.set_level(logging.INFO, "eventspark.logs.retention")
    result = archive_retention(tmp_path, 2, None, NOW)
    assert [(r.path, r.size) for r in result.removed] == [(old.relative_to(tmp_path).as_posix(), 2000)]
    assert not old.parent.exists() and new.exists()
    assert not empty_old.exists() and empty_yesterday.is_dir()  # the archivers may be about to write there
    assert (result.size_before, result.size_after) == (5000, 3000)
    assert f"removed {old.relative_to(tmp_path).as_posix()} (2000 bytes): older than 2 day(s)" in caplog.text
    assert "archive/: removed 1 file(s), 2000 bytes; 3000 bytes left" in caplog.text


def test_archive_size_cap_removes_oldest_first(tmp_path: Path) -> None:
    files = [plant(day_folder(tmp_path, 6 - n) / f"log{n}.gz", 1000, 6 - n) for n in range(4)]
    result = archive_retention(tmp_path, None, gib(2500), NOW)
    assert [r.path.rsplit("/", 1)[1] for r in result.removed] == ["log0.gz", "log1.gz"]
    assert [f.exists() for f in files] == [False, False, True, True]
    assert result.size_after == 2000 and all("over the cap" in r.reason for r in result.removed)


def test_archive_never_touches_live_stream_files_or_archives_being_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    archive = tmp_path / "archive"
    live = plant(archive / "streaming-archive.dst=s.log", 5000, 30)
    rotated = plant(archive / "streaming-archive.dst=s-2026-01-01T00-00-00.000.log", 4000, 30)
    writing = plant(day_folder(tmp_path, 30) / "incoming.tok=a.log.gz.tmp", 3000, 30)
    just_archived = plant(day_folder(tmp_path, 0) / "incoming.tok=b.log.gz", 2000, 0)
    old = plant(day_folder(tmp_path, 30) / "incoming.tok=c.log.gz", 1000, 30)
    result = archive_retention(tmp_path, 1, gib(100), NOW)
    assert [r.path for r in result.removed] == [old.relative_to(tmp_path).as_posix()]
    assert all(p.exists() for p in (live, rotated, writing, just_archived))
    assert result.size_after == 14000 and result.kept == 4
    assert "over its cap of" in caplog.text  # the user is told why the cap is not met


def test_archive_source_of_a_running_replay_is_kept(tmp_path: Path) -> None:
    source = plant(day_folder(tmp_path, 30) / "incoming.tok=a.log.gz", 1000, 30)
    other = plant(day_folder(tmp_path, 30) / "incoming.tok=b.log.gz", 1000, 30)
    name = source.relative_to(tmp_path).as_posix()
    folder = tmp_path / "failed" / "replayed" / "run"
    folder.mkdir(parents=True)
    (folder / "replay.json").write_bytes(
        orjson.dumps({"id": "run", "at": "2020-01-01T00:00:00+00:00", "state": "started", "source": name})
    )
    result = archive_retention(tmp_path, 1, None, NOW)
    assert [r.path for r in result.removed] == [other.relative_to(tmp_path).as_posix()] and source.exists()


# --- failed/ --------------------------------------------------------------------------------------


def test_failed_age_removes_files_untouched_for_long(tmp_path: Path) -> None:
    old = plant(tmp_path / "failed" / "failed.dst=old.log", 700, 9)
    recent = plant(tmp_path / "failed" / "failed.dst=recent.log", 800, 1)
    result = failed_retention(tmp_path, 3, None, NOW)
    assert [(r.path, r.size) for r in result.removed] == [("failed/failed.dst=old.log", 700)]
    assert not old.exists() and recent.exists()
    assert not (tmp_path / "failed" / ".retiring").exists()


def test_failed_cap_removes_replayed_folders_before_failed_files(tmp_path: Path) -> None:
    failed_dir = tmp_path / "failed"
    oldest_file = plant(failed_dir / "failed.dst=a.log", 1000, 20)
    newer_file = plant(failed_dir / "failed.dst=b.log", 1000, 10)
    replay_old = replayed(tmp_path, "2026-01-01-r1", 5, 1000)
    replay_new = replayed(tmp_path, "2026-01-02-r2", 2, 1000)
    record = len((replay_old / "replay.json").read_bytes())
    total = 4000 + 2 * record
    # Room for one failed file plus a bit: both replayed folders go, then the oldest file.
    result = failed_retention(tmp_path, None, gib(1500), NOW)
    assert [r.path for r in result.removed] == [
        "failed/replayed/2026-01-01-r1",
        "failed/replayed/2026-01-02-r2",
        "failed/failed.dst=a.log",
    ]
    assert result.removed[0].files == 2 and result.size_before == total and result.size_after == 1000
    assert not replay_old.exists() and not replay_new.exists() and not oldest_file.exists() and newer_file.exists()


def test_failed_pending_recent_and_running_replays_are_never_removed(tmp_path: Path) -> None:
    failed_dir = tmp_path / "failed"
    parked = plant(failed_dir / "pending" / "0123abcd" / "0.log", 5000, 30)
    recent = plant(failed_dir / "failed.dst=now.log", 100, 0)
    appended = plant(failed_dir / "failed.dst=a b.log", 100, 30)  # a pass's journal names it
    plant(failed_dir / "pending" / "journal.dst=a%20b.json", 100, 30)
    running = replayed(tmp_path, "running", 30, 1000, state="started")
    dead = replayed(tmp_path, "dead", 30, 1000, state="started")
    stale = NOW - 2 * retention.BUSY_REPLAY_SECONDS
    os.utime(dead / "replay.json", (stale, stale))
    replayed(tmp_path, "interrupted", 30, 1000, state="interrupted")
    result = failed_retention(tmp_path, 1, gib(1), NOW)
    assert sorted(r.path for r in result.removed) == ["failed/replayed/dead", "failed/replayed/interrupted"]
    assert parked.exists() and recent.exists() and running.exists() and appended.exists()
    assert result.kept == 4  # pending/, the journaled file, the recent file, the running replay


def test_failed_append_during_removal_is_put_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that opened the file before it was renamed aside appends after: its line survives."""
    path = plant(tmp_path / "failed" / "failed.dst=pg.log", 1000, 10)
    late = b'{"event":{"id":1},"error":"late","event_id":""}\n'
    writer = path.open("ab")  # opened before the retention's rename, like a stream worker's append
    real_sleep = time.sleep

    def settle(seconds: float) -> None:
        if not writer.closed:
            writer.write(late)
            writer.close()
        real_sleep(seconds)

    monkeypatch.setattr(retention.time, "sleep", settle)
    result = failed_retention(tmp_path, 1, None, NOW)
    assert [r.path for r in result.removed] == ["failed/failed.dst=pg.log"]
    assert path.read_bytes() == late
    assert not (tmp_path / "failed" / ".retiring").exists()


def test_a_removal_cut_short_is_finished(tmp_path: Path) -> None:
    """A crash between the rename aside and the removal: the next run puts the tail back."""
    aside = tmp_path / "failed" / ".retiring" / "1000" / "failed.dst=pg.log"
    plant(aside, 1000, 10)
    with aside.open("ab") as file:
        file.write(b"tail\n")
    result = failed_retention(tmp_path, None, None, NOW)
    assert (tmp_path / "failed" / "failed.dst=pg.log").read_bytes() == b"tail\n"
    assert not (tmp_path / "failed" / ".retiring").exists() and result.size_before == 5


def test_metrics_count_what_was_removed(tmp_path: Path) -> None:
    def removed(name: str, directory: str) -> float:
        return pipeline_metrics().sample().counters.get(name, {}).get((directory,), 0)

    before = removed("retention_removed_files", "failed"), removed("retention_removed_bytes", "failed")
    plant(tmp_path / "failed" / "failed.dst=pg.log", 1234, 10)
    apply_retention(LogConfig(path=str(tmp_path), failed_retention_days=1), NOW)
    after = removed("retention_removed_files", "failed"), removed("retention_removed_bytes", "failed")
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1234)


# --- in serve -------------------------------------------------------------------------------------


def test_a_batch_pass_wakes_the_retention_thread(tmp_path: Path) -> None:
    """The uploader's `after_pass` runs the policy now, not at the end of the (long) period."""
    service = Retention(LogConfig(path=str(tmp_path), failed_retention_days=1), period=3600)
    service.start()
    try:
        wait_until(lambda: read_usage(tmp_path) is not None, "the first run at start")
        old = plant(tmp_path / "failed" / "failed.dst=pg.log", 100, 10)
        after_pass(tmp_path)
        wait_until(lambda: not old.exists(), "the run after the pass")
    finally:
        service.stop()
    after_pass(tmp_path)  # stopped: nothing is woken, nothing raises


def wait_until(check: Any, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen in {timeout} s")
        time.sleep(0.02)


def test_serve_applies_retention_by_itself(tmp_path: Path, run_server: Any) -> None:
    """A node without destinations (nothing but the collector) still applies the policy, in the
    serving process only (two collector workers: one removal each)."""
    events = tmp_path / "events"
    old_archive = plant(day_folder(events, 40) / "incoming.tok=a.log.gz", 4096, 40)
    kept_archive = plant(day_folder(events, 0) / "incoming.tok=b.log.gz", 1024, 0.5)
    old_failed = plant(events / "failed" / "failed.dst=gone.log", 2048, 40)
    config = {
        "server": {"admin_token": "adm", "workers": 2},
        "log": {"path": str(events), "archive_retention_days": 7, "failed_retention_days": 7},
    }
    server = run_server(config)
    deadline = time.monotonic() + 20
    while (old_archive.exists() or old_failed.exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not old_archive.exists() and not old_failed.exists(), server.text()
    assert kept_archive.exists()
    metrics = _wait_removed_metrics(server.url, 20)
    assert metrics == {
        ("archive", "files"): 1,
        ("archive", "bytes"): 4096,
        ("failed", "files"): 1,
        ("failed", "bytes"): 2048,
    }
    status = httpx.get(f"{server.url}/api/v1/status", headers={"X-Admin-Token": "adm"}, timeout=10).json()
    assert status["storage"]["archive"] == {"bytes": 1024, "files": 1, "removed_files": 1, "removed_bytes": 4096}
    server.stop()
    text = server.text()
    assert text.count("removed archive/") == 1 and text.count("removed failed/failed.dst=gone.log") == 1, text


def _wait_removed_metrics(url: str, timeout: float) -> dict[tuple[str, str], float]:
    """The retention counters of `/prometheus` once the archive's removal shows there."""
    deadline = time.monotonic() + timeout
    while True:
        response = httpx.get(f"{url}/prometheus", headers={"X-Admin-Token": "adm"}, timeout=10)
        found: dict[tuple[str, str], float] = {}
        for line in response.text.splitlines():
            for kind in ("files", "bytes"):
                prefix = f"eventspark_retention_removed_{kind}_total{{dir="
                if line.startswith(prefix):
                    directory = line[len(prefix) + 1 :].split('"', 1)[0]
                    found[(directory, kind)] = float(line.rsplit(" ", 1)[1])
        if found.get(("archive", "files")) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)
