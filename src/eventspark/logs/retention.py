"""Retention of `archive/` and `failed/` under `log.path` (docs/reliability.md, "Retention").

`log.archive_retention_days` / `log.archive_max_gb` and `log.failed_retention_days` /
`log.failed_max_gb`; unset, everything is kept (as before these keys). One call per directory
(`archive_retention`, `failed_retention`) removes what the policy says, the oldest first, logs each
removal (file, size, why) and a summary, and returns what it removed. `Retention` runs both in
`eventspark serve`: on a timer thread of the serving process (`PERIOD_SEC`, and once at start),
and after every batch pass (the uploader wakes the thread: the pass never waits for it).

What can go, what never does:

* `archive/YYYY-MM-DD/<log>.gz` (`logs.archive`, and the stream archive's compressed days): whole
  files; the age is the file's mtime (when it was archived). A `*.tmp` (an archive being written)
  and the top-level `streaming-archive.dst=<id>*.log` files (the stream archive's live file, and
  rotated ones waiting for compression) are never removed, but count in the size. A day folder left
  empty goes, unless it is today's or yesterday's (UTC), where the archivers write.
* `failed/failed.dst=<id>.log` (`logs.failed`): appended and never rotated, so a file goes whole;
  its age is the time since its last modification. Every appender holds the append lock of
  `failed/` (`logs.failed.appending`): batch passes while they append and write their statuses,
  the stream worker while it writes its mark and appends (`stream.worker`), replays while they
  move a file away. The removal of one file holds it too (`quiet_failed_log`, only for that file:
  never across the walk), which first cuts off what a dead pass appended (its groups stay parked:
  the next pass appends them to a new file); then it removes the file with one `unlink`, when it
  is still the inode scanned and not longer (else it was appended to: decided again next run).
  A crash leaves the file whole or gone. A file whose stream queue has a `recording.json` mark is
  kept: its worker appended lines not acknowledged yet, and after a crash the mark cuts the file
  of its inode back, which must never be a new file reusing the inode of a removed one.
  The node's batch lock is not taken: a pass appends failed lines only under the append lock.
* `failed/replayed/<replay id>/` (`ops.replay`): a replayed failed file with its `replay.json`,
  removed as one; its age is the replay's time (`at`). A replay still running (its process holds
  the flock of its folder: `ops.fallback.replay_is_running`) is never touched, nor the archive
  file or replayed folder it reads.
* `failed/pending/` (spools parked and journals of batch passes) is never touched; it counts.

Nothing modified less than `MIN_AGE_SEC` ago is removed by either rule. The size cap removes
replayed folders first (their events were replayed), then failed files, each by age; when what
may not be removed alone exceeds the cap, a warning says so. Sizes are in GiB (2^30 bytes).
Each run records the sizes it measured in `<log.path>/state/retention.json` (`read_usage`).

With `log.remote`, `apply_retention` then applies the archive keys to the store's `archive/` and
removes this node's copies of the failed files it removed (`logs.remote_retention`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from eventspark.config.models import LogConfig
from eventspark.logconfig import in_job
from eventspark.logs.failed import PENDING_DIR, quiet_failed_log
from eventspark.logs.status import sync_dir
from eventspark.ops.fallback import (
    FAILED_DIR,
    RECORD_FILE,
    REPLAYED_DIR,
    failed_destination,
    read_record,
    replay_is_running,
)
from eventspark.ops.state import STATE_DIR
from eventspark.stream.queue import RECORDING_FILE, queue_dir

log = logging.getLogger(__name__)

ARCHIVE_DIR = "archive"
USAGE_FILE = "retention.json"
GIB = 1024**3
DAY_SEC = 86400.0
PERIOD_SEC = 300.0
"""How often the serving process applies the policy without a batch pass (stream-only nodes)."""
MIN_AGE_SEC = 60.0
"""Nothing modified more recently than this is removed (a file being written, a replay starting)."""
_DAY = re.compile(r"^\d{4}-\d\d-\d\d$")


@dataclass(frozen=True, slots=True)
class Removed:
    """One file (or replayed folder) removed: its path relative to `log.path`, bytes, files, why."""

    path: str
    size: int
    files: int
    reason: str


@dataclass(slots=True)
class RetentionResult:
    """What one directory's run found and removed."""

    directory: str
    """`archive` or `failed`; with `log.remote`, also `remote_archive` and `remote_failed`."""
    size_before: int = 0
    files_before: int = 0
    removed: list[Removed] = field(default_factory=list)
    kept: int = 0
    """Entries that may not be removed now (live, being written, pending, a running replay, too recent)."""

    @property
    def removed_files(self) -> int:
        return sum(r.files for r in self.removed)

    @property
    def removed_bytes(self) -> int:
        return sum(r.size for r in self.removed)

    @property
    def size_after(self) -> int:
        return self.size_before - self.removed_bytes

    def usage(self) -> dict[str, int]:
        return {
            "bytes": self.size_after,
            "files": self.files_before - self.removed_files,
            "removed_files": self.removed_files,
            "removed_bytes": self.removed_bytes,
        }


