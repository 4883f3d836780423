"""Object names of the files family, and the "dialect" that checks table names as folder names.

An object holds the events of one rotated log (or of one split of it, when the batch job cut the
log into several Spark tasks) for one table:

    <folder>/<table>/<log>.<ext>[.gz]                  the whole log
    <folder>/<table>/<log>.part-<start>.<ext>[.gz]     the lines starting at byte <start> of it

`<log>` is the rotated log's file name without `.log`, `<start>` a 12-digit byte offset. The
same log and split always give the same name, so a rerun overwrites what an earlier pass wrote;
when a rerun cuts a log differently, the driver removes the parts it did not write (`stale`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from eventspark.destinations.dialect import Dialect
from eventspark.steps.typing import DataType

Format = Literal["json", "flat_json", "csv", "parquet"]
Compression = Literal["", "gzip"]

EXTENSIONS: dict[str, str] = {"json": "ndjson", "flat_json": "ndjson", "csv": "csv", "parquet": "parquet"}
MAX_TABLE_BYTES = 255
"""Longest table name (a folder name), in UTF-8 bytes: what common filesystems take, so that
objects can be copied to disk; S3 and GCS names may hold 1024 bytes in all."""
MAX_KEY_BYTES = 1024
"""Longest object name S3 and GCS take, in UTF-8 bytes."""
MAX_FOLDER_BYTES = MAX_KEY_BYTES - (MAX_TABLE_BYTES + 1) - (255 + 1) - len(".part-000000000000.parquet.gz")
"""Longest `folder`: what an object name leaves once the table (255 bytes at most), the log's
name (a file name: 255 bytes at most) and the longest suffix are in, so no name is refused."""
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_OBJECT_SUFFIXES = {ext: re.compile(rf"(?:part-\d{{12}}\.)?{ext}(?:\.gz)?") for ext in sorted(set(EXTENSIONS.values()))}


def clean_folder(folder: str) -> str:
    """The configured `folder` without leading or trailing slashes ('' for none)."""
    return folder.strip().strip("/")


def check_folder(folder: str) -> str:
    """The `folder` key as given, or ValueError: no control characters, short enough that every
    object name fits (`MAX_FOLDER_BYTES`)."""
    clean = clean_folder(folder)
    if _CONTROL_CHARS.search(clean):
        raise ValueError("folder holds control characters")
    size = len(clean.encode("utf-8", errors="replace"))
    if size > MAX_FOLDER_BYTES:
        raise ValueError(f"folder is {size} bytes long; object names leave it {MAX_FOLDER_BYTES} at most")
    return folder


def check_endpoint(endpoint: str) -> str:
    """An endpoint override as given ('' for none), or ValueError: an http(s) URL with a host."""
    from urllib.parse import urlsplit

    if not endpoint:
        return endpoint
    try:
        url = urlsplit(endpoint)
        url.port  # noqa: B018 - raises ValueError for a port that is not a number or out of range
    except ValueError as exc:
        raise ValueError(f"endpoint is not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.hostname or any(c.isspace() for c in endpoint):
        raise ValueError("endpoint must be an http:// or https:// URL with a host, e.g. https://storage.example.com")
    return endpoint


def log_stem(log: str) -> str:
    return log[: -len(".log")] if log.endswith(".log") else log


def log_prefix(folder: str, table: str, log: str) -> str:
    """The prefix shared by every object of `log` in `table` (and by no other log's)."""
    head = f"{folder}/" if folder else ""
    return f"{head}{table}/{log_stem(log)}."


def object_key(folder: str, table: str, log: str, start: int, whole: bool, fmt: str, compression: str) -> str:
    part = "" if whole else f"part-{start:012d}."
    gz = ".gz" if compression == "gzip" and fmt != "parquet" else ""
    return f"{log_prefix(folder, table, log)}{part}{EXTENSIONS[fmt]}{gz}"


def stale(prefix: str, listed: Iterable[str], written: set[str], fmt: str) -> list[str]:
    """Objects of one log and table (`log_prefix`) in format `fmt`'s extension (gzipped or not)
    that this pass did not write: an earlier pass cut the log into other splits. Objects of
    another extension are never stale: they are not this destination's (or an earlier format's,
    left as they are)."""
    suffix = _OBJECT_SUFFIXES[EXTENSIONS[fmt]]
    return sorted(key for key in listed if key not in written and suffix.fullmatch(key[len(prefix) :]) is not None)


class ObjectNames(Dialect):
    """The files family's `Dialect`: `DestinationType` wants one, and shared code uses its `quote`
    to refuse table names before any event goes to them. A table is a folder here, so `quote`
    checks a path segment and returns it unchanged; `types` are the Parquet (Arrow) types of the
    typed format's columns. There is no SQL: `literal` is never called."""

    def quote(self, identifier: str) -> str:
        if not identifier:
            raise ValueError("a table (folder) name cannot be empty")
        if _CONTROL_CHARS.search(identifier):
            raise ValueError(f"table name {identifier!r} holds control characters")
        if "/" in identifier or "\\" in identifier:
            raise ValueError(f"table name {identifier!r} holds a slash: it names one folder")
        if identifier in (".", ".."):
            raise ValueError(f"table name {identifier!r} is not a folder name")
        try:
            size = len(identifier.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ValueError(f"table name {identifier!r} is not valid Unicode") from exc
        if size > MAX_TABLE_BYTES:
            raise ValueError(f"table name {identifier[:40]!r}... is longer than {MAX_TABLE_BYTES} bytes")
        return identifier


OBJECT_NAMES = ObjectNames(
    name="files",
    types={
        DataType.BOOL: "bool",
        DataType.INT64: "int64",
        DataType.FLOAT64: "double",
        DataType.STRING: "string",
        DataType.TIMESTAMP: "timestamp[us, tz=UTC]",
    },
    max_identifier_length=MAX_TABLE_BYTES,
)
