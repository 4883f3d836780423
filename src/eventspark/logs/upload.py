"""Uploading this node's rotated logs to `log.remote`, where the batch pass reads them.

`upload_rotated(config)` puts every rotated log and replay log waiting in `<log.path>/incoming`
at `<remote root>/incoming/<remote name>`, verifies the object and only then removes the local
file, so an accepted event is on one side or the other at every moment. The remote name carries
the node (`|n=<server.name>`, `logs.incoming.with_node`): two nodes rotating one token in the
same millisecond write different objects, and the load markers, keyed by the log's name, keep
them apart. Replay logs keep their names (a random tag already tells two apart).

A log with a local status file was partly loaded by a local pass before `log.remote` was set:
it keeps its name remotely (its load markers and status name it so) and its status goes first.

Verification: the object's size, and a checksum the store gives for the whole object, compared
with the local file's: S3's ETag (the MD5 of a single-part put; of a multipart put, the MD5 of the
parts' MD5s, computed locally with the same part size), GCS's md5Hash. Where there is none or it
differs (SSE-KMS ETags, file://, another part size), the object is read back and hashed.

Retries: a few attempts per log with back-off; a store that fails two logs in a row ends the
call, and the logs wait for the next one.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from isal import igzip

from eventspark.config.models import Config
from eventspark.logs.incoming import parse_log_name, rotated_log_name, with_node
from eventspark.logs.remote import atomic_puts, protocols, put_options, remote_filesystem, remote_path
from eventspark.logs.replay import replay_destination
from eventspark.logs.rotated import rotated_logs
from eventspark.logs.status import STATUS_SUFFIX, sync_dir

__all__ = ["UploadError", "node_name", "remote_log_name", "upload_log", "upload_rotated"]

logger = logging.getLogger(__name__)

ATTEMPTS = 3
BACKOFF_SEC = 0.5
"""Waits between attempts at one log: 0.5 s, then 1 s (the store's client retries on its own too)."""
PART_SIZE = 8 * 2**20
"""Multipart part size: a log is streamed, at most a few parts of it in memory (S3's minimum is 5 MiB)."""
LOCK_FILE = ".upload.lock"
LOCK_WAIT_SEC = 120.0
"""How long a call waits for another process of this node that is uploading (a call is bounded)."""
MAX_NAME_STEPS = 1000
"""Names tried when objects of the same name and other content exist (a node name used twice)."""
JOURNAL_SUFFIX = ".uploading"
"""`.<log>.uploading` beside a local log while it may be on the store, holding the remote name
of its last put (`_record_name`)."""


class UploadError(RuntimeError):
    """A log could not be uploaded and verified; it stays local for the next call."""


@dataclass(frozen=True, slots=True)
class Digest:
    """A local log's size and MD5, and the ETag S3 gives it when put in parts of `part_size`
    (the MD5 of the parts' MD5s, `-<parts>`): what s3fs's `put_file` does above two parts."""

    size: int
    md5: str
    multipart_etag: str


def node_name(config: Config) -> str:
    """The node in remote names: `server.name`, else the host name (unique per machine or pod)."""
    return config.server.name or socket.gethostname()


def upload_rotated(config: Config) -> list[str]:
    """Uploads, verifies and removes every rotated log (and replay log) in `<log.path>/incoming`;
    returns the remote names uploaded. A no-op without `log.remote`. Transient failures are
    logged and the logs stay for the next call; `RemoteUnavailable` (fsspec or its store's
    package missing) is raised: it is a setup error."""
    remote = config.log.remote
    incoming = Path(config.log.path) / "incoming"
    if remote is None or not incoming.is_dir():
        return []
    with _upload_lock(incoming) as held:
        if not held:
            logger.warning("another process of this node has been uploading for %.0f s; not waiting", LOCK_WAIT_SEC)
            return []
        logs = rotated_logs(incoming)
        if not logs:
            return []
        fs, root = remote_filesystem(remote)
        return _upload_all(fs, root, logs, node_name(config))


def _upload_all(fs: Any, root: str, logs: list[Path], node: str) -> list[str]:
    uploaded: list[str] = []
    failures = 0
    for path in logs:
        try:
            name = _with_retries(fs, root, path, node, attempts=1 if failures else ATTEMPTS)
        except Exception as exc:  # the log stays local; its error is logged, the next call retries
            failures += 1
            logger.error("cannot upload %s to log.remote (%s); it stays local for the next try", path.name, exc)
            if failures >= 2:  # the store looks down: do not spend a pass on every log
                logger.error("log.remote unavailable: %d log(s) left for the next upload", len(logs) - len(uploaded))
                break
            continue
        failures = 0
        if name is not None:
            uploaded.append(name)
    if uploaded:
        logger.info("uploaded %d rotated log(s) to log.remote", len(uploaded))
    return uploaded


def _with_retries(fs: Any, root: str, path: Path, node: str, attempts: int) -> str | None:
    for attempt in range(1, attempts + 1):
        try:
            return upload_log(fs, root, path, node)
        except Exception as exc:
            if attempt == attempts:
                raise
            logger.warning("upload of %s failed (%s); attempt %d of %d", path.name, exc, attempt + 1, attempts)
            time.sleep(BACKOFF_SEC * 2 ** (attempt - 1))
    return None  # attempts < 1


def remote_log_name(local_name: str, node: str, has_status: bool) -> str | None:
    """The remote name of a local log: rotated logs get the node, replay logs and logs with a
    status file keep theirs; None for anything else (live logs, status files, strays)."""
    if replay_destination(local_name) is not None or (has_status and parse_log_name(local_name) is not None):
        return local_name
    return with_node(local_name, node)


def upload_log(fs: Any, root: str, path: Path, node: str, part_size: int = PART_SIZE) -> str | None:
    """Uploads one local log and removes it once the object is verified; returns its remote name,
    None when the local file vanished (another process of the node uploaded it)."""
    status = path.with_name(path.name + STATUS_SUFFIX)
    name = remote_log_name(path.name, node, status.exists())
    if name is None:
        logger.warning("%s is not a rotated log; left alone", path.name)
        return None
    try:
        digest = _digest(path, part_size)
    except FileNotFoundError:
        return None
    journal = path.with_name(f".{path.name}{JOURNAL_SUFFIX}")
    recorded = _read_journal(journal)
    # The name of the last put tried, when recorded: the log may be there (or archived) under it,
    # not under `name` (it moves on when a name is taken), and it should keep a single name.
    name = recorded or name
    if recorded is not None and _archived(fs, root, name, digest):
        logger.warning("%s was loaded and archived while this node was down; the local copy goes", path.name)
        _remove_local(path, status, journal)
        return None
    name = _put_once(fs, root, path, name, digest, part_size, status if status.exists() else None, journal)
    if not path.exists():  # another process uploaded it meanwhile (impossible under the lock)
        return name
    _remove_local(path, status, journal)
    return name


def _read_journal(journal: Path) -> str | None:
    """The remote name recorded in the journal (`_record_name`); "" for a journal without a whole
    name (an older version's empty one, a crash while writing it), None without a journal."""
    try:
        text = journal.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        return ""
    name = text[:-1] if text.endswith("\n") else ""
    if parse_log_name(name) is None and replay_destination(name) is None:
        return ""
    return name


def _record_name(journal: Path, name: str) -> None:
    """Marks the log as maybe on the store under `name` from now on, durably, before its put:
    after a crash or a failed put, `upload_log` looks for the log under that name only."""
    fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, f"{name}\n".encode())  # the newline ends a whole name (`_read_journal`)
        os.fsync(fd)
    finally:
        os.close(fd)
    sync_dir(journal.parent)


