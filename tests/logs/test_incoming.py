"""Incoming log names, the append-only writer, rotation in-process and from another process."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from eventspark.logs.incoming import (
    AppendOnlyFile,
    IncomingLogs,
    LogName,
    ServerLock,
    ServerLockHeld,
    live_log_name,
    parse_log_name,
    rotate_incoming_logs,
    rotated_log_name,
)

AT = datetime(2024, 3, 5, 7, 8, 9, 123456, tzinfo=UTC)


# --- names ----------------------------------------------------------------------------------------


def test_live_and_rotated_names_follow_eventnative() -> None:
    assert live_log_name("web") == "incoming.tok=web.log"
    assert rotated_log_name("web", AT) == "incoming.tok=web-2024-03-05T07-08-09.123.log"


def test_worker_names() -> None:
    assert live_log_name("web", worker=2) == "incoming.tok=web|w=2.log"
    assert rotated_log_name("web", AT, worker=2) == "incoming.tok=web|w=2-2024-03-05T07-08-09.123.log"


@pytest.mark.parametrize(
    ("token_id", "worker"),
    [("web", None), ("a-b-c", None), ("web", 0), ("x", 13), ("d41d8cd98f00b204e9800998ecf8427e", None)],
)
def test_names_parse_back(token_id: str, worker: int | None) -> None:
    assert parse_log_name(live_log_name(token_id, worker)) == LogName(token_id, worker, None)
    rotated_at = AT.replace(microsecond=123000)
    assert parse_log_name(rotated_log_name(token_id, AT, worker)) == LogName(token_id, worker, rotated_at)


def test_unsafe_token_ids_are_escaped_and_parse_back() -> None:
    for token_id in ("../../etc/passwd", "a|w=3", "100%", ".hidden"):
        name = live_log_name(token_id)
        assert "/" not in name and name.count("|") == 0
        assert parse_log_name(name) == LogName(token_id)


@pytest.mark.parametrize("name", [".server.lock", "incoming.tok=x.log.status", "failed.dst=a.log", "incoming.log"])
def test_other_files_are_not_incoming_logs(name: str) -> None:
    assert parse_log_name(name) is None


def test_rotated_name_of_local_time_is_utc() -> None:
    local = AT.astimezone(timezone(timedelta(hours=3)))
    assert rotated_log_name("t", local) == rotated_log_name("t", AT)


# --- AppendOnlyFile -------------------------------------------------------------------------------


def test_append_only_file_opens_lazily_and_counts(tmp_path: Path) -> None:
    file = AppendOnlyFile(tmp_path / "a.log")
    assert not file.path.exists()
    file.write(b'{"a":1}\n')
    file.write(b'{"b":2}\n{"c":3}\n', lines=2)
    assert file.path.read_bytes() == b'{"a":1}\n{"b":2}\n{"c":3}\n'
    assert (file.size, file.lines) == (24, 3)
    file.fsync()
    file.close(sync=True)
    file.fsync()  # closed: nothing to do, no error
    file.close()


def test_append_only_file_continues_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_bytes(b"old\n")
    file = AppendOnlyFile(path)
    file.write(b"new\n")
    file.close()
    assert path.read_bytes() == b"old\nnew\n"
    assert file.size == 8


def test_failed_write_leaves_no_partial_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = AppendOnlyFile(tmp_path / "a.log")
    file.write(b"first\n")
    real_write = os.write
    calls = 0

    def half_then_fail(fd: int, data: bytes | memoryview) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return real_write(fd, bytes(data)[:3])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_fail)
    with pytest.raises(OSError, match="No space"):
        file.write(b"second line\n")
    monkeypatch.undo()
    file.write(b"third\n")
    file.close()
    assert file.path.read_bytes() == b"first\nthird\n"


# --- IncomingLogs ---------------------------------------------------------------------------------


def test_rotation_renames_only_written_files(tmp_path: Path) -> None:
    logs = IncomingLogs(tmp_path)
    logs.file_for("web").write(b"1\n")
    logs.file_for("empty")
    rotated = logs.rotate(AT)
    assert rotated == [tmp_path / "incoming.tok=web-2024-03-05T07-08-09.123.log"]
    assert rotated[0].read_bytes() == b"1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [rotated[0].name]
    assert logs.rotate(AT) == []  # nothing written since


def test_writes_after_rotation_go_to_a_fresh_live_file(tmp_path: Path) -> None:
    logs = IncomingLogs(tmp_path, worker=1, fsync=True)
    file = logs.file_for("web")
    file.write(b"1\n")
    first = logs.rotate(AT)
    file.write(b"2\n")
    assert (tmp_path / "incoming.tok=web|w=1.log").read_bytes() == b"2\n"
    second = logs.close()
    assert [p.read_bytes() for p in first + second] == [b"1\n", b"2\n"]
    assert not (tmp_path / "incoming.tok=web|w=1.log").exists()


def test_rotation_never_overwrites_a_rotated_file(tmp_path: Path) -> None:
    logs = IncomingLogs(tmp_path)
    file = logs.file_for("web")
    file.write(b"1\n")
    first = logs.rotate(AT)
    file.write(b"2\n")
    second = logs.rotate(AT)  # same millisecond
    assert first != second
    assert parse_log_name(second[0].name).rotated_at == AT.replace(microsecond=124000)  # type: ignore[union-attr]
    assert sorted(p.read_bytes() for p in first + second) == [b"1\n", b"2\n"]


# --- rotation by another process ------------------------------------------------------------------


def test_rotate_incoming_logs_renames_non_empty_live_files(tmp_path: Path) -> None:
    (tmp_path / "incoming.tok=a.log").write_bytes(b"x\n")
    (tmp_path / "incoming.tok=b|w=0.log").write_bytes(b"y\n")
    (tmp_path / "incoming.tok=empty.log").write_bytes(b"")
    (tmp_path / "incoming.tok=old-2020-01-01T00-00-00.000.log").write_bytes(b"z\n")
    rotated = rotate_incoming_logs(tmp_path, AT)
    assert sorted(p.name for p in rotated) == [
        "incoming.tok=a-2024-03-05T07-08-09.123.log",
        "incoming.tok=b|w=0-2024-03-05T07-08-09.123.log",
    ]
    assert (tmp_path / "incoming.tok=empty.log").exists()
    assert (tmp_path / "incoming.tok=old-2020-01-01T00-00-00.000.log").read_bytes() == b"z\n"


def test_rotate_incoming_logs_of_a_missing_directory(tmp_path: Path) -> None:
    assert rotate_incoming_logs(tmp_path / "nope") == []


def test_rotate_incoming_logs_leaves_a_served_directory_alone(tmp_path: Path) -> None:
    live = tmp_path / "incoming.tok=a.log"
    live.write_bytes(b"x\n")
    # The lock is held by another process, as a running server would hold it.
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(tmp_path)], stdout=subprocess.PIPE, stdin=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        assert rotate_incoming_logs(tmp_path) == []
        assert live.exists()
        with pytest.raises(ServerLockHeld):
            ServerLock(tmp_path).acquire()
    finally:
        holder.communicate(b"\n", timeout=10)
    assert len(rotate_incoming_logs(tmp_path)) == 1


_HOLD_LOCK = """
import sys
from pathlib import Path
from eventspark.logs.incoming import ServerLock
lock = ServerLock(Path(sys.argv[1]))
lock.acquire()
print("locked", flush=True)
sys.stdin.readline()
lock.release()
"""


def test_server_lock_is_exclusive_within_a_process(tmp_path: Path) -> None:
    first = ServerLock(tmp_path)
    first.acquire()
    try:
        with pytest.raises(ServerLockHeld):
            ServerLock(tmp_path).acquire()
    finally:
        first.release()
    second = ServerLock(tmp_path)
    second.acquire()
    second.release()
