"""What the batch pass moves events into is fsynced before it removes what it replaces: the
archive before the log, status files and manifests before they count, failed-event spools
before the pass reports them."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from eventspark.batch.partition import process_splits
from eventspark.batch.splits import Split
from eventspark.logs.archive import archive_log
from eventspark.logs.status import replace_file
from tests.batch.test_partition import RecordingStage, _plan


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path os.fsync is called on, in order; a removed path is recorded as 'gone:<path>'."""
    events: list[str] = []
    real_fsync, real_unlink = os.fsync, Path.unlink

    def fsync(fd: int) -> None:
        real_fsync(fd)
        events.append(os.readlink(f"/proc/self/fd/{fd}"))

    def unlink(path: Path, missing_ok: bool = False) -> None:
        events.append(f"gone:{path}")
        real_unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Path, "unlink", unlink)
    return events


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads fd paths from /proc")
def test_the_archive_and_its_name_are_synced_before_the_log_goes(tmp_path: Path, synced: list[str]) -> None:
    log = tmp_path / "incoming.log"
    log.write_bytes(b'{"a": 1}\n')
    target = archive_log(log, tmp_path / "archive")
    gone = synced.index(f"gone:{log}")
    assert str(target) + ".tmp" in synced[:gone]  # the file (synced under its temporary name)
    assert str(target.parent) in synced[:gone]  # and the folder holding its final name


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads fd paths from /proc")
def test_replaced_files_are_synced_with_their_folder(tmp_path: Path, synced: list[str]) -> None:
    replace_file(tmp_path / "x.status", b"{}")
    assert synced == [str(tmp_path / "x.status.tmp"), str(tmp_path)]
    assert (tmp_path / "x.status").read_bytes() == b"{}"


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads fd paths from /proc")
def test_failed_event_spools_are_synced_before_the_task_reports_them(tmp_path: Path, synced: list[str]) -> None:
    path = tmp_path / "log"
    path.write_bytes(b'{oops\n{"event_type": "a"}\n')
    (result,) = process_splits(_plan(tmp_path, RecordingStage(set())), 0, [Split(str(path), 0, 100)])
    (spool,) = [count.spool for count in result.counts if count.spool]
    assert spool in synced and orjson.loads(Path(spool).read_bytes())["event"] == "{oops"
