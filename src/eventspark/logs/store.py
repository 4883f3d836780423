"""Where a batch pass finds its rotated logs: under `log.path` (`LocalStore`) or on object storage
(`RemoteStore`, `log.remote`).

The job works on `LogFile` values (name, size, location) and asks its store for what touches
the files: the listing, status files, deleting empty logs, the archive, and, on object storage,
what executors need to read byte ranges themselves (`RemoteReader`, picklable: the URL and
fsspec's options; each executor process builds the filesystem once). The local store is today's
code, unchanged: executors `open()` the driver's paths.

Layout under `log.remote.url` (as under `log.path`): `incoming/<log>` and `incoming/<log>.status`,
`archive/YYYY-MM-DD/<log>.gz`, `failed/<node>/failed.dst=<id>.log` (copies of the node's failed
files), `staging/<job>/failed/` (executors' spools of failed events, for the driver to fetch).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
from isal import igzip

from eventspark.config.models import Config, RemoteLogs, without_credentials
from eventspark.logs.archive import COPY_CHUNK, archive_log
from eventspark.logs.incoming import GLOB_CHARACTERS
from eventspark.logs.remote import atomic_puts, remote_filesystem, remove_listed
from eventspark.logs.replay import replay_destination
from eventspark.logs.rotated import rotated_logs, rotated_token
from eventspark.logs.status import STATUS_SUFFIX, LogStatus, parse_status, read_status, status_to_json, write_status

log = logging.getLogger(__name__)

EXECUTOR_ARCHIVE_BYTES = 256 * 1024 * 1024
"""From this many bytes of settled logs, a cluster's executors archive them (`LocalStore.archive`):
a Spark job costs ~0.15 s to start, ISA-L gzips ~1 GB/s per core (docs/scaling.md)."""
REMOTE_READ_BUFFER = 4 * 1024 * 1024
"""Bytes per ranged GET of an executor's read: few requests per 16 MiB split, little read past it."""
FAILED_FILE_PREFIX = "failed.dst="


@dataclass(frozen=True, slots=True)
class LogFile:
    """A rotated log: its name, its size when listed, and where it is (a local path, or its path
    on the remote filesystem, without the protocol)."""

    name: str
    size: int
    location: str


# --- executors' side ------------------------------------------------------------------------------

_filesystems: dict[tuple[str, bytes], Any] = {}
"""One filesystem per (URL, options) and Python worker: Spark reuses workers across tasks."""


@dataclass(frozen=True, slots=True)
class RemoteReader:
    """What an executor needs to reach `log.remote`: picklable, shipped in the job's plan."""

    url: str = field(repr=False)  # may hold user:password: the repr shows it without
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False)  # holds the store's keys

    def __repr__(self) -> str:
        return f"RemoteReader(url={without_credentials(self.url)!r})"

    def filesystem(self) -> Any:
        key = (self.url, orjson.dumps(self.storage_options, option=orjson.OPT_SORT_KEYS, default=str))
        found = _filesystems.get(key)
        if found is None:
            remote = RemoteLogs(url=self.url, storage_options=self.storage_options)
            found = _filesystems[key] = remote_filesystem(remote)
        return found[0]

    def open(self, location: str) -> io.BufferedReader:
        """`location` for reading, buffered: `readline` runs in C over ranged GETs of
        REMOTE_READ_BUFFER bytes (fsspec's own readline copies its block for every line)."""
        raw = self.filesystem().open(location, "rb", block_size=REMOTE_READ_BUFFER, cache_type="none")
        return io.BufferedReader(raw, REMOTE_READ_BUFFER)

    def put_spool(self, local: Path, target: str) -> str:
        """Uploads a spool of failed events to `target` (the driver fetches it); returns `target`."""
        put_whole(self.filesystem(), local, target)
        return target


