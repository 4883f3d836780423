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
  its age is the time since its last modification. Its writers never run during its removal
  (`_retire_failed`): batch passes append under the node's batch lock (`batch.process`), which the
  removal holds (a pass of another process running: failed files wait for the next run); the
  stream worker writes into the file only through a descriptor it opens after writing its queue's
  `recording.json` mark, and removes the mark after closing it and acknowledging the batch
  (`stream.queue`, `stream.worker`). So the file is renamed aside
  (`failed/.retiring/<size>/<name>`) only while no mark exists, and removed only if still no mark
  exists and it did not grow; otherwise it is linked back unchanged (same inode: the journals and
  marks that name it stay right). A crash in between: the next run puts it back and decides again.
* `failed/replayed/<replay id>/` (`ops.replay`): a replayed failed file with its `replay.json`,
  removed as one; its age is the replay's time (`at`). A replay still running (its process holds
  the flock of its folder: `ops.fallback.replay_is_running`) is never touched, nor the archive
  file or replayed folder it reads.
* `failed/pending/` (spools parked by a batch pass in progress) is never touched; it counts. Nor is
  a failed file whose destination has a journal there (a pass cut short, to recover), nor one whose
  stream queue has a recording mark (an append in progress, or to cut back after a crash).

Nothing modified less than `MIN_AGE_SEC` ago is removed by either rule. The size cap removes
replayed folders first (their events were replayed), then failed files, each by age; when what
may not be removed alone exceeds the cap, a warning says so. Sizes are in GiB (2^30 bytes).
Each run records the sizes it measured in `<log.path>/state/retention.json` (`read_usage`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
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
from eventspark.logs.failed import PENDING_DIR, journal_path
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
RETIRING_DIR = ".retiring"
USAGE_FILE = "retention.json"
GIB = 1024**3
DAY_SEC = 86400.0
PERIOD_SEC = 300.0
"""How often the serving process applies the policy without a batch pass (stream-only nodes)."""
MIN_AGE_SEC = 60.0
"""Nothing modified more recently than this is removed (a file being written, a replay starting)."""
COPY_CHUNK = 1024 * 1024
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
    """`archive` or `failed`."""
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
    with _no_batch_pass(log_path, days is not None or max_gb is not None) as quiet:
        finish_retiring(root)
        scan = _scan_failed(root, _busy_sources(log_path), now)
        if not quiet:  # a pass of another process may be appending: failed files wait
            scan.kept += sum(entry.kind == "failed" for entry in scan.entries)
            scan.entries = [entry for entry in scan.entries if entry.kind != "failed"]
        result = RetentionResult(FAILED_DIR, scan.size, scan.files, kept=scan.kept)
        for entry, why in _select(scan.entries, scan.size, days, max_gb, now):
            _remove_failed_entry(result, log_path, entry, why)
    _summary(result, max_gb)
    return result


@contextlib.contextmanager
def _no_batch_pass(log_path: Path, wanted: bool) -> Iterator[bool]:
    """Holds the node's batch lock while failed files are removed (no pass appends meanwhile; one
    of this process is waited for); False when another process runs a pass, or not `wanted`."""
    from eventspark.batch.process import PassBusy, batch_lock

    if not wanted:
        yield False
        return
    try:
        with batch_lock(log_path / "incoming"):
            yield True
    except PassBusy:
        log.info("retention: a batch pass of another process is running: failed files wait for the next run")
        yield False


def _remove_failed_entry(result: RetentionResult, log_path: Path, entry: _Entry, why: str) -> None:
    try:
        if entry.kind == "replayed":
            _remove_replayed(entry.path)
        elif not _retire_failed(log_path, entry.path):
            result.kept += 1
            return
    except FileNotFoundError:
        return  # replayed meanwhile
    except OSError as exc:
        log.warning("retention: cannot remove %s: %s", entry.path, exc)
        return
    _removed(result, log_path, entry, why)


def _scan_failed(root: Path, busy: set[Path], now: float) -> _Scan:
    scan = _Scan()
    for item in _scandir(root):
        path = Path(item.path)
        if item.is_dir(follow_symlinks=False):
            if item.name == REPLAYED_DIR:
                _scan_replayed(path, busy, now, scan)
            else:  # pending/ (another pass's spools), .retiring/ (just emptied): counted only
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
        if _journaled(root, dest_id) or _recording(root.parent, dest_id) or _recent(stat.st_mtime, now):
            scan.kept += 1
            continue
        scan.entries.append(_Entry(path, stat.st_size, 1, stat.st_mtime, "failed"))
    return scan


def _journaled(root: Path, dest_id: str) -> bool:
    """Whether a batch pass must recover the destination's failed log after a crash (its journal
    in `failed/pending/`, `logs.failed`): the journal holds the log's inode and size, so the file
    stays until the journal is gone."""
    return journal_path(root, dest_id).exists()


def _recording(log_path: Path, dest_id: str) -> bool:
    """Whether the stream worker of the destination is appending to its failed log, or must cut it
    back after a crash (`stream.queue.QueueReader.mark_recording`)."""
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


def _retire_failed(log_path: Path, path: Path) -> bool:
    """Removes a failed file under the batch lock (module docstring); False, leaving the file as it
    was, when the stream worker started an append meanwhile (its mark, or the file grew)."""
    dest_id = failed_destination(path.name) or ""
    before = path.stat()
    if _recording(log_path, dest_id) or _recent(before.st_mtime, time.time()):
        return False
    aside = path.parent / RETIRING_DIR / str(before.st_size) / path.name
    aside.parent.mkdir(parents=True, exist_ok=True)
    os.rename(path, aside)
    after = aside.stat()
    # No mark now, none before the rename: no append was under way across it (the worker writes
    # only through a file it opens after writing its mark, and removes the mark after closing
    # it), and one that ran in between made it grow.
    quiet = not _recording(log_path, dest_id) and (after.st_size, after.st_mtime_ns) == (
        before.st_size,
        before.st_mtime_ns,
    )
    if quiet:
        aside.unlink()
        _rmdir_quietly(aside.parent)
    else:
        _put_back(aside, path, before.st_size)
        log.info("retention: %s is being appended to: kept for now", path.name)
    _rmdir_quietly(aside.parent.parent)
    return quiet


def finish_retiring(root: Path) -> None:
    """Puts back the failed files a crash left aside (`failed/.retiring/<size>/<name>`): the
    policy then decides again."""
    retiring = root / RETIRING_DIR
    for folder in _scandir(retiring):
        if not folder.is_dir(follow_symlinks=False) or not folder.name.isdigit():
            continue
        for item in _scandir(Path(folder.path)):
            _put_back(Path(item.path), root / item.name, int(folder.name))
        _rmdir_quietly(Path(folder.path))
    _rmdir_quietly(retiring)


def _put_back(aside: Path, live: Path, size: int) -> None:
    """The same file (inode) back under its name; when a writer has created a new one meanwhile,
    what went aside after its first `size` bytes is appended to that one instead."""
    try:
        os.link(aside, live)
    except FileExistsError:
        _append_tail(aside, live, size)
    except OSError:  # a file system without hard links: renamed back, unless a new one exists
        if live.exists():
            _append_tail(aside, live, size)
        else:
            os.rename(aside, live)
            _rmdir_quietly(aside.parent)
            return
    aside.unlink()
    _rmdir_quietly(aside.parent)


def _append_tail(aside: Path, live: Path, size: int) -> None:
    with aside.open("rb") as src, live.open("ab") as out:
        src.seek(size)
        shutil.copyfileobj(src, out, COPY_CHUNK)
        out.flush()
        os.fsync(out.fileno())


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


def _rmdir_quietly(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not empty, or gone
        folder.rmdir()


# --- in `serve` -----------------------------------------------------------------------------------


def apply_retention(log: LogConfig, now: float | None = None) -> list[RetentionResult]:
    """Both directories' policies, their metrics, and the sizes recorded for `read_usage`."""
    from eventspark.ops.metrics import pipeline_metrics

    log_path = Path(log.path)
    results = [
        archive_retention(log_path, log.archive_retention_days, log.archive_max_gb, now),
        failed_retention(log_path, log.failed_retention_days, log.failed_max_gb, now),
    ]
    metrics = pipeline_metrics()
    for result in results:
        metrics.retention_removed(result.directory, result.removed_files, result.removed_bytes)
    _write_usage(log_path, results, time.time() if now is None else now)
    return results


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

    def __init__(self, log: LogConfig, period: float = PERIOD_SEC) -> None:
        self.log = log
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
            return apply_retention(self.log)
        except Exception:  # a bug or an unreadable folder must not end the thread
            log.exception("retention: applying the policy failed; trying again next period")
            return []


def after_pass(log_path: Path) -> None:
    """Wakes the retention thread of `log_path` in this process, if any (the uploader, after a pass)."""
    with _running_lock:
        found = _running.get(log_path.absolute())
    if found is not None:
        found.wake()