@dataclass(slots=True)
class _Entry:
    """Something that can be removed as a unit."""

    path: Path
    size: int
    files: int
    time: float
    """Epoch seconds its age counts from."""
    kind: str
    """`archive`, `replayed` or `failed` (the size cap's order: replayed before failed)."""
    inode: int = 0
    """A failed file's, when scanned: another one under its name later was not the one chosen."""


@dataclass(slots=True)
class _Scan:
    entries: list[_Entry] = field(default_factory=list)
    size: int = 0
    files: int = 0
    kept: int = 0


# --- the policy -----------------------------------------------------------------------------------


def _select(
    entries: list[_Entry], total: int, days: float | None, max_gb: float | None, now: float
) -> list[tuple[_Entry, str]]:
    """The entries to remove with the reason: those older than `days`, then the oldest (replayed
    folders first) until the total is at most `max_gb`."""
    ordered = sorted(entries, key=lambda e: (e.kind != "replayed", e.time, str(e.path)))
    chosen: list[tuple[_Entry, str]] = []
    if days is not None:
        chosen = [(e, f"older than {days:g} day(s)") for e in ordered if now - e.time > days * DAY_SEC]
    if max_gb is not None:
        limit = int(max_gb * GIB)
        left = total - sum(e.size for e, _why in chosen)
        taken = {id(e) for e, _why in chosen}
        for entry in ordered:
            if left <= limit:
                break
            if id(entry) not in taken:
                chosen.append((entry, f"over the cap of {max_gb:g} GiB"))
                left -= entry.size
    return chosen


def _recent(moment: float, now: float) -> bool:
    """Modified less than `MIN_AGE_SEC` ago: being written, or a replay making its folder."""
    return now - moment < MIN_AGE_SEC


def _summary(result: RetentionResult, max_gb: float | None) -> None:
    if result.removed:
        log.info(
            "retention: %s/: removed %d file(s), %d bytes; %d bytes left",
            result.directory,
            result.removed_files,
            result.removed_bytes,
            result.size_after,
        )
    if max_gb is not None and result.size_after > max_gb * GIB:
        log.warning(
            "retention: %s/ holds %d bytes, over its cap of %g GiB: what is left may not be removed now "
            "(%d entries live, being written, pending or touched in the last %d s)",
            result.directory,
            result.size_after,
            max_gb,
            result.kept,
            MIN_AGE_SEC,
        )


# --- archive/ -------------------------------------------------------------------------------------


def archive_retention(
    log_path: Path, days: float | None, max_gb: float | None, now: float | None = None
) -> RetentionResult:
    """Applies the policy to `archive/` (module docstring); only measures when both are None."""
    now = time.time() if now is None else now
    root = log_path / ARCHIVE_DIR
    scan = _scan_archive(root, _busy_sources(log_path), now)
    result = RetentionResult(ARCHIVE_DIR, scan.size, scan.files, kept=scan.kept)
    for entry, why in _select(scan.entries, scan.size, days, max_gb, now):
        try:
            entry.path.unlink()
        except FileNotFoundError:
            continue  # replayed or removed meanwhile
        except OSError as exc:
            log.warning("retention: cannot remove %s: %s", entry.path, exc)
            continue
        _removed(result, log_path, entry, why)
    _remove_empty_days(root, now)
    _summary(result, max_gb)
    return result


def _scan_archive(root: Path, busy: set[Path], now: float) -> _Scan:
    scan = _Scan()
    for item in _scandir(root):
        if item.is_dir(follow_symlinks=False):
            if _DAY.match(item.name):
                _scan_day(Path(item.path), busy, now, scan)
            continue
        scan.size, scan.files, scan.kept = scan.size + _size(item), scan.files + 1, scan.kept + 1
    return scan