def gzip_remote(reader: RemoteReader, source: str, target: str) -> str:
    """An executor's part of the remote archive: `source` gzipped (ISA-L, level 1, as the local
    archive) into `target`. An object store shows the object only once it is whole; elsewhere
    (`file://`, ...) it is written under a temporary name and moved, so that a crash never leaves
    a truncated archive under the final name."""
    fs = reader.filesystem()
    writing = target if atomic_puts(fs) else _temporary(fs, target)
    with reader.open(source) as src, fs.open(writing, "wb") as raw:
        try:
            with igzip.open(raw, "wb", compresslevel=1) as dst:
                shutil.copyfileobj(src, dst, COPY_CHUNK)
        except BaseException:
            _discard(raw)
            raise
    if writing != target:
        fs.mv(writing, target)
    return target


def _discard(raw: Any) -> None:
    """An object being written, dropped: fsspec's `close()` (on leaving its `with`) would put what
    was written so far, a truncated archive, under the final name (s3fs: the multipart upload is
    aborted; a smaller one was never sent)."""
    with contextlib.suppress(Exception):  # a local file has nothing to discard: it has a temporary name
        raw.discard()
    raw.forced = True  # nothing left for `close()` to flush


def _on_executors(session: Any, items: list[Any], work: Any) -> list[Any]:
    """`work` of every item on the executors, in the items' order, in at most one task per core:
    a task per item costs ~80-95 ms per extra task where an executor gets several."""
    slices = max(1, min(len(items), session.sparkContext.defaultParallelism))
    return session.sparkContext.parallelize(items, slices).map(work).collect()


def replace_object(fs: Any, target: str, data: bytes) -> None:
    """`target` replaced whole by `data`: one put on an object store (atomic), else a temporary
    file moved over it."""
    if atomic_puts(fs):
        fs.pipe_file(target, data)
        return
    temporary = _temporary(fs, target)
    fs.pipe_file(temporary, data)
    fs.mv(temporary, target)


def put_whole(fs: Any, local: Path, target: str) -> None:
    """The local file `local` put at `target`, which readers see whole or not at all."""
    if atomic_puts(fs):
        fs.put_file(str(local), target)
        return
    temporary = _temporary(fs, target)
    fs.put_file(str(local), temporary)
    fs.mv(temporary, target)


def _temporary(fs: Any, target: str) -> str:
    """A temporary name beside `target` (its folder made: a filesystem's folders must exist).
    Dot-names: `RemoteStore.rotated` never lists them as logs."""
    folder, _, name = target.rpartition("/")
    fs.makedirs(folder, exist_ok=True)
    return f"{folder}/.{name}.{uuid.uuid4().hex[:8]}.tmp"


# --- the driver's side ----------------------------------------------------------------------------


