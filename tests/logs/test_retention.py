"""Retention of archive/ and failed/ (`eventspark.logs.retention`): the policy on planted files,
and `eventspark serve` applying it by itself."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from eventspark.batch.process import batch_lock
from eventspark.config import load_config
from eventspark.config.models import LogConfig
from eventspark.logs import retention
from eventspark.logs.failed import (
    append_settled,
    appending,
    failed_log_path,
    journal_path,
    park_spools,
    parked_spools,
)
from eventspark.logs.retention import (
    GIB,
    Retention,
    after_pass,
    apply_retention,
    archive_retention,
    failed_retention,
    read_usage,
)
from eventspark.ops import replay as replay_module
from eventspark.ops.fallback import replay_is_running, replay_running
from eventspark.ops.metrics import pipeline_metrics
from eventspark.ops.replay import hand_over, plan_replay
from eventspark.stream.queue import RECORDING_FILE, QueueReader, queue_dir
from eventspark.stream.worker import _append as stream_append
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
    with replay_running(folder):
        result = archive_retention(tmp_path, 1, None, NOW)
    assert [r.path for r in result.removed] == [other.relative_to(tmp_path).as_posix()] and source.exists()
    assert [r.path for r in archive_retention(tmp_path, 1, None, NOW).removed] == [name]  # it ended


# --- failed/ --------------------------------------------------------------------------------------


def test_failed_age_removes_files_untouched_for_long(tmp_path: Path) -> None:
    old = plant(tmp_path / "failed" / "failed.dst=old.log", 700, 9)
    recent = plant(tmp_path / "failed" / "failed.dst=recent.log", 800, 1)
    result = failed_retention(tmp_path, 3, None, NOW)
    assert [(r.path, r.size) for r in result.removed] == [("failed/failed.dst=old.log", 700)]
    assert not old.exists() and recent.exists()


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
    streaming = plant(failed_dir / "failed.dst=s.log", 100, 30)  # its stream worker's mark names it
    plant(queue_dir(tmp_path, "s") / RECORDING_FILE, 10, 30)
    running = replayed(tmp_path, "running", 30, 1000, state="started")
    replayed(tmp_path, "dead", 30, 1000, state="started")  # its process died: no lock held
    replayed(tmp_path, "interrupted", 30, 1000, state="interrupted")
    with replay_running(running):
        result = failed_retention(tmp_path, 1, gib(1), NOW)
    assert sorted(r.path for r in result.removed) == ["failed/replayed/dead", "failed/replayed/interrupted"]
    assert parked.exists() and recent.exists() and running.exists() and streaming.exists()
    assert result.kept == 4  # pending/, the recorded and recent files, the running replay


def test_a_replay_holds_its_folder_while_it_hands_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ops.replay.hand_over` locks its folder until it returns, so retention knows it runs."""
    log_path = tmp_path / "events"
    plant(log_path / "failed" / "failed.dst=pg.log", 100, 30)
    seen: list[bool] = []

    def copy(_log_path: Path, source: Path, *_args: Any) -> dict[str, int]:
        seen.append(replay_is_running(source.parent))
        return {"events": 0, "unreadable": 0}

    monkeypatch.setattr(replay_module, "_copy_events", copy)
    config = tmp_path / "eventspark.yaml"
    dest = {"type": "postgres", "mode": "batch", "datasource": {"host": "127.0.0.1", "db": "test"}}
    config.write_text(orjson.dumps({"log": {"path": str(log_path)}, "destinations": {"pg": dest}}).decode())
    loaded = load_config(config)
    record = hand_over(loaded.config, plan_replay(loaded.config, "failed.dst=pg.log"))
    folder = log_path / "failed" / "replayed" / record["id"]
    assert seen == [True] and not replay_is_running(folder)


LATE = b'{"event":{"id":1},"error":"late","event_id":""}\n'


def hook_lock(monkeypatch: pytest.MonkeyPatch, before: Any = None, inside: Any = None) -> None:
    """Runs `before` just before retention takes a failed file's lock, `inside` once it holds it."""
    real = retention.quiet_failed_log

    @contextlib.contextmanager
    def hooked(failed_dir: Path, dest_id: str) -> Iterator[None]:
        if before is not None:
            before()
        with real(failed_dir, dest_id):
            if inside is not None:
                inside()
            yield

    monkeypatch.setattr(retention, "quiet_failed_log", hooked)