def _scan_day(folder: Path, busy: set[Path], now: float, scan: _Scan) -> None:
    for item in _scandir(folder):
        stat = _stat(item)
        if stat is None or not item.is_file(follow_symlinks=False):
            continue
        scan.size, scan.files = scan.size + stat.st_size, scan.files + 1
        path = Path(item.path)
        if item.name.endswith(".tmp") or path in busy or _recent(stat.st_mtime, now):
            scan.kept += 1
            continue
        scan.entries.append(_Entry(path, stat.st_size, 1, stat.st_mtime, ARCHIVE_DIR))


def _remove_empty_days(root: Path, now: float) -> None:
    """Empty day folders go, but today's and yesterday's: the archivers create them before writing."""
    today = datetime.fromtimestamp(now, UTC).date()
    recent = {today.isoformat(), (today - timedelta(days=1)).isoformat()}
    for item in _scandir(root):
        if item.is_dir(follow_symlinks=False) and _DAY.match(item.name) and item.name not in recent:
            try:
                os.rmdir(item.path)
                log.info("retention: removed the empty folder %s/%s", ARCHIVE_DIR, item.name)
            except OSError:
                pass  # not empty


# --- failed/ --------------------------------------------------------------------------------------


def failed_retention(
    log_path: Path, days: float | None, max_gb: float | None, now: float | None = None
) -> RetentionResult:
    """Applies the policy to `failed/` (module docstring); only measures when both are None."""
    now = time.time() if now is None else now
    root = log_path / FAILED_DIR
    scan = _scan_failed(root, _busy_sources(log_path), now)
    result = RetentionResult(FAILED_DIR, scan.size, scan.files, kept=scan.kept)
    for entry, why in _select(scan.entries, scan.size, days, max_gb, now):
        _remove_failed_entry(result, log_path, entry, why)
    _summary(result, max_gb)
    return result


def _remove_failed_entry(result: RetentionResult, log_path: Path, entry: _Entry, why: str) -> None:
    try:
        if entry.kind == "replayed":
            _remove_replayed(entry.path)
        elif not _remove_failed_file(log_path, entry):
            result.kept += 1
            return
    except FileNotFoundError:
        return  # replayed meanwhile
    except OSError as exc:
        log.warning("retention: cannot remove %s: %s", entry.path, exc)
        return
    _removed(result, log_path, entry, why)


def _remove_failed_file(log_path: Path, entry: _Entry) -> bool:
    """Removes a failed file under its append lock (module docstring), held for this file only;
    False, leaving it as it is, when it must stay for now. `entry.size` becomes what was removed."""
    dest_id = failed_destination(entry.path.name) or ""
    # No append is in flight while this holds (batch passes, the stream worker, replays all take
    # it), and what a dead pass appended is cut off first: its journal cannot outlive the file
    # and cut a new one that reuses the inode (its groups stay parked for the next pass).
    with quiet_failed_log(entry.path.parent, dest_id):
        if _recording(log_path, dest_id):
            # Lines appended by the stream worker and not acknowledged yet: its mark names this
            # inode and would cut a new file that reuses it after a crash. Kept until the mark goes.
            log.info("retention: %s has stream lines not acknowledged yet: kept for now", entry.path.name)
            return False
        stat = entry.path.stat()
        if stat.st_ino != entry.inode or stat.st_size > entry.size:
            return False  # appended to, or replaced, since the scan: decided again next run
        # Same file, not longer: what the policy chose, less a dead pass's lines. One unlink: a
        # crash leaves the file whole or gone, never half.
        entry.path.unlink()
        sync_dir(entry.path.parent)
    entry.size = stat.st_size
    return True


