"""Rotated logs on object storage (`log.remote`): the filesystem of its URL, through fsspec.

Layout under the URL (the same names as under `log.path`):
- `incoming/<rotated log>` and `incoming/<rotated log>.status`: uploaded by every collector node
  after rotation (the node's name is in the log's name), read by the batch pass's executors in
  byte ranges; the status files are written by the pass's driver;
- `archive/YYYY-MM-DD/<rotated log>.gz`, `failed/…`: beside them.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from eventspark.config.models import RemoteLogs
from eventspark.logs.incoming import GLOB_CHARACTERS

log = logging.getLogger(__name__)

ATOMIC_PUT_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "az"})
"""Object stores where a put is atomic (a reader sees the whole object or none): a log is put
under its final name. Elsewhere (file://, sftp, ...) it is written under `incoming/.tmp/` and
moved once verified (`eventspark.logs.upload`)."""

PUT_OPTIONS: dict[str, dict[str, Any]] = {
    # s3fs reads a log below 2 parts into memory and puts it whole, else multipart, `chunksize` a
    # part, `max_concurrency` parts in memory at once; gcsfs uploads in `chunksize` pieces.
    "s3": {"max_concurrency": 2},
    "s3a": {"max_concurrency": 2},
    "gs": {},
    "gcs": {},
}
"""Extra `put_file` options of the stores that take a part size (`chunksize`, set per call)."""


class RemoteUnavailable(RuntimeError):
    """The remote filesystem cannot be used: its fsspec implementation is not installed, or the
    URL is not one fsspec knows."""


def remote_filesystem(remote: RemoteLogs) -> tuple[Any, str]:
    """(fsspec filesystem, root path without the protocol) of `remote`; imported lazily, so that a
    config without `log.remote` needs no fsspec."""
    try:
        from fsspec.core import url_to_fs
    except ModuleNotFoundError as exc:
        raise RemoteUnavailable("log.remote needs fsspec: pip install 'eventspark[remote-s3]' (or remote-gcs)") from exc
    try:
        fs, root = url_to_fs(remote.url, **remote.storage_options)
    except (ImportError, ValueError) as exc:  # e.g. s3fs missing for s3://
        raise RemoteUnavailable(f"log.remote {remote.shown_url!r}: {exc}") from exc
    return fs, root.rstrip("/")


EXTRAS = {"s3": "remote-s3", "s3a": "remote-s3", "gs": "remote-gcs", "gcs": "remote-gcs"}
"""The pip extra that installs a protocol's fsspec implementation."""


def require_remote(remote: RemoteLogs) -> None:
    """RemoteUnavailable, naming the pip extra, when fsspec or the package of the URL's protocol
    is missing; imports the implementation without building a filesystem (no credentials, no I/O)."""
    protocol = remote.url.partition("://")[0]
    extra = EXTRAS.get(protocol, "remote-s3")
    try:
        from fsspec.registry import get_filesystem_class
    except ModuleNotFoundError as exc:
        raise RemoteUnavailable(f"log.remote needs fsspec: pip install 'eventspark[{extra}]'") from exc
    try:
        get_filesystem_class(protocol)
    except (ImportError, ValueError) as exc:
        hint = f": pip install 'eventspark[{extra}]'" if protocol in EXTRAS else ""
        raise RemoteUnavailable(f"log.remote {remote.shown_url!r}: {exc}{hint}") from exc


def remote_path(root: str, *parts: str) -> str:
    """`root/part/...`: the path of an object under the remote root, in fsspec's `/` syntax."""
    return "/".join([root.rstrip("/"), *(part.strip("/") for part in parts)])


def protocols(fs: Any) -> tuple[str, ...]:
    """The protocol names of an fsspec filesystem (`fs.protocol` is a string or a tuple)."""
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def atomic_puts(fs: Any) -> bool:
    """True when a put on `fs` is atomic for readers (`ATOMIC_PUT_PROTOCOLS`)."""
    return not ATOMIC_PUT_PROTOCOLS.isdisjoint(protocols(fs))


def put_options(fs: Any, part_size: int) -> dict[str, Any]:
    """`put_file` options of `fs` that keep a big log out of memory (parts of `part_size`); none for
    stores that stream on their own (a local copy)."""
    for protocol in protocols(fs):
        if protocol in PUT_OPTIONS:
            return {"chunksize": part_size, **PUT_OPTIONS[protocol]}
    return {}


def remove_listed(fs: Any, paths: list[str]) -> None:
    """Deletes `paths` (keys found by a listing) in one bulk request (`fs.rm(list)`: S3 deletes
    1,000 keys a request). s3fs and gcsfs read `*`, `?` and `[` in those paths as globs, so a key
    holding one (never a name eventspark writes: `with_node` encodes them) would remove every key
    it matches: such keys are skipped, with a warning. A filesystem that stops at a missing path
    (`file://`: another node removed it first) goes on one by one, missing ones skipped."""
    plain = [path for path in paths if not GLOB_CHARACTERS.search(path)]
    for path in paths:
        if GLOB_CHARACTERS.search(path):
            log.warning("log.remote: %s holds a glob character (*, ? or [): not removed, remove it by hand", path)
    if not plain:
        return
    try:
        fs.rm(plain)
    except FileNotFoundError:
        for path in plain:
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(path)
