"""The files behind `/s/<name>` and `/t/<name>`: found, read once, kept in memory with gzip and ETag.

Where a name is looked for, first to last: `server.static_files_dir` (EventNative's setting, relative
to the working directory as there), then the `@jitsu/sdk-js` web build fetched at install time
(`eventspark.sdk`). Only `.js` and `.js.map` files directly in those directories are served, under a
strict name check, and only when the resolved path is still inside the directory (a symbolic link
that leads out is refused). A file is re-read when its size or modification time changes, so a new
`lib.js` needs no restart; at most `MAX_CACHED` files of at most `MAX_FILE_BYTES` are kept.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from pathlib import Path

from eventspark.sdk import FILE_NAME, web_dir

SERVED_SUFFIXES = (".js", ".js.map")
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_CACHED = 32


@dataclass(frozen=True, slots=True)
class Asset:
    """One served file as it is answered."""

    body: bytes
    gzipped: bytes
    etag: bytes
    stamp: tuple[int, int, int]
    """(inode, size, mtime in ns) when read: a change means the file must be read again."""


_cache: dict[Path, Asset] = {}


def servable(name: str) -> bool:
    """Whether `name` may be looked up at all: a plain file name with a served suffix."""
    return bool(FILE_NAME.fullmatch(name)) and name.endswith(SERVED_SUFFIXES)


def own_directories(static_files_dir: str | None) -> list[Path]:
    """The operator's directories: the only place an `inline.js` template is looked for."""
    return [Path(static_files_dir)] if static_files_dir else []


def directories(static_files_dir: str | None) -> list[Path]:
    """Where files are looked for, first to last."""
    return [*own_directories(static_files_dir), web_dir()]


def find_file(name: str, search: list[Path]) -> Path | None:
    """The first regular file called `name` in `search` that resolves inside its directory."""
    if not servable(name):
        return None
    for directory in search:
        try:
            root = directory.resolve(strict=True)
            path = (root / name).resolve(strict=True)
        except OSError:
            continue
        if path.parent == root and path.is_file():
            return path
    return None


def load(path: Path) -> Asset | None:
    """The file's asset, from memory while it is unchanged; None when gone or too large."""
    try:
        info = path.stat()
    except OSError:
        return None
    stamp = (info.st_ino, info.st_size, info.st_mtime_ns)
    cached = _cache.get(path)
    if cached is not None and cached.stamp == stamp:
        return cached
    if info.st_size > MAX_FILE_BYTES:
        return None
    try:
        body = path.read_bytes()[: MAX_FILE_BYTES + 1]
    except OSError:
        return None
    if len(body) > MAX_FILE_BYTES:
        return None
    asset = Asset(body, gzip.compress(body, compresslevel=9, mtime=0), etag(body), stamp)
    if len(_cache) >= MAX_CACHED and path not in _cache:
        _cache.pop(next(iter(_cache)))  # the oldest entry: the cache stays bounded
    _cache[path] = asset
    return asset


def read_template(path: Path) -> bytes | None:
    """An `inline.js` template's bytes (bounded), or None."""
    asset = load(path)
    return None if asset is None else asset.body


def etag(body: bytes) -> bytes:
    """A strong ETag of a body (a served file, or a rendered inline.js)."""
    return b'"' + hashlib.sha256(body).hexdigest()[:32].encode() + b'"'