def _scan_failed(root: Path, busy: set[Path], now: float) -> _Scan:
    scan = _Scan()
    for item in _scandir(root):
        path = Path(item.path)
        if item.is_dir(follow_symlinks=False):
            if item.name == REPLAYED_DIR:
                _scan_replayed(path, busy, now, scan)
            else:  # pending/ (parked spools and journals of the batch passes): counted only
                size, files = _tree_size(path)
                scan.size, scan.files, scan.kept = (
                    scan.size + size,
                    scan.files + files,
                    scan.kept + (item.name == PENDING_DIR),
                )
            continue
        stat = _stat(item)
        if stat is None:
            continue
        scan.size, scan.files = scan.size + stat.st_size, scan.files + 1
        dest_id = failed_destination(item.name)
        if dest_id is None or not item.is_file(follow_symlinks=False):
            continue  # not a failed file (a lock, a temporary file): left alone
        # A stream mark: checked again under the lock; skipped here so that the cap picks others.
        if _recording(root.parent, dest_id) or _recent(stat.st_mtime, now):
            scan.kept += 1
            continue
        scan.entries.append(_Entry(path, stat.st_size, 1, stat.st_mtime, "failed", stat.st_ino))
    return scan


def _recording(log_path: Path, dest_id: str) -> bool:
    """Whether the stream worker of the destination has appended lines to its failed log that its
    queue has not acknowledged yet, to cut back after a crash (`stream.queue.QueueReader.mark_recording`:
    written and replaced only under the append lock, removed after the acknowledgement)."""
    return (queue_dir(log_path, dest_id) / RECORDING_FILE).exists()


def _scan_replayed(root: Path, busy: set[Path], now: float, scan: _Scan) -> None:
    for item in _scandir(root):
        if not item.is_dir(follow_symlinks=False):
            scan.size, scan.files = scan.size + _size(item), scan.files + 1
            continue
        folder = Path(item.path)
        size, files = _tree_size(folder)
        scan.size, scan.files = scan.size + size, scan.files + files
        record = read_record(folder)
        # Without a record: a replay that has just made its folder (or was cut short making it).
        started = _record_time(record) if record is not None else _mtime(folder)
        if folder in busy or _recent(started, now):
            scan.kept += 1
            continue
        scan.entries.append(_Entry(folder, size, files, started, "replayed"))


def _record_time(record: dict[str, Any]) -> float:
    try:
        return datetime.fromisoformat(str(record.get("at"))).timestamp()
    except ValueError:
        return 0.0  # an unreadable time: the oldest


def _remove_replayed(folder: Path) -> None:
    """The record last: a crash in between leaves a folder the next run still dates and removes."""
    for item in _scandir(folder):
        if item.name != RECORD_FILE:
            shutil.rmtree(item.path) if item.is_dir(follow_symlinks=False) else os.unlink(item.path)
    (folder / RECORD_FILE).unlink(missing_ok=True)
    folder.rmdir()


# --- shared ---------------------------------------------------------------------------------------


def _busy_sources(log_path: Path) -> set[Path]:
    """What running replays read: their archived source or replayed folder (`ops.replay` records)."""
    busy: set[Path] = set()
    root = log_path / FAILED_DIR / REPLAYED_DIR
    for item in _scandir(root):
        folder = Path(item.path)
        record = read_record(folder) if item.is_dir(follow_symlinks=False) else None
        if record is None or record.get("state") != "started" or not replay_is_running(folder):
            continue  # finished, or the process that ran it died: nothing reads it
        busy.add(folder)
        source = record.get("source")
        if isinstance(source, str) and ".." not in source.split("/"):
            busy.add(log_path / source)
            if source.startswith(f"{FAILED_DIR}/{REPLAYED_DIR}/"):
                busy.add((log_path / source).parent)
    return busy


def _removed(result: RetentionResult, log_path: Path, entry: _Entry, why: str) -> None:
    name = entry.path.relative_to(log_path).as_posix()
    result.removed.append(Removed(name, entry.size, entry.files, why))
    log.info("retention: removed %s (%d bytes%s): %s", name, entry.size, _files_note(entry.files), why)


def _files_note(files: int) -> str:
    return f", {files} files" if files > 1 else ""


def _scandir(folder: Path) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as items:
            yield from sorted(items, key=lambda item: item.name)
    except (FileNotFoundError, NotADirectoryError):
        return


def _stat(item: os.DirEntry[str]) -> os.stat_result | None:
    """None for an entry removed since the listing (an archive renamed, a replay's move)."""
    try:
        return item.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None


def _size(item: os.DirEntry[str]) -> int:
    stat = _stat(item)
    return 0 if stat is None else stat.st_size


