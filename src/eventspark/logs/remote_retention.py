"""Retention on the store of `log.remote` (docs/remote-logs.md, "Retention"): the shared
`archive/`, and this node's copies of its failed files.

* `<url>/archive/YYYY-MM-DD/<log>.gz`: `log.archive_retention_days` removes whole day folders
  whose last day is over (a folder's objects were all archived on its UTC day); `archive_max_gb`
  then removes objects oldest first (day, then the object's time, then name) until the folder is
  under the cap. One listing (`fs.find`, cached listings dropped first: executors and other nodes
  write there) and bulk deletes (`fs.rm(list)`: S3 deletes 1,000 keys a request). Temporaries
  (`.<name>.<random>.tmp`, `file://` stores) and objects written in the last `MIN_AGE_SEC` stay.
* `<url>/failed/<node>/failed.dst=<id>.log`: the copy goes once local retention removed the local
  file (`publish_failed` only ever adds). Names whose removal failed (a store down) are kept in
  `<log.path>/state/remote-retention.json` and removed at a later run.

Every node runs this, without the coordination lock of the passes: archive objects are written
once and never read by eventspark, a delete of a missing key is a no-op (S3) or skipped
(`file://`), and two nodes listing the same archive choose prefixes of the same oldest-first
order, so two runs at once remove no more than the larger of the two would alone. Taking the
lock would make retention wait behind (or skip for) every pass for nothing. `incoming/` is never
listed here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from eventspark.config.models import RemoteLogs
from eventspark.logs.remote import atomic_puts, remote_filesystem, remove_listed
from eventspark.logs.retention import DAY_SEC, GIB, MIN_AGE_SEC, Removed, RetentionResult
from eventspark.logs.store import failed_copy_location
from eventspark.ops.fallback import FAILED_DIR
from eventspark.ops.state import STATE_DIR

log = logging.getLogger(__name__)

REMOTE_ARCHIVE = "remote_archive"
REMOTE_FAILED = "remote_failed"
PENDING_FILE = "remote-retention.json"
"""Under `<log.path>/state/`: failed copies still to remove (`{"failed": [names]}`)."""
_DAY = re.compile(r"^\d{4}-\d\d-\d\d$")


@dataclass(frozen=True, slots=True)
class _Object:
    path: str
    day: str
    size: int
    time: float | None
    """When it was written, if the store says (S3 `LastModified`, a file's `mtime`, GCS `updated`)."""


# --- archive/ -------------------------------------------------------------------------------------


def remote_archive_retention(
    remote: RemoteLogs, days: float | None, max_gb: float | None, now: float
) -> RetentionResult:
    """Applies the archive policy to `<url>/archive/` (module docstring); store errors are raised."""
    fs, root = remote_filesystem(remote)
    folder = f"{root}/archive"
    fs.invalidate_cache(folder)  # other nodes and this pass's executors wrote since the last look
    objects, size, kept = _list_archive(fs, folder, now)
    result = RetentionResult(REMOTE_ARCHIVE, size, len(objects) + kept, kept=kept)
    chosen = _choose(objects, size, days, max_gb, now)
    if chosen:
        remove_listed(fs, [found.path for found, _why in chosen])
        for found, why in chosen:
            name = found.path[len(root) + 1 :]
            result.removed.append(Removed(name, found.size, 1, why))
            log.info("retention: removed %s from the store (%d bytes): %s", name, found.size, why)
        _remove_empty_days(fs, folder, {found.day for found, _why in chosen}, now)
        fs.invalidate_cache(folder)
    _summary(result, max_gb)
    return result


def _list_archive(fs: Any, folder: str, now: float) -> tuple[list[_Object], int, int]:
    """(removable objects, total bytes, objects kept): whatever is not `<day>/<name>` counts only."""
    try:
        listed = fs.find(folder, detail=True)
    except FileNotFoundError:
        return [], 0, 0
    objects, total, kept = [], 0, 0
    for path, info in listed.items():
        if info.get("type", "file") != "file":
            continue
        size = int(info.get("size") or 0)
        total += size
        day, _, name = path[len(folder) + 1 :].partition("/")
        moment = _object_time(info)
        fresh = moment is not None and now - moment < MIN_AGE_SEC
        if not _DAY.match(day) or not name or "/" in name or _temporary(name) or fresh:
            kept += 1
            continue
        objects.append(_Object(path, day, size, moment))
    return objects, total, kept


def _choose(
    objects: list[_Object], total: int, days: float | None, max_gb: float | None, now: float
) -> list[tuple[_Object, str]]:
    """Whole day folders older than `days`, then the oldest objects until `total` fits `max_gb`."""
    ordered = sorted(objects, key=lambda o: (o.day, o.time or 0.0, o.path))
    chosen: list[tuple[_Object, str]] = []
    if days is not None:
        cutoff = now - days * DAY_SEC
        chosen = [(o, f"older than {days:g} day(s)") for o in ordered if _day_end(o.day) <= cutoff]
    if max_gb is not None:
        left = total - sum(o.size for o, _why in chosen)
        for found in ordered[len(chosen) :]:  # the age rule took a prefix of the same order
            if left <= int(max_gb * GIB):
                break
            chosen.append((found, f"over the cap of {max_gb:g} GiB"))
            left -= found.size
    return chosen


def _day_end(day: str) -> float:
    """The epoch second a day folder's UTC day ends: nothing in it is younger."""
    start = datetime.combine(date.fromisoformat(day), datetime.min.time(), UTC)
    return (start + timedelta(days=1)).timestamp()


def _object_time(info: dict[str, Any]) -> float | None:
    for key in ("LastModified", "mtime", "updated", "last_modified"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None


def _temporary(name: str) -> bool:
    """An archive being written on a store without atomic puts (`store._temporary`)."""
    return name.startswith(".") and name.endswith(".tmp")


def _remove_empty_days(fs: Any, folder: str, days: set[str], now: float) -> None:
    """Folders exist only on filesystems (`file://`): emptied days go, but today's and yesterday's."""
    if atomic_puts(fs):
        return  # an object store has no folders, only key prefixes
    today = datetime.fromtimestamp(now, UTC).date()
    recent = {today.isoformat(), (today - timedelta(days=1)).isoformat()}
    for day in sorted(days - recent):
        with contextlib.suppress(OSError):
            fs.rmdir(f"{folder}/{day}")  # fails when not empty: kept


def _summary(result: RetentionResult, max_gb: float | None) -> None:
    if result.removed:
        log.info(
            "retention: the store's archive/: removed %d object(s), %d bytes; %d bytes left",
            result.removed_files,
            result.removed_bytes,
            result.size_after,
        )
    if max_gb is not None and result.size_after > max_gb * GIB:
        log.warning(
            "retention: the store's archive/ holds %d bytes, over its cap of %g GiB (%d objects written in "
            "the last %d s or not archives)",
            result.size_after,
            max_gb,
            result.kept,
            MIN_AGE_SEC,
        )


# --- failed copies --------------------------------------------------------------------------------


def remove_failed_copies(remote: RemoteLogs, log_path: Path, node: str, removed: list[Removed]) -> RetentionResult:
    """Removes this node's copies of the failed files local retention removed (and those a
    previous run could not); store errors keep the names for the next run and are raised."""
    names = sorted(set(_pending(log_path)) | {r.path.rpartition("/")[2] for r in removed if _failed_file(r.path)})
    result = RetentionResult(REMOTE_FAILED)
    if not names:
        return result
    _write_pending(log_path, names)  # before the deletes: a crash or a dead store retries them
    fs, root = remote_filesystem(remote)
    remove_listed(fs, [failed_copy_location(root, node, name) for name in names])
    _write_pending(log_path, [])
    for name in names:
        result.removed.append(Removed(f"{FAILED_DIR}/{node}/{name}", 0, 1, "removed from the local failed/"))
        log.info("retention: removed the store's copy failed/%s/%s: the local file was removed", node, name)
    return result


def _failed_file(relative: str) -> bool:
    """`failed/failed.dst=<id>.log` itself (not a replayed folder, which has no copy)."""
    folder, _, name = relative.rpartition("/")
    return folder == FAILED_DIR and name.startswith("failed.dst=") and name.endswith(".log")


def _pending(log_path: Path) -> list[str]:
    try:
        raw = orjson.loads((log_path / STATE_DIR / PENDING_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return []
    names = raw.get("failed") if isinstance(raw, dict) else None
    if not isinstance(names, list):
        return []
    # Parsed strictly: the names become keys to delete.
    return [n for n in names if isinstance(n, str) and "/" not in n and _failed_file(f"{FAILED_DIR}/{n}")]


def _write_pending(log_path: Path, names: list[str]) -> None:
    target = log_path / STATE_DIR / PENDING_FILE
    if not names:
        target.unlink(missing_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(orjson.dumps({"failed": names}))
    os.replace(tmp, target)
