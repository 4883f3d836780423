"""The `events/incoming` directory: durable per-token logs, their names and their rotation.

The collector appends enriched events, one JSON object per line, to `incoming.tok=<id>.log`
(`incoming.tok=<id>|w=<n>.log` when several worker processes write) with `os.write`, so a line
is in the operating system before the client is answered and survives a crash of the process.
Every `log.rotation_min` minutes, and on shutdown, non-empty live files are renamed to
`incoming.tok=<id>-YYYY-MM-DDTHH-MM-SS.mmm.log` (UTC), the files the batch job reads. Uploaded
to `log.remote`, a rotated log's name also carries the node: `incoming.tok=<id>|n=<node>-…`
(`with_node`, `eventspark.logs.upload`).

The process serving the collector holds an exclusive `flock` on `incoming/.server.lock` for its
whole life (worker processes inherit it). `rotate_incoming_logs` takes the same lock without
waiting, so another process (`eventspark process`) only renames live files nobody writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote, unquote

from eventspark.logs.status import sync_dir

__all__ = [
    "AppendOnlyFile",
    "IncomingLogs",
    "LogName",
    "ServerLock",
    "ServerLockHeld",
    "live_log_name",
    "parse_log_name",
    "rotate_incoming_logs",
    "rotate_live_files",
    "rotated_log_name",
    "with_node",
]

logger = logging.getLogger(__name__)

LOCK_FILE = ".server.lock"
_PREFIX = "incoming.tok="
_STAMP = "%Y-%m-%dT%H-%M-%S"
# The fraction after the seconds is optional and of any length, as EventNative's uploader
# accepted (`incoming.tok=*-20*.log`): its logs may end `.1234.log` or have no fraction at all.
# `|n=<node>`: the collector node (`server.name`) in the names of logs uploaded to `log.remote`,
# so that two nodes rotating one token in the same millisecond never write the same object.
_NAME = re.compile(
    r"^incoming\.tok=(?P<tok>.+?)(?:\|n=(?P<node>[^|/\\\x00]+?))?(?:\|w=(?P<worker>\d+))?"
    r"(?:-(?P<stamp>\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d)(?:\.(?P<ms>\d{1,9}))?)?\.log$"
)
# Characters that would change a file name's meaning (a path, the `|` separator, the escape itself).
_UNSAFE_ID = re.compile(r"[/\\|%\x00]|^\.")
GLOB_CHARACTERS = re.compile(r"[*?\[]")
"""fsspec reads them as globs in the paths given to `rm`, `mv` or a `cat` of several: encoded in
remote names (`with_node`); a pass ignores a listed name that holds one (`logs.store`)."""


# --- names ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogName:
    """What an incoming file name says: the token id, the worker, the rotation time if rotated, and
    the collector node in the names of logs uploaded to `log.remote` (None in local names)."""

    token_id: str
    worker: int | None = None
    rotated_at: datetime | None = None
    node: str | None = None


def _quote_id(token_id: str) -> str:
    # Token ids come from the config; percent-encode the few characters that break a file name.
    return quote(token_id, safe="") if _UNSAFE_ID.search(token_id) else token_id


def _base(token_id: str, worker: int | None, node: str | None = None) -> str:
    token = _quote_id(token_id) if node is None else _with_node(_quote_id(token_id), node)
    return f"{_PREFIX}{token}" + ("" if worker is None else f"|w={worker}")


def _with_node(token: str, node: str) -> str:
    """`<token>|n=<node>` in a remote name: no glob characters in either (`_quote_glob`)."""
    return f"{_quote_glob(token)}|n={_quote_glob(_quote_id(node))}"


def live_log_name(token_id: str, worker: int | None = None) -> str:
    """`incoming.tok=<id>.log`, or `incoming.tok=<id>|w=<n>.log` for worker process n."""
    return _base(token_id, worker) + ".log"


def rotated_log_name(token_id: str, at: datetime, worker: int | None = None, node: str | None = None) -> str:
    """`incoming.tok=<id>-YYYY-MM-DDTHH-MM-SS.mmm.log` (UTC; `|w=<n>` after the id for workers,
    `|n=<node>` before it in the names of logs uploaded to `log.remote`)."""
    at = at.astimezone(UTC) if at.tzinfo is not None else at
    return f"{_base(token_id, worker, node)}-{at.strftime(_STAMP)}.{at.microsecond // 1000:03d}.log"


def with_node(name: str, node: str) -> str | None:
    """The rotated log `name` with `|n=<node>` after its token id, the rest (stamp included) kept
    as it is; `name` itself when it names a node already; None when it is not a rotated log."""
    match = _NAME.match(name)
    if match is None or not match.group("stamp"):
        return None
    if match.group("node") is not None:
        return name
    start, end = match.span("tok")
    return f"{name[:start]}{_with_node(name[start:end], node)}{name[end:]}"


def _quote_glob(part: str) -> str:
    """`GLOB_CHARACTERS` percent-encoded (`parse_log_name` decodes them)."""
    return GLOB_CHARACTERS.sub(lambda found: f"%{ord(found.group()):02X}", part)


def parse_log_name(name: str) -> LogName | None:
    """Parses a live or rotated incoming file name; None for anything else (status files, locks)."""
    match = _NAME.match(name)
    if match is None:
        return None
    worker = match.group("worker")
    rotated_at = None
    if match.group("stamp"):
        stamp = datetime.strptime(match.group("stamp"), _STAMP).replace(tzinfo=UTC)
        fraction = match.group("ms") or ""
        rotated_at = stamp.replace(microsecond=int((fraction + "000000")[:6]))
    node = match.group("node")
    return LogName(
        unquote(match.group("tok")),
        None if worker is None else int(worker),
        rotated_at,
        None if node is None else unquote(node),
    )


# --- one append-only file -------------------------------------------------------------------------


class AppendOnlyFile:
    """A file written only with `os.write(O_APPEND)`, opened on the first write.

    `write` and `close` run on one thread (the collector's event loop); `fsync` may run on
    another (group commit) and is serialised with `close` so it never touches a closed fd.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = 0
        self.lines = 0
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._sync_error: OSError | None = None
        """An fsync by `close` that failed: the next `fsync` raises it (see `fsync`)."""

    def write(self, data: bytes, lines: int = 1) -> None:
        """Appends `data` (whole lines); on error the file is cut back so no partial line remains."""
        fd = self._fd
        if fd is None:
            fd = self._open()
        start = self.size
        try:
            written = os.write(fd, data)
            if written != len(data):  # a regular file writes everything unless the disk is full
                self._write_rest(fd, memoryview(data)[written:])
        except BaseException:
            self._truncate(fd, start)
            raise
        self.size = start + len(data)
        self.lines += lines

    def undo(self, size: int, lines: int) -> None:
        """Cuts off the last `write` (of `size` bytes, `lines` lines; nothing written since): its
        request was refused after all (another of its files failed), so its lines must not be
        loaded either."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):  # cannot fail on a regular file we write
            os.ftruncate(self._fd, self.size - size)
            self.size, self.lines = self.size - size, self.lines - lines

    def _write_rest(self, fd: int, view: memoryview) -> None:
        while view:
            view = view[os.write(fd, view) :]

    def _open(self) -> int:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.size = os.fstat(fd).st_size
        self.lines = 0
        self._fd = fd
        return fd

    def _truncate(self, fd: int, size: int) -> None:
        with contextlib.suppress(OSError):  # the original error is the one worth reporting
            os.ftruncate(fd, size)

    def fsync(self) -> None:
        """Forces written data to disk; a no-op when the file is closed (close syncs first).

        When the fsync of a `close` (rotation) failed, lines written before it whose requests
        still wait for the group commit were not synced: this call raises that error (once)."""
        with self._lock:
            error, self._sync_error = self._sync_error, None
            if error is not None:
                raise error
            if self._fd is not None:
                os.fsync(self._fd)

    def close(self, sync: bool = False) -> None:
        with self._lock:
            if self._fd is None:
                return
            try:
                if sync:
                    os.fsync(self._fd)
            except OSError as exc:
                self._sync_error = exc
                raise
            finally:
                os.close(self._fd)
                self._fd = None


# --- this process's live logs ---------------------------------------------------------------------


class IncomingLogs:
    """The live incoming logs one process writes: one file per token, rotated together."""

    def __init__(self, incoming_dir: Path, worker: int | None = None, fsync: bool = False) -> None:
        self.incoming_dir = incoming_dir
        self.worker = worker
        self.fsync = fsync
        self._files: dict[str, AppendOnlyFile] = {}

    def file_for(self, token_id: str) -> AppendOnlyFile:
        """The token's live file object (stable across rotations, so callers may keep it)."""
        file = self._files.get(token_id)
        if file is None:
            file = AppendOnlyFile(self.incoming_dir / live_log_name(token_id, self.worker))
            self._files[token_id] = file
        return file

    def rotate(self, now: datetime | None = None) -> list[Path]:
        """Closes and renames every non-empty live file; the next write opens a fresh one.

        A file that cannot be renamed (disk full, read-only directory) stays live: the next write
        appends to it again and the next rotation retries. The other files are rotated anyway,
        then the first error is raised.
        """
        rotated, error = self._rotate(now or datetime.now(UTC))
        if error is not None:
            raise error
        return rotated

    def _rotate(self, now: datetime) -> tuple[list[Path], OSError | None]:
        rotated, error = [], None
        for token_id, file in self._files.items():
            if file.size == 0:
                continue
            try:
                file.close(sync=self.fsync)
                target = _free_rotated_path(self.incoming_dir, token_id, now, self.worker)
                os.rename(file.path, target)
            except OSError as exc:
                logger.error("cannot rotate %s (%s); it stays live until the next rotation", file.path.name, exc)
                error = error or exc
                continue
            file.size = file.lines = 0
            rotated.append(target)
        if rotated and self.fsync:
            try:
                sync_dir(self.incoming_dir)
            except OSError as exc:  # the renames are done; a crash may undo some
                error = error or exc
        return rotated, error

    def close(self) -> list[Path]:
        """Rotates what can be rotated (errors are logged) and closes every file (shutdown)."""
        rotated, _ = self._rotate(datetime.now(UTC))
        for file in self._files.values():
            with contextlib.suppress(OSError):  # an fsync error was answered 503 already
                file.close(sync=self.fsync)
        return rotated


def _free_rotated_path(directory: Path, token_id: str, now: datetime, worker: int | None) -> Path:
    # os.rename replaces silently: step a millisecond forward rather than overwrite a rotated file.
    while True:
        target = directory / rotated_log_name(token_id, now, worker)
        if not target.exists():
            return target
        now += timedelta(milliseconds=1)


# --- the server lock and rotation from another process --------------------------------------------


class ServerLockHeld(RuntimeError):
    """Another process serves this incoming directory."""


class ServerLock:
    """Exclusive `flock` on `incoming/.server.lock`: held by the serving process (and its workers)."""

    def __init__(self, incoming_dir: Path) -> None:
        self.path = incoming_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Takes the lock without waiting; raises ServerLockHeld when a server already holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ServerLockHeld(f"another eventspark server writes {self.path.parent}") from None
        self._fd = fd

    @property
    def fd(self) -> int | None:
        return self._fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor releases the flock
            self._fd = None


def rotate_incoming_logs(incoming_dir: Path, now: datetime | None = None) -> list[Path]:
    """Renames every non-empty live incoming log to its rotated name and returns the new paths.

    For a process that does not serve (e.g. `eventspark process`): when a server holds the
    directory it rotates its own files, and this returns [] without touching anything.
    """
    if not incoming_dir.is_dir():
        return []
    lock = ServerLock(incoming_dir)
    try:
        lock.acquire()
    except ServerLockHeld:
        return []
    try:
        return rotate_live_files(incoming_dir, now)
    finally:
        lock.release()


def rotate_live_files(incoming_dir: Path, now: datetime | None = None) -> list[Path]:
    """Renames every non-empty live file; the caller holds the server lock (no writer is running)."""
    now = now or datetime.now(UTC)
    rotated = []
    for path in sorted(incoming_dir.iterdir()):
        name = parse_log_name(path.name)
        if name is None or name.rotated_at is not None or not path.is_file():
            continue
        if path.stat().st_size == 0:
            continue
        target = _free_rotated_path(incoming_dir, name.token_id, now, name.worker)
        os.rename(path, target)
        rotated.append(target)
    return rotated