def record_failed(reader: QueueReader, path: Path, data: bytes) -> None:
    """The stream worker's `_record`: its mark and its append under the append lock."""
    with appending(path.parent):
        reader.mark_recording(path, len(data))
        stream_append(path, data, False)


def test_a_stream_append_waits_while_retention_holds_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker records while retention decides: it waits, then appends to a new file, which its
    mark names (not the inode removed)."""
    path = plant(tmp_path / "failed" / "failed.dst=s.log", 1000, 10)
    reader = QueueReader(queue_dir(tmp_path, "s"))
    reader.open()
    worker = threading.Thread(target=record_failed, args=(reader, path, LATE))
    seen: list[tuple[bool, int]] = []

    def inside() -> None:
        worker.start()
        worker.join(0.3)
        seen.append((worker.is_alive(), path.stat().st_size))

    hook_lock(monkeypatch, inside=inside)
    try:
        result = failed_retention(tmp_path, 1, None, NOW)
        worker.join(10)
        mark = orjson.loads((queue_dir(tmp_path, "s") / RECORDING_FILE).read_bytes())
    finally:
        reader.close()
    assert seen == [(True, 1000)]  # blocked: nothing appended while retention held the lock
    assert [(r.path, r.size) for r in result.removed] == [("failed/failed.dst=s.log", 1000)]
    assert path.read_bytes() == LATE and (mark["inode"], mark["size"]) == (path.stat().st_ino, 0)


@pytest.mark.parametrize("step", ["appended", "marked"])
def test_a_stream_record_between_the_scan_and_the_lock_keeps_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """After the scan chose the file, the worker appends (the file grew), or writes its mark and
    dies before appending (same size, a mark that a restart applies to this inode): kept as is."""
    path = plant(tmp_path / "failed" / "failed.dst=s.log", 1000, 10)
    content = path.read_bytes()
    reader = QueueReader(queue_dir(tmp_path, "s"))
    reader.open()

    def record() -> None:
        if step == "appended":
            record_failed(reader, path, LATE)
            reader.ack()
            reader.end_recording()
        else:
            with appending(path.parent):
                reader.mark_recording(path, len(LATE))

    hook_lock(monkeypatch, before=record)
    try:
        result = failed_retention(tmp_path, 1, None, NOW)
    finally:
        reader.close()
    assert result.removed == [] and result.kept == 1
    assert path.read_bytes() == (content + LATE if step == "appended" else content)


def test_a_dead_pass_lines_are_cut_off_before_the_removal(tmp_path: Path) -> None:
    """A pass died after appending a group (its journal not done): the removal takes the file
    without them, no journal is left to cut a new file, and the next pass appends the group once."""
    failed_dir = tmp_path / "failed"
    path = plant(failed_dir / "failed.dst=pg.log", 1000, 10)
    spool = tmp_path / "spool.log"
    spool.write_bytes(LATE * 3)
    group = park_spools(failed_dir, "incoming.tok=a.log", "pg", "t", [spool])
    journal = {"dest": "pg", "inode": path.stat().st_ino, "start": 1000, "groups": [group.manifest.parent.name]}
    (failed_dir / "pending").mkdir(exist_ok=True)
    journal_path(failed_dir, "pg").write_bytes(orjson.dumps({**journal, "done": False}))
    with path.open("ab") as file:  # what the pass appended before it died
        file.write(LATE * 3)
    os.utime(path, (NOW - 10 * DAY, NOW - 10 * DAY))
    result = failed_retention(tmp_path, 1, None, NOW)
    assert [(r.path, r.size) for r in result.removed] == [("failed/failed.dst=pg.log", 1000)]
    assert not path.exists() and not journal_path(failed_dir, "pg").exists()
    append_settled(failed_dir, "pg", parked_spools(failed_dir))  # the next pass
    assert path.read_bytes() == LATE * 3 and parked_spools(failed_dir) == []


def test_a_stream_worker_appending_throughout_loses_and_doubles_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream worker's real recording steps (`_record`: mark and append under the append
    lock, then `ack`, `end_recording`), stalling now and then in its write as a busy process
    does, against retention removing the file whenever it may: every line is either in a file
    removed whole (whole lines) or in the live one, once."""
    reader = QueueReader(queue_dir(tmp_path, "s"))
    reader.open()
    path = failed_log_path(tmp_path / "failed", "s")
    real_write, real_unlink = os.write, Path.unlink
    sent: list[bytes] = []
    removed: list[bytes] = []

    def stalling_write(fd: int, data: Any) -> int:
        if threading.current_thread() is thread and len(sent) % 10 == 0:
            time.sleep(0.15)  # a stall in the middle of the record, lock held
        return real_write(fd, data)

    def unlink(self: Path, missing_ok: bool = False) -> None:
        if self == path and threading.current_thread() is not thread:
            removed.append(self.read_bytes())  # what retention deletes
        real_unlink(self, missing_ok)

    def append_lines(stop: threading.Event) -> None:
        while not stop.is_set():
            data = f'{{"n":{len(sent)}}}\n'.encode()
            record_failed(reader, path, data)
            reader.ack()
            reader.end_recording()
            sent.append(data)
            stop.wait(0.002)  # between micro-batches: room for a removal

    monkeypatch.setattr(retention, "MIN_AGE_SEC", 0.0)
    monkeypatch.setattr(os, "write", stalling_write)
    monkeypatch.setattr(Path, "unlink", unlink)
    stop = threading.Event()
    thread = threading.Thread(target=append_lines, args=(stop,))
    thread.start()
    runs = 0
    deadline = time.monotonic() + 1.5
    try:
        while time.monotonic() < deadline or len(removed) < 2:
            failed_retention(tmp_path, 0, None)
            runs += 1
            if time.monotonic() > deadline + 10:
                pytest.fail(f"{len(removed)} removal(s) in {runs} runs")
    finally:
        stop.set()
        thread.join(10)
        reader.close()
    kept = path.read_bytes().splitlines(keepends=True) if path.exists() else []
    assert all(chunk.endswith(b"\n") for chunk in removed)  # whole lines only
    found = [line for chunk in removed for line in chunk.splitlines(keepends=True)] + kept
    assert sorted(found) == sorted(sent) and len(sent) > 10