def _remove_local(path: Path, status: Path, journal: Path) -> None:
    os.unlink(path)  # the log first: a crash in between leaves a stray status or journal only
    for leftover in (status, journal):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(leftover)


def _archived(fs: Any, root: str, name: str, digest: Digest) -> bool:
    """Whether a pass archived this log as `name`: gone from incoming/, and in `archive/<day>/`
    (from the day of its rotation on) with the log's own bytes. Another log archived under that
    name (a name used twice) does not count: the log is put again rather than lost."""
    if _info(fs, remote_path(root, "incoming", name)) is not None:
        return False  # still there: `_put_once` finds it
    parsed = parse_log_name(name)
    first = parsed.rotated_at.strftime("%Y-%m-%d") if parsed is not None and parsed.rotated_at else ""
    try:
        days = fs.ls(remote_path(root, "archive"), detail=False, refresh=True)
    except FileNotFoundError:
        return False
    days = [day for day in days if day.rstrip("/").rsplit("/", 1)[-1] >= first]
    for day in days:
        target = remote_path(day, f"{name}.gz")
        if _info(fs, target) is not None and _archive_matches(fs, target, digest):
            return True
    return False


def _archive_matches(fs: Any, target: str, digest: Digest) -> bool:
    """The gzipped object at `target` holds the local log's bytes (read back: a rare path)."""
    md5, size = hashlib.md5(usedforsecurity=False), 0
    try:
        with fs.open(target, "rb", block_size=PART_SIZE) as remote_file, igzip.open(remote_file, "rb") as data:
            while chunk := data.read(PART_SIZE):
                md5.update(chunk)
                size += len(chunk)
    except (OSError, EOFError, ValueError) as exc:  # not a whole gzip: not this log's archive
        logger.warning("%s cannot be read as a gzip (%s); not taken for the log's archive", target, exc)
        return False
    return size == digest.size and md5.hexdigest() == digest.md5