class LocalStore:
    """The rotated logs of `<log.path>/incoming`, as the pass always read them."""

    reader: RemoteReader | None = None
    archive_is_final = True
    """An archived log never comes back to incoming/ (its removal raises when it fails): the load
    markers of the logs a pass archived go with them (`BatchJob._forget_markers`)."""

    def __init__(self, events_dir: Path) -> None:
        self.events_dir = events_dir
        self.incoming = events_dir / "incoming"

    @staticmethod
    def log_file(path: Path) -> LogFile:
        return LogFile(path.name, path.stat().st_size, str(path))

    def rotated(self) -> list[LogFile]:
        return [self.log_file(path) for path in rotated_logs(self.incoming)]

    def shown(self, logfile: LogFile | Path) -> Any:
        """How `JobResult` lists a log: its Path (as before `LogFile`)."""
        return logfile if isinstance(logfile, Path) else Path(logfile.location)

    def read_statuses(self, logs: Iterable[LogFile]) -> dict[str, LogStatus]:
        return {logfile.name: read_status(Path(logfile.location)) for logfile in logs}

    def write_statuses(self, statuses: dict[LogFile, LogStatus]) -> None:
        for logfile, status in statuses.items():
            write_status(Path(logfile.location), status)

    def status_of(self, name: str) -> LogStatus | None:
        """The status of log `name`; None when the log is gone (archived: settled)."""
        path = self.incoming / name
        return read_status(path) if path.exists() else None

    def delete(self, logfile: LogFile) -> None:
        path = Path(logfile.location)
        path.unlink()
        path.with_name(path.name + STATUS_SUFFIX).unlink(missing_ok=True)

    def archive(self, logs: list[LogFile], session: Any = None) -> list[Any]:
        """Gzips `logs` into the archive, several at once: ISA-L releases the GIL, and the pass
        waits for this serial tail with the executors' cores idle (1M events: 0.9 s → 0.5 s on
        2 cores). A log that fails stops the pass after the others are done; it stays in incoming/
        (settled: the next pass archives it).

        On a cluster master (`spark.master` not `local...`) and from EXECUTOR_ARCHIVE_BYTES on,
        the executors gzip them, as `RemoteStore.archive` does: the gzip is the one driver step
        that grows with the events (docs/scaling.md), and the executors read these paths already
        (a shared folder). Below that, a second Spark job costs more than the gzip."""
        paths = [Path(logfile.location) for logfile in logs]
        folder = self.events_dir / "archive"
        big = sum(logfile.size for logfile in logs) >= EXECUTOR_ARCHIVE_BYTES
        if session is not None and big and not session.sparkContext.master.startswith("local"):
            return _on_executors(session, paths, lambda path: archive_log(path, folder))
        if len(paths) < 2:
            return [archive_log(path, folder) for path in paths]
        with ThreadPoolExecutor(min(len(paths), os.cpu_count() or 1)) as pool:
            futures = [pool.submit(archive_log, path, folder) for path in paths]
        for path, future in zip(paths, futures, strict=True):
            if future.exception() is not None:
                log.error("archiving %s failed: %s", path.name, future.exception())
        return [future.result() for future in futures]  # the first failure ends the pass

    def park_claims(self) -> ParkClaims | None:
        """One node reads its logs: its parked groups need no claims."""
        return None

    def spool_target(self, job_id: str) -> str | None:
        """Where executors upload their spools of failed events: nowhere, they stay local."""
        return None

    def fetch_spool(self, spool: str, folder: Path) -> Path:
        return Path(spool)

    def finish_job(self, job_id: str) -> None:
        """Nothing beside the local staging folder (removed by the job)."""

    def publish_failed(self, failed_dir: Path) -> None:
        """The failed files are where they are read."""