def test_failed_files_wait_for_appends_not_for_a_batch_pass(tmp_path: Path) -> None:
    """A pass holding the batch lock (computing, loading) does not stop retention; one appending
    (the append lock, taken by another open file as another process would) holds up only the
    failed files, each alone: replayed folders go meanwhile."""
    other = plant(tmp_path / "failed" / "failed.dst=other.log", 1000, 10)
    with batch_lock(tmp_path / "incoming"):
        assert [r.path for r in failed_retention(tmp_path, 1, None, NOW).removed] == ["failed/failed.dst=other.log"]
    assert not other.exists()
    failed = plant(tmp_path / "failed" / "failed.dst=pg.log", 1000, 10)
    folder = replayed(tmp_path, "r1", 10, 100)
    results: list[Any] = []
    runner = threading.Thread(target=lambda: results.append(failed_retention(tmp_path, 1, None, NOW)))
    with appending(tmp_path / "failed"):
        runner.start()
        wait_until(lambda: not folder.exists(), "the replayed folder's removal")
        runner.join(0.3)
        assert failed.exists() and runner.is_alive()  # nothing removed while a pass may append
    runner.join(10)
    assert [r.path for r in results[0].removed] == ["failed/replayed/r1", "failed/failed.dst=pg.log"]
    assert not failed.exists()


class Crash(BaseException):
    """A process killed at this point."""


def test_a_removal_cut_short_is_finished_by_the_next_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed before the unlink: the file is whole (nothing cut but a dead pass's lines) and the
    lock released; a replayed folder half removed (its record removed last) is still dated and
    goes whole next time."""
    failed = plant(tmp_path / "failed" / "failed.dst=pg.log", 1000, 10)
    content = failed.read_bytes()
    half = replayed(tmp_path, "r1", 10, 100)
    (half / "failed.dst=pg.log").unlink()  # the crash hit after its first file
    real_unlink = Path.unlink

    def crash(self: Path, missing_ok: bool = False) -> None:
        if self == failed:
            raise Crash
        real_unlink(self, missing_ok)

    monkeypatch.setattr(Path, "unlink", crash)
    with pytest.raises(Crash):
        failed_retention(tmp_path, 1, None, NOW)
    monkeypatch.setattr(Path, "unlink", real_unlink)
    assert failed.read_bytes() == content and not half.exists()
    result = failed_retention(tmp_path, 1, None, NOW)
    assert [r.path for r in result.removed] == ["failed/failed.dst=pg.log"] and not failed.exists()


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
