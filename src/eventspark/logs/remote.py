"""Rotated logs on object storage (`log.remote`): the filesystem of its URL, through fsspec.

Layout under the URL (the same names as under `log.path`):
- `incoming/<rotated log>` and `incoming/<rotated log>.status`: uploaded by every collector node
  after rotation (the node's name is in the log's name), read by the batch pass's executors in
  byte ranges; the status files are written by the pass's driver;
- `archive/YYYY-MM-DD/<rotated log>.gz`, `failed/…`: beside them.
"""

from __future__ import annotations

from typing import Any

from eventspark.config.models import RemoteLogs


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
        raise RemoteUnavailable(f"log.remote {remote.url!r}: {exc}") from exc
    return fs, root.rstrip("/")