class RemoteStore:
    """The rotated logs of every node under `log.remote`; failed files stay journaled on the node
    running the pass (`logs.failed`), copied beside the logs after each pass (`publish_failed`)."""

    archive_is_final = False
    """The load markers stay: they are what keeps a log from loading twice when it comes back to
    incoming/ after its archive, as it can here. A node that crashed between a verified put and its
    local delete puts the log again once retention removed its archive (`logs.upload._archived`),
    and a bulk delete can leave a log behind without raising (S3 reports per-key errors that s3fs
    drops), with its status file gone."""

    def __init__(self, remote: RemoteLogs, events_dir: Path, node: str) -> None:
        self.fs, self.root = remote_filesystem(remote)
        self.reader = RemoteReader(remote.url, dict(remote.storage_options))
        self.events_dir = events_dir
        self.node = _key_segment(node)  # a folder of the failed copies' keys: no `/`, `.` or `..`
        self.incoming = f"{self.root}/incoming"

    def rotated(self) -> list[LogFile]:
        """The rotated and replay logs in incoming/, by name. Names are parsed strictly: any other
        object (status files aside) is left alone, with a warning: never read, never deleted."""
        # Executors and other nodes changed the store since this process last looked: fsspec's
        # cached listings (and `info` answered from them) are forgotten once per pass.
        self.fs.invalidate_cache()
        try:
            entries = self.fs.ls(self.incoming, detail=True, refresh=True)
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            name = entry["name"].rsplit("/", 1)[-1]
            if entry.get("type") != "file" or name.endswith(STATUS_SUFFIX):
                continue
            if name.startswith(".") and name.endswith(".tmp"):
                continue  # a status being replaced (`replace_object`), not an object store
            # A glob character in a path makes fsspec's `rm` delete other logs: never a log here.
            if (rotated_token(name) is None and replay_destination(name) is None) or GLOB_CHARACTERS.search(name):
                log.warning("log.remote: %s in incoming/ is not a rotated log: ignored", name)
                continue
            found.append(LogFile(name, int(entry["size"]), f"{self.incoming}/{name}"))
        return sorted(found, key=lambda logfile: logfile.name)

    def shown(self, logfile: LogFile) -> Any:
        """How `JobResult` lists a log: the LogFile itself."""
        return logfile

    def read_statuses(self, logs: Iterable[LogFile]) -> dict[str, LogStatus]:
        """Every status file at once (fsspec fetches them concurrently); a missing one: empty.
        Any other error stops the pass, as a local read error does: taking an unreadable status
        for an empty one would process the log again for every destination."""
        logs = list(logs)
        if not logs:
            return {}
        paths = {logfile.location + STATUS_SUFFIX: logfile.name for logfile in logs}
        raw = self.fs.cat(list(paths), on_error="return")
        statuses: dict[str, LogStatus] = {logfile.name: {} for logfile in logs}
        for path, data in raw.items():
            if isinstance(data, FileNotFoundError):
                continue
            if isinstance(data, BaseException):
                raise data
            statuses[paths[_strip(path)]] = _parse(data)
        return statuses

    def write_statuses(self, statuses: dict[LogFile, LogStatus]) -> None:
        """Each status file replaced whole (an object store's put is atomic)."""
        data = {
            logfile.location + STATUS_SUFFIX: orjson.dumps(status_to_json(status), option=orjson.OPT_INDENT_2)
            for logfile, status in statuses.items()
        }
        if data and atomic_puts(self.fs):
            self.fs.pipe(data)  # concurrently
            return
        for target, content in data.items():
            replace_object(self.fs, target, content)

    def status_of(self, name: str) -> LogStatus | None:
        location = f"{self.incoming}/{name}"
        try:
            self.fs.info(location, refresh=True)  # not from a cached listing: the store decides
        except FileNotFoundError:
            return None
        return self.read_statuses([LogFile(name, 0, location)])[name]

    def delete(self, logfile: LogFile) -> None:
        """The log, then its status: a status left alone is never listed."""
        self.fs.rm_file(logfile.location)
        self._remove(logfile.location + STATUS_SUFFIX)

    def archive(self, logs: list[LogFile], session: Any = None) -> list[str]:
        """Executors gzip the logs into `archive/YYYY-MM-DD/` (at most a task per core: no data through
        the driver), then the driver removes each log and its status. A log whose archive fails
        stays (settled: the next pass archives it) and fails the pass, as the local archive does."""
        if not logs:
            return []
        day = datetime.now(UTC).strftime("%Y-%m-%d")
        jobs = [(logfile.location, f"{self.root}/archive/{day}/{logfile.name}.gz") for logfile in logs]
        reader = self.reader
        if session is None:
            done = [gzip_remote(reader, source, target) for source, target in jobs]
        else:
            done = _on_executors(session, jobs, lambda job: gzip_remote(reader, job[0], job[1]))
        self._delete_all(logs)
        return done

    def _delete_all(self, logs: list[LogFile]) -> None:
        """`delete` of many logs in two bulk requests (S3 deletes up to 1,000 objects per
        request), the logs before their statuses: a status left alone is never listed, a log
        left without its status would be read again as new."""
        self._remove_all([logfile.location for logfile in logs])
        self._remove_all([logfile.location + STATUS_SUFFIX for logfile in logs])

    def _remove_all(self, locations: list[str]) -> None:
        remove_listed(self.fs, locations)  # listed logs hold no glob character (`rotated`): none skipped

    def park_claims(self) -> ParkClaims:
        """Claims of this node's parked failed-event groups (`ParkClaims`)."""
        return ParkClaims(self.fs, self.root, self.node)

    def spool_target(self, job_id: str) -> str | None:
        """Where executors upload their spools of failed events (their disks are not the driver's)."""
        return f"{self.root}/staging/{job_id}/failed"

    def fetch_spool(self, spool: str, folder: Path) -> Path:
        """An executor's spool, downloaded into the driver's staging `folder` (failed events are
        few: they may pass through the driver)."""
        folder.mkdir(parents=True, exist_ok=True)
        local = folder / f"{uuid.uuid4().hex}.log"
        self.fs.get_file(spool, str(local))
        with local.open("rb") as file:
            os.fsync(file.fileno())  # parked as it is: on disk before the pass may settle its pair
        return local

    def finish_job(self, job_id: str) -> None:
        """The job's remote staging goes, like the local one. Run as the job ends, crash or not: an
        error here is logged, never raised over the job's own (what is left is a few spools)."""
        try:
            self._remove(f"{self.root}/staging/{job_id}", recursive=True)
        except Exception as exc:
            log.warning("log.remote: staging/%s was not removed: %s", job_id, exc)

    def publish_failed(self, failed_dir: Path) -> None:
        """This node's failed files copied whole to `failed/<node>/` beside the logs, when their
        size differs from the copy there (a put replaces an object atomically)."""
        if not failed_dir.is_dir():
            return
        for path in sorted(failed_dir.glob(f"{FAILED_FILE_PREFIX}*.log")):
            target = f"{self.root}/failed/{self.node}/{path.name}"
            try:
                self._publish(path, target)
            except Exception as exc:  # the pass is done; the next one copies it
                log.warning("log.remote: %s not copied to the store (next pass): %s", path.name, exc)

    def _publish(self, path: Path, target: str) -> None:
        try:
            same = self.fs.info(target)["size"] == path.stat().st_size
        except FileNotFoundError:
            same = False
        if not same:
            put_whole(self.fs, path, target)

    def _remove(self, location: str, recursive: bool = False) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(location, recursive=recursive)


