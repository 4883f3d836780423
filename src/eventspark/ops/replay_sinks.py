"""Where a replay writes its events: a batch destination's replay log or a stream destination's queue.

Both are durable when `finish` returns (fsynced). `abort` after an error says what was handed over
anyway: nothing for a replay log (its temporary file is removed, the batch job never saw it), the
events already appended for a queue (they will be delivered).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from eventspark.logs.replay import PREFIX, replay_log_name
from eventspark.logs.status import sync_dir

QUEUE_WRITER = "replay"
"""The queue writer name of replays (the collector's writers are `main` and `w<n>`)."""
QUEUE_BUSY_SECONDS = 10.0
STALE_TMP_SECONDS = 3600.0
"""A replay log's temporary file untouched this long belongs to a replay that crashed."""


class SinkBusy(Exception):
    """Another replay writes the same queue and did not finish within `QUEUE_BUSY_SECONDS`."""


class Sink:
    """One destination's side of a replay."""

    events = 0

    def write(self, data: bytes, lines: int) -> None:
        raise NotImplementedError

    def finish(self) -> dict[str, Any]:
        """Makes what was written durable and visible to the pipeline; the record's entry."""
        raise NotImplementedError

    def abort(self) -> dict[str, Any]:
        """Gives up after an error; the record's entry for what was handed over anyway."""
        raise NotImplementedError


class ReplayLog(Sink):
    """A batch destination's replay log: a temporary file renamed into place once fsynced."""

    def __init__(self, incoming: Path, dest_id: str) -> None:
        incoming.mkdir(parents=True, exist_ok=True)
        remove_stale_tmp(incoming)
        self.name = replay_log_name(dest_id)
        self.target = incoming / self.name
        self.tmp = incoming / f".{self.name}.tmp"  # not a name the batch job reads
        self.file = self.tmp.open("wb")

    def write(self, data: bytes, lines: int) -> None:
        self.file.write(data)
        self.events += lines

    def finish(self) -> dict[str, Any]:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        if not self.events:
            self.tmp.unlink()
            return {"events": 0}
        os.rename(self.tmp, self.target)
        sync_dir(self.target.parent)
        return {"events": self.events, "replay_log": self.name}

    def abort(self) -> dict[str, Any]:
        self.file.close()
        if self.tmp.exists():
            self.tmp.unlink()
            return {}  # the batch job never saw it: nothing was handed over
        return {"events": self.events, "replay_log": self.name}  # finished before the error


def remove_stale_tmp(incoming: Path) -> None:
    """Removes the temporary files of replays that crashed while writing them: copies of events
    that are still in the replayed file, never seen by the batch job."""
    limit = time.time() - STALE_TMP_SECONDS
    for path in incoming.glob(f".{PREFIX}*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mtime < limit:
                path.unlink()


class QueueSink(Sink):
    """A stream destination's queue, written under the writer name `replay`."""

    def __init__(self, log_path: Path, dest_id: str) -> None:
        from eventspark.stream.queue import QueueWriter, queue_dir

        self.queue = queue_dir(log_path, dest_id)
        self.writer = QueueWriter(self.queue)
        self.writer.writer = QUEUE_WRITER  # its own segments and writer lock (module docstring)

    def write(self, data: bytes, lines: int) -> None:
        from eventspark.stream.queue import QueueBusy

        deadline = time.monotonic() + QUEUE_BUSY_SECONDS
        while True:
            try:
                self.writer.append(data, lines)
                break
            except QueueBusy as exc:  # another replay writes this queue right now
                if time.monotonic() >= deadline:
                    raise SinkBusy(str(exc)) from None
                time.sleep(0.1)
        self.events += lines

    def finish(self) -> dict[str, Any]:
        self.writer.close(sync=True)
        return {"events": self.events, "queue": self.queue.name}

    def abort(self) -> dict[str, Any]:
        # What was appended is in the queue and will be delivered: the record says how much.
        self.writer.close(sync=True)
        return {"events": self.events, "queue": self.queue.name, "partial": True} if self.events else {}


def open_sink(log_path: Path, dest_id: str, mode: str) -> Sink:
    return ReplayLog(log_path / "incoming", dest_id) if mode == "batch" else QueueSink(log_path, dest_id)


def write_all(sinks: list[Sink], batch: list[bytes]) -> None:
    if batch:
        data = b"".join(batch)
        for sink in sinks:
            sink.write(data, len(batch))
