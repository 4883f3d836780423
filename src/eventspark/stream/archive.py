"""The streaming archive: delivered events of a stream destination, kept like the batch archive.

Delivered lines are appended to `archive/streaming-archive.dst=<id>.log`. When the UTC day of
the last append is over, the file is renamed to `streaming-archive.dst=<id>-YYYY-MM-DDTHH-MM-SS.mmm.log`
(the rotation time) and gzipped into `archive/<day of its events>/` by `logs.archive.archive_log`,
on a background thread so that delivery never waits for compression. A rotated file left
uncompressed by a crash is compressed when the archive is next opened.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from datetime import UTC, date, datetime
from pathlib import Path

from eventspark.logs.archive import archive_log
from eventspark.logs.status import sync_dir

log = logging.getLogger(__name__)

_STAMP = "%Y-%m-%dT%H-%M-%S"


def live_archive_name(dest_id: str) -> str:
    return f"streaming-archive.dst={dest_id}.log"


def rotated_archive_name(dest_id: str, at: datetime) -> str:
    return f"streaming-archive.dst={dest_id}-{at.strftime(_STAMP)}.{at.microsecond // 1000:03d}.log"


class StreamArchive:
    """The archive of one stream destination; used by its worker thread only."""

    def __init__(self, archive_dir: Path, dest_id: str) -> None:
        self.archive_dir = archive_dir
        self.dest_id = dest_id
        self.path = archive_dir / live_archive_name(dest_id)
        prefix = re.escape(f"streaming-archive.dst={dest_id}-")
        self._rotated = re.compile(rf"^{prefix}\d{{4}}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d{{3}}\.log$")
        self._fd: int | None = None
        self._day: date | None = None
        self._compressing: threading.Thread | None = None

    def open(self) -> None:
        """Compresses rotated files a crash left behind and rotates yesterday's live file."""
        self.archive_dir.mkdir(parents=True, exist_ok=True)
        leftovers = sorted(p for p in self.archive_dir.iterdir() if self._rotated.match(p.name))
        if leftovers:
            self._compress(leftovers)
        if self.path.exists():
            self._day = datetime.fromtimestamp(self.path.stat().st_mtime, UTC).date()
        self.rotate_if_due()

    def append(self, lines: list[bytes], now: datetime | None = None, sync: bool = False) -> None:
        """Appends event lines (without newlines) with one write, whole or not at all (a full disk
        leaves no torn line); with `sync` (`server.fsync`), on disk before returning."""
        if not lines:
            return
        self.rotate_if_due(now)
        created = False
        if self._fd is None:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
            created = not self.path.exists()
            self._fd = os.open(self.path, flags, 0o644)
        append_whole(self._fd, b"\n".join(lines) + b"\n", sync)
        if sync and created:  # the new file's name too
            sync_dir(self.archive_dir)
        self._day = (now or datetime.now(UTC)).date()

    def rotate_if_due(self, now: datetime | None = None) -> Path | None:
        """Rotates the live file when its last append was on an earlier UTC day than `now`."""
        now = now or datetime.now(UTC)
        if self._day is None or self._day >= now.date():
            return None
        day, self._day = self._day, None
        self._close()
        if not self.path.exists():
            return None
        target = self.archive_dir / rotated_archive_name(self.dest_id, now)
        os.rename(self.path, target)
        self._compress([target], datetime(day.year, day.month, day.day, tzinfo=UTC))
        return target

    def _compress(self, paths: list[Path], day: datetime | None = None) -> None:
        self.wait()  # one compression at a time keeps the order of files in a day folder simple
        thread = threading.Thread(
            target=_compress_all, args=(paths, self.archive_dir, day), name="eventspark-archive", daemon=True
        )
        thread.start()
        self._compressing = thread

    def wait(self) -> None:
        """Waits for a compression in progress (tests, shutdown)."""
        if self._compressing is not None:
            self._compressing.join()
            self._compressing = None

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        self._close()
        self.wait()


def _compress_all(paths: list[Path], archive_dir: Path, day: datetime | None) -> None:
    for path in paths:
        try:
            when = day or datetime.fromtimestamp(path.stat().st_mtime, UTC)
            archive_log(path, archive_dir, when)
        except OSError:
            log.exception("archiving %s failed; retried when the archive is next opened", path)


def append_whole(fd: int, data: bytes, sync: bool) -> int:
    """Appends `data` to `fd` (opened with O_APPEND) whole or not at all: a write that fails (a full
    disk) is cut back, so no torn line is left; with `sync`, on disk before returning. Returns the
    file's size before the append."""
    start = os.fstat(fd).st_size
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    except BaseException:
        with contextlib.suppress(OSError):  # the original error is the one worth reporting
            os.ftruncate(fd, start)
        raise
    return start