class ParkClaims:
    """Claims on the store of the failed-event groups this node parked (`logs.failed`), so that
    failed events are appended once across nodes.

    A node's parked groups stay on its own disk. When it dies before committing their pairs, the
    next pass (maybe another node's) reads the logs again and spools the same failed events; the
    dead node, back, would find the pairs settled and append its parked copy too. So a group parked
    with `log.remote` is claimed here before any commit (one empty object,
    `claims/<log>/<destination>/t=<table>/<node>@<group>`; group ids are uuid4s, so a claim is
    found by its group whatever the node is called now), and a pass that decides a pair again (it
    read its events: failed ones spooled again, or none failing this time) removes every other
    claim on it: its outcome supersedes theirs. A claimed group whose claim is gone is dropped,
    never appended (`FailedEvents`). A pair another node committed is not decided again (it is
    done), so its claim stays and its node appends its copy, the only one. Passes run one at a
    time (the cluster's pass lock, fenced), so claims do not race. A claim left behind (a crash
    between a group's removal and its release) is removed by the next pass deciding its pair."""

    def __init__(self, fs: Any, root: str, node: str) -> None:
        self.fs = fs
        self.folder = f"{root}/claims"
        self.node = node  # a key segment already (`_key_segment`): no `@`
        self._held: set[str] | None = None

    def claim(self, groups: list[Any]) -> None:
        """Claims `groups` (`ParkedSpools`), in one concurrent batch of puts."""
        keys = {
            f"{self._pair(group.log, group.dest_id, group.table)}/{self.node}@{group.group_id}": b"" for group in groups
        }
        if not atomic_puts(self.fs):  # a filesystem's (`file://`) folders must exist
            for key in keys:
                self.fs.makedirs(key.rpartition("/")[0], exist_ok=True)
        if keys:
            self.fs.pipe(keys)

    def supersede(self, pairs: Iterable[tuple[str, str, str]], keep: list[Any]) -> None:
        """Removes every claim on `pairs` (log, destination, table) but those of the groups `keep`
        (this pass's): one listing, one bulk delete."""
        folders = {self._pair(*pair) for pair in pairs}
        kept = {group.group_id for group in keep}
        others = [
            key for key in self._listing() if key.rpartition("/")[0] in folders and key.rpartition("@")[2] not in kept
        ]
        if others:
            log.info("log.remote: %d failed-event group(s) parked by passes cut short superseded", len(others))
            remove_listed(self.fs, others)

    def held(self, group: Any) -> bool:
        """Whether `group`'s claim is still there (listed once per instance: one pass; `refresh`
        lists again)."""
        if self._held is None:
            # By group id alone: a node back under another name (a pod's new host name) finds its claims.
            self._held = {key.rpartition("@")[2] for key in self._listing()}
        return group.group_id in self._held

    def refresh(self) -> None:
        """Forgets the listing: the next `held` lists the store again."""
        self._held = None

    def release(self, groups: list[Any]) -> None:
        """Removes the claims of groups appended or dropped. A failure is logged, not raised: the
        groups' outcome is durable already, and a claim left behind only waits to be superseded."""
        if not groups:
            return
        ids = {group.group_id for group in groups}
        try:
            keys = [key for key in self._listing() if key.rpartition("@")[2] in ids]
            if keys:
                remove_listed(self.fs, keys)
        except Exception as exc:
            log.warning("log.remote: claims of %d failed-event group(s) not released: %s", len(ids), exc)

    def _listing(self) -> list[str]:
        self.fs.invalidate_cache(self.folder)
        try:
            return [_strip(key) for key in self.fs.find(self.folder)]
        except FileNotFoundError:
            return []

    def _pair(self, log_name: str, dest_id: str, table: str) -> str:
        segments = (_key_segment(log_name), _key_segment(dest_id), "t=" + quote(table, safe=""))
        return "/".join((self.folder, *segments))