def _put_once(
    fs: Any,
    root: str,
    path: Path,
    name: str,
    digest: Digest,
    part_size: int,
    status: Path | None = None,
    journal: Path | None = None,
) -> str:
    """Puts the log under `name` (its local `status` first), or finds it there from an earlier call
    that crashed before the local removal; another object under that name makes the next free name
    (a millisecond later). The name is recorded in `journal` before any put."""
    for _ in range(MAX_NAME_STEPS):
        target = remote_path(root, "incoming", name)
        info = _info(fs, target)
        if info is None:
            if journal is not None:
                _record_name(journal, name)
            if status is not None:  # only with the log: a status found up there may be a pass's, newer
                _put(fs, root, status, name + STATUS_SUFFIX, _digest(status, part_size), part_size)
            _put(fs, root, path, name, digest, part_size)
            return name
        if _matches(fs, target, info, digest):
            return name
        following = _next_name(name)
        if following is None:
            raise UploadError(f"{target} exists with other content; the log stays local")
        logger.warning("%s exists with other content (is server.name used twice?); trying %s", target, following)
        name = following
    raise UploadError(f"no free name for {path.name} after {MAX_NAME_STEPS} tries")


def _next_name(name: str) -> str | None:
    parsed = parse_log_name(name)
    if parsed is None or parsed.node is None or parsed.rotated_at is None:
        return None  # replay logs and logs with a status keep their names
    later = parsed.rotated_at + timedelta(milliseconds=1)
    return rotated_log_name(parsed.token_id, later, parsed.worker, parsed.node)


