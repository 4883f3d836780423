"""Failed files: what `GET /api/v1/fallback` and `eventspark failed` list.

`<log.path>/failed/failed.dst=<id>.log` (`logs.failed`) collects a destination's failed events,
appended by the batch driver and by the stream worker; it never rotates. A replay
(`ops.replay`) moves the file into `failed/replayed/<replay id>/` before reading it, so new
failures start a new `failed.dst=<id>.log` and the listing shows what remains; the moved file
stays there with the replay's record (`replay.json`), until the retention policy of `failed/`
removes the folder (`logs.retention`; never while its replay runs: `replay_running`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

FAILED_DIR = "failed"
REPLAYED_DIR = "replayed"
RECORD_FILE = "replay.json"
READ_CHUNK = 1024 * 1024
_FAILED_NAME = re.compile(r"^failed\.dst=(?P<dst>.+)\.log$")


@dataclass(slots=True)
class FailedFile:
    """One failed file: pending in `failed/`, or moved by a replay into `failed/replayed/<id>/`."""

    file_name: str
    """Its name relative to `failed/` (what `POST /api/v1/replay` takes)."""
    destination_id: str
    path: Path
    replay: dict[str, Any] | None = None
    """The record of the replay that moved it (None: not replayed)."""
    tables_statuses: dict[str, dict[str, Any]] = field(default_factory=dict)


def failed_destination(name: str) -> str | None:
    """The destination id in a `failed.dst=<id>.log` name; None for anything else."""
    match = _FAILED_NAME.match(name)
    return None if match is None else match.group("dst")


def read_record(folder: Path) -> dict[str, Any] | None:
    try:
        record: dict[str, Any] = orjson.loads((folder / RECORD_FILE).read_bytes())
    except (FileNotFoundError, NotADirectoryError, orjson.JSONDecodeError):
        return None
    return record


@contextlib.contextmanager
def replay_running(folder: Path) -> Iterator[None]:
    """Held by a replay while it hands its events over (`ops.replay.hand_over`): an flock on its
    folder, which the kernel releases when the process dies, so a dead replay is never taken for
    a running one."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a folder of its own: nobody else holds it long
        yield
    finally:
        os.close(fd)


def replay_is_running(folder: Path) -> bool:
    """Whether a process holds `replay_running` on a replay's folder."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False  # removed meanwhile
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def replay_records(log_path: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(folder, record) of every replay, oldest first."""
    root = log_path / FAILED_DIR / REPLAYED_DIR
    for folder in sorted(root.iterdir()) if root.is_dir() else ():
        record = read_record(folder)
        if record is not None:
            yield folder, record


def failed_files(log_path: Path, destination_ids: set[str] | None = None, replayed: bool = True) -> list[FailedFile]:
    """Pending failed files, then (with `replayed`) those moved by replays; filtered by destination."""
    failed_dir = log_path / FAILED_DIR
    found = []
    for path in sorted(failed_dir.glob("failed.dst=*.log")) if failed_dir.is_dir() else ():
        dest_id = failed_destination(path.name)
        if dest_id is not None and path.is_file():
            found.append(FailedFile(path.name, dest_id, path))
    if replayed:
        for folder, record in replay_records(log_path):
            for path in sorted(folder.glob("failed.dst=*.log")):
                dest_id = failed_destination(path.name)
                if dest_id is not None:
                    name = f"{REPLAYED_DIR}/{folder.name}/{path.name}"
                    found.append(FailedFile(name, dest_id, path, record, replay_statuses(log_path, record)))
    if destination_ids:
        found = [f for f in found if f.destination_id in destination_ids]
    return found


def replay_statuses(log_path: Path, record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per table, whether a replay's events are loaded: from the status of its replay logs while
    they wait in `incoming/`, else from the answer of the pass that loaded them."""
    from eventspark.logs.status import read_status, status_to_json
    from eventspark.ops.passes import read_answer

    statuses: dict[str, dict[str, Any]] = {}
    for dest_id, target in record.get("destinations", {}).items():
        replay_log = target.get("replay_log")
        if not replay_log:
            continue
        pending = log_path / "incoming" / replay_log
        if pending.exists():
            statuses.update(status_to_json(read_status(pending)).get(dest_id, {}))
            continue
        answer = read_answer(log_path, target["request_id"]) if target.get("request_id") else None
        pairs = (answer or {}).get("pairs") or target.get("pairs") or []
        for pair in pairs:
            if pair["destination_id"] == dest_id and pair["table"]:
                statuses[pair["table"]] = {"uploaded": not pair["error"], "error": pair["error"]}
    return statuses


def count_lines(path: Path) -> int:
    """Newlines in a file, read in chunks (failed files can be large)."""
    lines = 0
    with path.open("rb") as file:
        while chunk := file.read(READ_CHUNK):
            lines += chunk.count(b"\n")
    return lines


def describe(file: FailedFile) -> dict[str, Any]:
    """EventNative's entry (`file_name`, `destination_id`, `tables_statuses`) and ours: size,
    events, modified time, whether and when it was replayed."""
    stat = file.path.stat()
    entry: dict[str, Any] = {
        "file_name": file.file_name,
        "destination_id": file.destination_id,
        "tables_statuses": file.tables_statuses,
        "size": stat.st_size,
        "events": count_lines(file.path),
        "modified": datetime.fromtimestamp(stat.st_mtime, UTC).isoformat(),
        "replayed": file.replay is not None,
    }
    if file.replay is not None:
        keys = ("id", "at", "state", "error", "events", "destinations")
        entry["replay"] = {key: file.replay[key] for key in keys if key in file.replay}
    return entry


def reasons(path: Path, top: int = 5) -> tuple[int, list[tuple[str, int]]]:
    """(events, the `top` most frequent reasons with their counts) of a failed file."""
    counter: Counter[str] = Counter()
    events = 0
    with path.open("rb") as file:
        for line in file:
            if not line.strip():
                continue
            events += 1
            try:
                error = orjson.loads(line).get("error")
            except (orjson.JSONDecodeError, AttributeError):
                error = None
            counter[_reason_key(error if isinstance(error, str) else "(unreadable line)")] += 1
    return events, counter.most_common(top)


def _reason_key(error: str) -> str:
    # Reasons that differ only in a value quoted in them group together; the first 200 characters.
    return re.sub(r"'[^']*'|\"[^\"]*\"|\b\d+\b", "…", error)[:200]
