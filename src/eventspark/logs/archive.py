"""Archiving processed logs: `archive/YYYY-MM-DD/<rotated log>.gz`, then the log and its status go."""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

from isal import igzip

from eventspark.logs.status import status_path, sync_dir

COPY_CHUNK = 1024 * 1024


def archive_log(log: Path, archive_dir: Path, now: datetime | None = None) -> Path:
    """Gzips `log` into the day folder of `now` (UTC) and removes the log and its status file.

    Level-1 compression with ISA-L (`isal.igzip`, plain gzip output): the archive is written
    during the pass, and this is about 3x faster than zlib's level 1 (itself several times faster
    than the default) for no more bytes on JSON lines. The archive is written under a
    temporary name and renamed, so a crash never leaves a
    truncated `.gz` that looks complete; the log is deleted only after the archive and its name
    are fsynced, so not even a power loss leaves neither.
    """
    day = (now or datetime.now(UTC)).strftime("%Y-%m-%d")
    folder = archive_dir / day
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (log.name + ".gz")
    tmp = folder / (log.name + ".gz.tmp")
    with tmp.open("wb") as raw:
        with log.open("rb") as src, igzip.open(raw, "wb", compresslevel=1) as dst:
            shutil.copyfileobj(src, dst, COPY_CHUNK)
        raw.flush()
        os.fsync(raw.fileno())  # the archive is on disk before the log goes
    os.replace(tmp, target)
    sync_dir(folder)
    log.unlink()
    status_path(log).unlink(missing_ok=True)
    return target