def _put(fs: Any, root: str, path: Path, name: str, digest: Digest, part_size: int) -> None:
    """Puts `path` at `incoming/<name>`, whole or not at all from a reader's point of view."""
    target = remote_path(root, "incoming", name)
    if atomic_puts(fs):
        fs.put_file(str(path), target, **put_options(fs, part_size))
        try:
            _verify(fs, target, digest)
        except UploadError:  # not left for a pass to load; the next attempt puts it again
            with contextlib.suppress(Exception):
                fs.rm_file(target)
            raise
        return
    # Elsewhere a put writes in place: write a name no pass parses, verify, then move.
    temporary = remote_path(root, "incoming", ".tmp", f"{name}.{uuid.uuid4().hex[:8]}.part")
    fs.makedirs(remote_path(root, "incoming", ".tmp"), exist_ok=True)
    try:
        fs.put_file(str(path), temporary)
        _verify(fs, temporary, digest)
        fs.mv(temporary, target)
    except BaseException:
        with contextlib.suppress(Exception):
            fs.rm_file(temporary)
        raise
    _sync_local(fs, target)
    _verify_size(fs, target, digest)


def _verify(fs: Any, target: str, digest: Digest) -> None:
    info = _info(fs, target)
    if info is None or not _matches(fs, target, info, digest):
        raise UploadError(f"{target} does not match the local log after the upload")


def _verify_size(fs: Any, target: str, digest: Digest) -> None:
    info = _info(fs, target)
    if info is None or info.get("size") != digest.size:
        raise UploadError(f"{target} is missing or of another size after the move")


def _info(fs: Any, target: str) -> dict[str, Any] | None:
    fs.invalidate_cache(target)  # s3fs answers from its listing cache otherwise
    try:
        return fs.info(target)
    except FileNotFoundError:
        return None


def _matches(fs: Any, target: str, info: dict[str, Any], digest: Digest) -> bool:
    """The object holds the local bytes: same size, and the same MD5 (the store's, else read back)."""
    if info.get("size") != digest.size:
        return False
    if _store_checksum(info) in (digest.md5, digest.multipart_etag):
        return True
    # No whole-object MD5 from the store (multipart ETag, SSE-KMS, file://), or one that is not
    # an MD5 after all: read it back.
    return _remote_md5(fs, target) == digest.md5


def _store_checksum(info: dict[str, Any]) -> str | None:
    """The object's MD5 as hex, or S3's multipart ETag, when the store's metadata gives it."""
    etag = str(info.get("ETag") or "").strip('"').lower()  # S3
    if etag:
        return etag
    md5_hash = info.get("md5Hash")  # GCS, base64
    if isinstance(md5_hash, str):
        with contextlib.suppress(binascii.Error, ValueError):
            return base64.b64decode(md5_hash).hex()
    return None


def _remote_md5(fs: Any, target: str) -> str:
    md5 = hashlib.md5(usedforsecurity=False)
    with fs.open(target, "rb", block_size=PART_SIZE) as remote_file:  # big reads: few requests
        while chunk := remote_file.read(PART_SIZE):
            md5.update(chunk)
    return md5.hexdigest()


def _digest(path: Path, part_size: int) -> Digest:
    md5, size, part_md5s = hashlib.md5(usedforsecurity=False), 0, []
    with path.open("rb") as local_file:
        while part := local_file.read(part_size):
            md5.update(part)
            part_md5s.append(hashlib.md5(part, usedforsecurity=False).digest())
            size += len(part)
    multipart = hashlib.md5(b"".join(part_md5s), usedforsecurity=False).hexdigest()
    return Digest(size, md5.hexdigest(), f"{multipart}-{len(part_md5s)}")


def _sync_local(fs: Any, target: str) -> None:
    """On a local filesystem (file://, an NFS mount), the moved log and its folder are fsynced
    before the local copy goes, so a power loss cannot lose both."""
    if protocols(fs)[0] not in ("file", "local"):
        return
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    sync_dir(Path(target).parent)


@contextlib.contextmanager
def _upload_lock(incoming: Path) -> Iterator[bool]:
    """An exclusive `flock` on `incoming/.upload.lock`, waited for up to LOCK_WAIT_SEC: processes
    (and threads) of one node upload one at a time, so none removes a log another is putting."""
    fd = os.open(incoming / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + LOCK_WAIT_SEC
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(0.1)
        yield True
    finally:
        os.close(fd)