LogStore = LocalStore | RemoteStore


def log_store(config: Config) -> LogStore:
    """The store of `config`: remote when `log.remote` is set."""
    events_dir = Path(config.log.path)
    if config.log.remote is None:
        return LocalStore(events_dir)
    from eventspark.logs.upload import node_name

    return RemoteStore(config.log.remote, events_dir, node_name(config))


def remote_lock_name(remote: RemoteLogs) -> str:
    """The coordination lock of the passes over `remote`: one pass at a time per cluster."""
    return f"batch-pass:{remote.shown_url.rstrip('/')}"  # a lock key is shown: no credentials


def _key_segment(name: str) -> str:
    """`name` percent-encoded as one segment of a key: no `/`, and no leading dot (`.`, `..`)."""
    quoted = quote(name, safe="")
    return "%2E" + quoted[1:] if quoted.startswith(".") else quoted


def _strip(path: str) -> str:
    """fsspec's `cat` may key its answer with the protocol: the bare path."""
    return path.split("://", 1)[-1]


def _parse(data: bytes) -> LogStatus:
    try:
        return parse_status(orjson.loads(data))
    except orjson.JSONDecodeError:
        return {}


def failed_copy_location(root: str, node: str, name: str) -> str:
    """Where `RemoteStore.publish_failed` of node `node` copies its failed file `name` (retention
    removes the copy with the local file: `logs.remote_retention`)."""
    return f"{root}/failed/{_key_segment(node)}/{name}"
