"""Status files: which destination/table pairs of a rotated log are uploaded.

`incoming/<rotated log>.status` holds EventNative's DestinationStatus JSON:
`{"<destination_id>": {"<table>": {"uploaded": true, "error": ""}}}`. A destination with an
empty object was processed for the log but produced no table (every event skipped or failed in
its template). Files are replaced atomically so a crash leaves the old or the new status, never half.

A pair that failed also carries the retry policy's counters (`eventspark.retry`, extra keys that
EventNative ignores): `attempts`, `first_failed`, `last_attempt` and `next_attempt` (epoch
seconds), and `gave_up: true` once its events went to `failed/` past the maximum age. Table ''
(`NO_TABLE`) is the destination-wide pair: the destination could not be reached for the log.
A pair not settled also lists the splits executors wrote straight into its table (`written`,
`Split.key`s) and the table's column types they were checked against (`columns`): a pass that
cannot reach the destination to read their load markers and its tables knows them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

STATUS_SUFFIX = ".status"


@dataclass(slots=True)
class PairStatus:
    """The outcome of loading one destination/table pair of a log."""

    uploaded: bool
    error: str = ""
    attempts: int = 0
    """Failed attempts so far (0: never failed, or a status file written before the retry policy)."""
    first_failed: float = 0.0
    last_attempt: float = 0.0
    next_attempt: float = 0.0
    """Not retried before this time (epoch seconds); 0: at the next pass."""
    gave_up: bool = False
    """Past the retry policy's maximum age, its events went to `failed/`: settled, not loaded."""
    written: tuple[str, ...] = ()
    """Split keys (`Split.key`) written directly into the table, with their load markers, while the
    pair is not settled: when the destination cannot be reached past the maximum age (its markers
    unread), the give-up sends the other splits' events to `failed/`, not theirs (their rows are in
    the table). Dropped once the pair is settled."""
    columns: dict[str, str] = field(default_factory=dict)
    """With `written`: column → SQL type of the table when the pass last read it, so that the rows
    of those splits are checked as a direct write checks them (their failures go to `failed/`)
    by a pass that cannot read the table."""

    @property
    def settled(self) -> bool:
        """Nothing left to do for the pair: uploaded, or given up (its events are in `failed/`)."""
        return self.uploaded or self.gave_up

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"uploaded": self.uploaded, "error": self.error}
        if self.attempts or self.gave_up:
            data.update(
                attempts=self.attempts,
                first_failed=self.first_failed,
                last_attempt=self.last_attempt,
                next_attempt=self.next_attempt,
            )
        if self.gave_up:
            data["gave_up"] = True
        if self.written and not self.settled:
            data["written"] = sorted(self.written)
            if self.columns:
                data["columns"] = self.columns
        return data

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> PairStatus:
        """Reads an entry; counters of a wrong type (a hand-edited file) read as 0."""
        return cls(
            bool(entry.get("uploaded")),
            str(entry.get("error") or ""),
            int(_number(entry.get("attempts"))),
            _number(entry.get("first_failed")),
            _number(entry.get("last_attempt")),
            _number(entry.get("next_attempt")),
            entry.get("gave_up") is True,
            _strings(entry.get("written")),
            _string_map(entry.get("columns")),
        )

    def failed_again(self, later: PairStatus) -> PairStatus:
        """This failed pair after `later`, another failed attempt: counters added up."""
        firsts = [t for t in (self.first_failed, later.first_failed) if t > 0]
        return PairStatus(
            False,
            later.error,
            self.attempts + max(later.attempts, 1),
            min(firsts) if firsts else 0.0,
            max(self.last_attempt, later.last_attempt),
            max(self.next_attempt, later.next_attempt),
            written=_union(self.written, later.written),
            columns=later.columns or self.columns,
        )


def _strings(value: Any) -> tuple[str, ...]:
    """A list of strings read from a status file (anything else: none)."""
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _string_map(value: Any) -> dict[str, str]:
    """A JSON object of strings read from a status file (other entries left out)."""
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def _union(first: tuple[str, ...], second: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(set(first) | set(second)))


def _number(value: Any) -> float:
    # bool is an int: `true` is not a time.
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


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
            table: PairStatus.from_json(entry) for table, entry in tables.items() if isinstance(entry, dict)
        }
    return status


def status_to_json(status: LogStatus) -> dict[str, dict[str, dict[str, Any]]]:
    return {dest_id: {table: s.to_json() for table, s in tables.items()} for dest_id, tables in status.items()}


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
    """True when every recorded pair is settled (uploaded or given up): the log can go to the archive."""
    return all(s.settled for tables in status.values() for s in tables.values())


def processed(status: LogStatus, dest_id: str) -> bool:
    """Whether a pass processed the log for `dest_id` (its template failures are written then):
    it has a table entry, or none at all; a destination never reached has only a failed ''."""
    tables = status.get(dest_id)
    if tables is None:
        return False
    return any(table != "" or pair.settled for table, pair in tables.items()) or not tables


def merge_status(old: LogStatus, new: LogStatus) -> LogStatus:
    """`old` updated with this pass's outcomes: a settled pair never goes back to failed, and a pair
    failing again keeps counting its attempts from its first failure (`PairStatus.failed_again`)
    and the splits written directly into its table by every pass (`PairStatus.written`)."""
    merged = {dest_id: dict(tables) for dest_id, tables in old.items()}
    for dest_id, tables in new.items():
        into = merged.setdefault(dest_id, {})
        for table, outcome in tables.items():
            before = into.get(table)
            if before is None or (not before.settled and outcome.settled):
                into[table] = outcome
            elif not before.settled:
                # attempts == 0: deferred to the next pass, not a failure (`batch.load.Deferred`)
                if outcome.attempts:
                    into[table] = before.failed_again(outcome)
                else:
                    written = _union(before.written, outcome.written)
                    into[table] = replace(outcome, written=written, columns=outcome.columns or before.columns)
    return merged
