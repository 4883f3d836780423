"""Archived logs on the store of `log.remote`, fetched for a replay.

With `log.remote` a pass archives the logs on the store (`<url>/archive/<day>/<log>.gz`), not
under `log.path`. A replay of `archive/<day>/<log>.gz` that is missing under `log.path` fetches it
from the store first, into `<log.path>/archive/<day>/` under the same name, then replays that
copy as any archived log (its record and the 409 of a second replay work as before; local
retention trims the copy with the local archive).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

from eventspark.config.models import Config, RemoteLogs

__all__ = ["ARCHIVE_DIR", "StoreUnreachable", "fetch_archived"]

ARCHIVE_DIR = "archive"


class StoreUnreachable(RuntimeError):
    """The store of `log.remote` did not answer the fetch (not a missing object)."""


def fetch_archived(config: Config, name: str) -> bool:
    """Fetches `archive/...` (`name` relative to `log.path`, already checked by
    `ops.replay.resolve_source`) from the store; True when it was fetched, False when the store
    has no such object (or there is no store)."""
    remote = config.log.remote
    parts = name.split("/")
    if remote is None or len(parts) < 2 or parts[0] != ARCHIVE_DIR:
        return False
    base = Path(config.log.path) / ARCHIVE_DIR
    base.mkdir(parents=True, exist_ok=True)
    # Fetched beside the day folders first: a missing object leaves no empty day folder behind.
    partial = base / f".fetch.{uuid.uuid4().hex[:8]}.part"
    try:
        if not _download(remote, parts, partial):
            return False
        local = base.joinpath(*parts[1:])
        local.parent.mkdir(parents=True, exist_ok=True)
        if not local.parent.resolve().is_relative_to(base.resolve()):
            return False  # a symbolic link leading out of archive/: resolve_source answers 404
        os.replace(partial, local)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()


def _download(remote: RemoteLogs, parts: list[str], partial: Path) -> bool:
    from eventspark.logs.remote import remote_filesystem, remote_path

    try:
        fs, root = remote_filesystem(remote)
        fs.get_file(remote_path(root, *parts), str(partial))  # one object: `get_file` expands no glob
    except FileNotFoundError:
        return False
    except Exception as exc:
        raise StoreUnreachable(f"{type(exc).__name__}: {exc}") from exc
    return True
