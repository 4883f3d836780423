"""Status files: which destination/table pairs of a rotated log are uploaded.

`incoming/<rotated log>.status` holds EventNative's DestinationStatus JSON:
`{"<destination_id>": {"<table>": {"uploaded": true, "error": ""}}}`. A destination with an
empty object was processed for the log but produced no table (every event skipped or failed in
its template). Files are replaced atomically so a crash leaves the old or the new status, never half.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

STATUS_SUFFIX = ".status"


@dataclass(slots=True)
class PairStatus:
    """The outcome of loading one destination/table pair of a log."""

    uploaded: bool
    error: str = ""


LogStatus = dict[str, dict[str, PairStatus]]
"""destination id → table → status."""


def status_path(log: Path) -> Path:
    """Where the status of rotated log `log` lives: beside it, with `.status` appended."""
    return log.with_name(log.name + STATUS_SUFFIX)


def read_status(log: Path) -> LogStatus:
    """The status of `log`; empty when it has none yet (or when the file is unreadable garbage)."""
    try:
        raw = orjson.loads(status_path(log).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}
    return parse_status(raw)


def parse_status(raw: Any) -> LogStatus:
    """Reads the JSON form, ignoring entries that do not have the expected shape."""
    status: LogStatus = {}
    if not isinstance(raw, dict):
        return status
    for dest_id, tables in raw.items():
        if not isinstance(tables, dict):
            continue
        status[dest_id] = {
            table: PairStatus(bool(entry.get("uploaded")), str(entry.get("error") or ""))
            for table, entry in tables.items()
            if isinstance(entry, dict)
        }
    return status


def status_to_json(status: LogStatus) -> dict[str, dict[str, dict[str, Any]]]:
    return {
        dest_id: {table: {"uploaded": s.uploaded, "error": s.error} for table, s in tables.items()}
        for dest_id, tables in status.items()
    }


def write_status(log: Path, status: LogStatus) -> None:
    """Replaces the status file of `log` atomically (write a temporary file, then rename)."""
    replace_file(status_path(log), orjson.dumps(status_to_json(status), option=orjson.OPT_INDENT_2))


def replace_file(target: Path, data: bytes) -> None:
    """Writes `data` to a temporary file and renames it over `target`: a crash, or a power loss
    (the data and the rename are fsynced), leaves the old or the new."""
    tmp = target.with_name(target.name + ".tmp")
    with tmp.open("wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, target)
    sync_dir(target.parent)


def sync_dir(folder: Path) -> None:
    """fsyncs a folder, so that files created, renamed or removed in it stay so after a power loss."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def uploaded_tables(status: LogStatus, dest_id: str) -> frozenset[str]:
    """Tables of `dest_id` already uploaded from this log: their events are skipped on a retry."""
    return frozenset(table for table, s in status.get(dest_id, {}).items() if s.uploaded)


def all_uploaded(status: LogStatus) -> bool:
    """True when every recorded pair is uploaded: the log can go to the archive."""
    return all(s.uploaded for tables in status.values() for s in tables.values())


def merge_status(old: LogStatus, new: LogStatus) -> LogStatus:
    """`old` updated with this pass's outcomes; an uploaded pair never goes back to failed."""
    merged = {dest_id: dict(tables) for dest_id, tables in old.items()}
    for dest_id, tables in new.items():
        into = merged.setdefault(dest_id, {})
        for table, outcome in tables.items():
            if not (table in into and into[table].uploaded):
                into[table] = outcome
    return merged
