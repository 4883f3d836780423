"""An fsync that fails while a file is closed (rotation) or a queue segment is ended (roll-over).

Requests whose lines were in that file still wait for the group commit, which fsyncs the files'
current descriptors only: they must get the error (503), not the success of a later fsync of
another descriptor (issue 18; docs/reliability.md, collector section).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from eventspark.collector.group_commit import GroupCommit
from eventspark.collector.multiplex import LineFile
from eventspark.logs.incoming import AppendOnlyFile, IncomingLogs
from eventspark.stream.queue import QueueReader, QueueWriter


def broken_fsync(fd: int) -> None:
    raise OSError(5, "Input/output error")


def group_commit(file: LineFile) -> str:
    """What two group commits of `file` answer, one after the other: "ok" or the error."""

    async def main() -> str:
        commit = GroupCommit()
        commit.start()
        answers = []
        try:
            for _ in range(2):
                try:
                    await commit.sync([file])
                    answers.append("ok")
                except OSError as exc:
                    answers.append(exc.strerror or "")
        finally:
            commit.stop()
        return ", ".join(answers)

    return asyncio.run(main())


def test_a_rotation_whose_fsync_failed_fails_the_waiting_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs = IncomingLogs(tmp_path, fsync=True)
    file: AppendOnlyFile = logs.file_for("tok")
    file.write(b'{"n": 1}\n')  # its request now waits for the group commit
    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        logs.rotate()
    monkeypatch.undo()
    assert group_commit(file) == "Input/output error, ok"  # once: later writes are synced again
    file.write(b'{"n": 2}\n')  # the file stayed live: the next rotation takes both lines
    [rotated] = logs.rotate()
    assert rotated.read_bytes() == b'{"n": 1}\n{"n": 2}\n'


def test_a_segment_whose_fsync_failed_at_its_end_fails_the_waiting_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = QueueWriter(tmp_path / "queue", segment_bytes=64)
    writer.append(b'{"n": 1, "pad": "' + b"x" * 64 + b'"}\n')
    writer.fsync()  # server.fsync: the group commit has run once
    writer.append(b'{"n": 2}\n')  # rolls over: the first segment is fsynced as it ends
    writer.append(b'{"n": 3, "pad": "' + b"x" * 64 + b'"}\n')  # waits for the group commit
    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        writer.append(b'{"n": 4}\n')  # the segment holding n=3 ends; its fsync fails
    monkeypatch.undo()
    assert group_commit(writer) == "Input/output error, ok"
    writer.append(b'{"n": 5}\n')
    writer.close()
    reader = QueueReader(tmp_path / "queue")
    reader.open()
    assert [record[:7] for record in reader.read(100)] == [b'{"n": 1', b'{"n": 2', b'{"n": 3', b'{"n": 5']