def _tree_size(folder: Path) -> tuple[int, int]:
    """(bytes, files) under a folder."""
    size = files = 0
    for item in _scandir(folder):
        if item.is_dir(follow_symlinks=False):
            more, count = _tree_size(Path(item.path))
            size, files = size + more, files + count
        else:
            size, files = size + _size(item), files + 1
    return size, files


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


# --- in `serve` -----------------------------------------------------------------------------------


def apply_retention(log: LogConfig, now: float | None = None, node: str | None = None) -> list[RetentionResult]:
    """Both directories' policies (and, with `log.remote`, the store's archive and this node's
    failed copies: `remote_retention`), their metrics, and the sizes recorded for `read_usage`.
    `node`: this node's name in the store (`logs.upload.node_name`; unset, the host name)."""
    from eventspark.ops.metrics import pipeline_metrics

    log_path = Path(log.path)
    results = [
        archive_retention(log_path, log.archive_retention_days, log.archive_max_gb, now),
        failed_retention(log_path, log.failed_retention_days, log.failed_max_gb, now),
    ]
    if log.remote is not None:
        results += _remote_retention(log, results[1], time.time() if now is None else now, node)
    metrics = pipeline_metrics()
    for result in results:
        metrics.retention_removed(result.directory, result.removed_files, result.removed_bytes)
    _write_usage(log_path, results, time.time() if now is None else now)
    return results


def _remote_retention(log: LogConfig, failed: RetentionResult, now: float, node: str | None) -> list[RetentionResult]:
    """The store's part, each half on its own: a store down is logged and retried next run, and
    never stops the local policy (applied first)."""
    from eventspark.logs.remote_retention import remote_archive_retention, remove_failed_copies

    assert log.remote is not None
    results = []
    try:
        results.append(remote_archive_retention(log.remote, log.archive_retention_days, log.archive_max_gb, now))
    except Exception as exc:  # fsspec raises the store's own errors
        _store_warning("the store's archive/", exc)
    try:
        name = node or socket.gethostname()
        results.append(remove_failed_copies(log.remote, Path(log.path), name, failed.removed))
    except Exception as exc:
        _store_warning("the store's failed copies", exc)
    return results


def _store_warning(what: str, exc: Exception) -> None:
    """A store error names the part left for the next run."""
    log.warning("retention: %s not trimmed (next run): %s: %s", what, type(exc).__name__, exc)


def _write_usage(log_path: Path, results: list[RetentionResult], now: float) -> None:
    target = log_path / STATE_DIR / USAGE_FILE
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        tmp.write_bytes(orjson.dumps({"at": now, **{r.directory: r.usage() for r in results}}))
        os.replace(tmp, target)
    except OSError as exc:  # a full disk: the next run writes it
        log.warning("retention: cannot record the sizes in %s: %s", target, exc)


def read_usage(log_path: Path) -> dict[str, Any] | None:
    """The sizes of `archive/` and `failed/` the last run measured (`at`: when); None if none ran."""
    try:
        raw = orjson.loads((log_path / STATE_DIR / USAGE_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return raw if isinstance(raw, dict) else None


_running: dict[Path, Retention] = {}
_running_lock = threading.Lock()


class Retention:
    """The policy of one `log.path` on a daemon thread: at start, every `period` seconds, and
    when `wake` is called (after a batch pass). Constructing it does no I/O."""

    def __init__(self, log: LogConfig, period: float = PERIOD_SEC, node: str | None = None) -> None:
        self.log = log
        self.node = node
        """This node's name on the store (`log.remote`): its failed copies are `failed/<node>/`."""
        self.period = period
        self.key = Path(log.path).absolute()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="eventspark-retention", daemon=True)
        self._thread.start()
        with _running_lock:
            _running[self.key] = self

    def stop(self, timeout: float = 10) -> None:
        with _running_lock:
            if _running.get(self.key) is self:
                del _running[self.key]
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            self.run_once()
            self._wake.wait(self.period)

    @in_job("retention")
    def run_once(self) -> list[RetentionResult]:
        try:
            return apply_retention(self.log, node=self.node)
        except Exception:  # a bug or an unreadable folder must not end the thread
            log.exception("retention: applying the policy failed; trying again next period")
            return []


def after_pass(log_path: Path) -> None:
    """Wakes the retention thread of `log_path` in this process, if any (the uploader, after a pass)."""
    with _running_lock:
        found = _running.get(log_path.absolute())
    if found is not None:
        found.wake()
