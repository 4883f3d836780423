"""What waits, what failed and what loaded last, per destination, read from the files under `log.path`.

For `eventspark status`, `GET /api/v1/status` and the gauges of `/prometheus`: any process can
compute it, whether `serve` runs or not, because it only reads files.

* batch: the events in the live incoming logs of the destination's tokens, plus those in the
  rotated (and replay) logs whose status file does not show the destination's every table uploaded.
  A log with one failed table counts wholly: it is read again for that table on the next pass.
* stream: the records of the destination's persistent queue after the consumer's acknowledged
  offsets (`offsets.json`), i.e. not delivered (or sent to `failed/`) yet.
* failed: the lines of `failed/failed.dst=<id>.log`; the last load and error: `ops.state`.

Counting lines of big logs on every scrape would be slow, so a `StatusReader` remembers what it
counted per file (by device and inode, which a rename keeps, checked against the file's first bytes
so a reused inode is noticed) and per queue segment, and only reads what was appended since. A read
counts at most `budget` new bytes; the rest is estimated from the average line length and the
status says `exact: false` until later reads have caught up.
"""

from __future__ import annotations

import os
import re
import threading
import time
from bisect import bisect_right
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from eventspark.config.models import Config
from eventspark.config.routing import token_routes
from eventspark.logs.failed import failed_log_path
from eventspark.logs.incoming import parse_log_name
from eventspark.logs.replay import replay_destination
from eventspark.logs.status import LogStatus, read_status
from eventspark.ops.metrics import pipeline_metrics
from eventspark.ops.state import read_state
from eventspark.stream.queue import OFFSETS_FILE, queue_dir, read_retry_state
from eventspark.stream.segments import FRAME, MAGIC, MAX_RECORD, list_segments, segment_name

BUDGET_BYTES = 32 * 1024 * 1024
"""New bytes one read counts at most (about 70 ms on a slow machine); the rest is estimated."""
UNLIMITED = 1 << 62
"""A budget for one-shot readers (the CLI): everything is counted."""
CHUNK = 1024 * 1024
HEAD_BYTES = 256
FIRST_LINE_BYTES = 64 * 1024
AVERAGE_LINE = 1024
"""Bytes per event assumed before anything was counted."""
MARK_EVERY = 64
"""A queue segment's index keeps the position of every 64th record."""
_TIMESTAMP = re.compile(rb'"_timestamp"\s*:\s*"([^"]{10,40})"')


@dataclass(slots=True)
class DestinationStatus:
    """One destination's backlog and history (ages and times in seconds, times since the epoch)."""

    destination: str
    mode: str
    queue_events: int = 0
    """Events not loaded yet: batch, `live_events + pending_log_events`; stream, not acknowledged."""
    live_events: int = 0
    pending_logs: int = 0
    pending_log_events: int = 0
    oldest_pending_age: float | None = None
    """Age of the oldest waiting event (its `_timestamp`); None when nothing waits."""
    failed_events: int = 0
    last_load_at: float | None = None
    last_load_events: int = 0
    last_event_age: float | None = None
    """Age of the newest loaded event's `_timestamp` (stream destinations)."""
    last_error: str = ""
    last_error_at: float | None = None
    retry_attempts: int = 0
    """Consecutive failed delivery attempts (stream: since the destination's last progress, from
    `retry.json` in its queue); 0 while deliveries succeed."""
    retry_oldest_age: float | None = None
    """Seconds since the first of those failed attempts (the retry policy's age); None: not failing."""
    retry_pending_pairs: int = 0
    """Batch: (rotated log, table) pairs that failed and wait for their next attempt (status files);
    `retry_attempts` is then the most attempts of one of them, `retry_oldest_age` the oldest's age."""
    exact: bool = True
    """False when part of a count is an estimate (more new bytes than one read counts)."""
    _oldest: float | None = field(default=None, repr=False)

    def waiting_since(self, timestamp: float | None) -> None:
        if timestamp is not None and (self._oldest is None or timestamp < self._oldest):
            self._oldest = timestamp

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("_oldest")
        return data


# --- reading timestamps ---------------------------------------------------------------------------


def parse_timestamp(text: str) -> float | None:
    """Seconds since the epoch of an event's `_timestamp` (ISO 8601; naive means UTC); None if unreadable."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return (parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)).timestamp()


def event_timestamp(data: bytes) -> float | None:
    """The `_timestamp` of the event that `data` starts with (a line, or its first bytes)."""
    line = data.split(b"\n", 1)[0]
    try:
        event = orjson.loads(line)
        text = event.get("_timestamp") if isinstance(event, dict) else None
    except orjson.JSONDecodeError:  # cut at FIRST_LINE_BYTES: look for the key
        match = _TIMESTAMP.search(line)
        text = match.group(1).decode("ascii", "replace") if match else None
    return parse_timestamp(text) if isinstance(text, str) else None


# --- counting lines -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Counted:
    head: bytes
    size: int = 0
    lines: int = 0
    line_end: int = 0
    """Where the last counted line ends."""
    first: float | None = None


class _Budget:
    def __init__(self, total: int) -> None:
        self.total = self.left = total

    def take(self, wanted: int) -> int:
        granted = min(wanted, self.left)
        self.left -= granted
        return granted


class LineCounter:
    """Lines of append-only files, counted once: only appended bytes are read again."""

    def __init__(self, budget: _Budget) -> None:
        self.budget = budget
        self._files: dict[tuple[int, int], _Counted] = {}
        self._seen: set[tuple[int, int]] = set()

    def forget_unseen(self) -> None:
        """Drops what files not looked at since the last call were (deleted, archived)."""
        self._files = {key: entry for key, entry in self._files.items() if key in self._seen}
        self._seen = set()

    def count(self, path: Path) -> tuple[int, bool, float | None]:
        """(lines, exact, the first event's `_timestamp` in epoch seconds); a missing file has none."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return 0, True, None
        try:
            return self._count(fd)
        finally:
            os.close(fd)

    def _count(self, fd: int) -> tuple[int, bool, float | None]:
        stat = os.fstat(fd)
        key = (stat.st_dev, stat.st_ino)
        self._seen.add(key)
        entry = self._files.get(key)
        head = os.pread(fd, HEAD_BYTES, 0)
        if entry is None or stat.st_size < entry.size or not head.startswith(entry.head):
            entry = self._files[key] = _Counted(head)  # new, truncated, or a reused inode
        entry.head = head
        while entry.size < stat.st_size:
            data = os.pread(fd, self.budget.take(min(CHUNK, stat.st_size - entry.size)), entry.size)
            if not data:
                break
            newlines = data.count(b"\n")
            if newlines:
                entry.lines += newlines
                entry.line_end = entry.size + data.rindex(b"\n") + 1
            entry.size += len(data)
        if entry.first is None and entry.lines:
            entry.first = event_timestamp(os.pread(fd, FIRST_LINE_BYTES, 0))
        if entry.size >= stat.st_size:
            return entry.lines, True, entry.first
        per_line = entry.line_end / entry.lines if entry.lines else AVERAGE_LINE
        return entry.lines + round((stat.st_size - entry.line_end) / per_line), False, entry.first


# --- counting queue records -----------------------------------------------------------------------


@dataclass(slots=True)
class _Segment:
    scanned: int = len(MAGIC)
    count: int = 0
    marks: list[int] = field(default_factory=list)
    """The position of record i * MARK_EVERY, for i = 0, 1, ..."""
    ended: bool = False


class QueueCounter:
    """Records of a stream destination's queue after the acknowledged offsets; segments are indexed
    once (sparse positions) and only their appended bytes are read again."""

    def __init__(self, budget: _Budget) -> None:
        self.budget = budget
        self._segments: dict[tuple[int, int, str], _Segment] = {}
        self._seen: set[tuple[int, int, str]] = set()

    def forget_unseen(self) -> None:
        self._segments = {key: seg for key, seg in self._segments.items() if key in self._seen}
        self._seen = set()

    def pending(self, directory: Path) -> tuple[int, bool, float | None]:
        """(records not acknowledged, exact, the oldest one's `_timestamp` in epoch seconds)."""
        offsets = _read_offsets(directory)
        total, exact, oldest = 0, True, None
        for writer, seqs in list_segments(directory).items():
            acked_seq, acked_at = offsets.get(writer, (seqs[0], len(MAGIC)))
            first: float | None = None
            found_first = False  # a writer's first pending record is its oldest
            for seq in seqs:
                if seq < acked_seq:
                    continue
                start = max(acked_at, len(MAGIC)) if seq == acked_seq else len(MAGIC)
                path = directory / segment_name(writer, seq)
                count, whole, timestamp = self._segment(path, start, want_first=not found_first)
                total, exact = total + count, exact and whole
                if count and not found_first:
                    found_first, first = True, timestamp
            if first is not None and (oldest is None or first < oldest):
                oldest = first
        return total, exact, oldest

    def _segment(self, path: Path, start: int, want_first: bool) -> tuple[int, bool, float | None]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # consumed and deleted meanwhile
            return 0, True, None
        try:
            stat = os.fstat(fd)
            key = (stat.st_dev, stat.st_ino, path.name)
            self._seen.add(key)
            seg = self._segments.setdefault(key, _Segment())
            self._scan(fd, seg, stat.st_size)
            count = seg.count - self._records_before(fd, seg, start)
            unscanned = 0 if seg.ended else max(0, stat.st_size - max(seg.scanned, start))
            if unscanned:
                per_record = (seg.scanned - len(MAGIC)) / seg.count if seg.count else AVERAGE_LINE
                count += round(unscanned / per_record)
            first = _record_timestamp(fd, start) if count > 0 and want_first else None
            return count, not unscanned, first
        finally:
            os.close(fd)

    def _scan(self, fd: int, seg: _Segment, size: int) -> None:
        """Indexes the complete records appended since the last scan (no CRC check: the worker does it)."""
        while not seg.ended and seg.scanned < size:
            wanted = self.budget.take(min(CHUNK, size - seg.scanned))
            data = os.pread(fd, wanted, seg.scanned) if wanted else b""
            pos = 0
            while pos + FRAME.size <= len(data):
                length, _crc = FRAME.unpack_from(data, pos)
                if length == 0 or length >= MAX_RECORD:
                    seg.ended = True  # the end marker, or garbage the worker skips to the next segment
                    break
                if seg.scanned + pos + FRAME.size + length > size:
                    break  # a record still being written
                if seg.count % MARK_EVERY == 0:
                    seg.marks.append(seg.scanned + pos)
                seg.count += 1
                pos += FRAME.size + length
            seg.scanned += pos
            if pos == 0:
                return  # nothing complete (or no budget left): the next read goes on

    def _records_before(self, fd: int, seg: _Segment, position: int) -> int:
        """Records of the segment that start before `position` (a record boundary: an acknowledged offset)."""
        index = bisect_right(seg.marks, position) - 1
        if index < 0:
            return 0
        count, at = index * MARK_EVERY, seg.marks[index]
        while at < position and count < seg.count:  # at most MARK_EVERY small reads
            at += FRAME.size + FRAME.unpack(os.pread(fd, FRAME.size, at))[0]
            count += 1
        return count


def _read_offsets(directory: Path) -> dict[str, tuple[int, int]]:
    try:
        raw = orjson.loads((directory / OFFSETS_FILE).read_bytes())
        return {str(w): (int(v[0]), int(v[1])) for w, v in raw.items()}
    except (OSError, orjson.JSONDecodeError, TypeError, ValueError, IndexError, AttributeError):
        return {}  # the consumer then redelivers from the oldest segment: so is it counted


def _record_timestamp(fd: int, position: int) -> float | None:
    header = os.pread(fd, FRAME.size, position)
    if len(header) < FRAME.size:
        return None
    length = FRAME.unpack(header)[0]
    return event_timestamp(os.pread(fd, min(length, FIRST_LINE_BYTES), position + FRAME.size))


# --- the status of every destination --------------------------------------------------------------


class StatusReader:
    """Computes `DestinationStatus`es for one config; keeps its counts between reads (thread-safe)."""

    def __init__(self, config: Config, budget: int = BUDGET_BYTES) -> None:
        self.config = config
        self.log_path = Path(config.log.path)
        self._budget = _Budget(budget)
        self._lines = LineCounter(self._budget)
        self._queues = QueueCounter(self._budget)
        self._lock = threading.Lock()
        self.held: list[str] = []
        """The rotated logs of the last `read` that no batch destination takes (their token is not
        in api_keys, or routed to stream destinations only): a batch pass leaves them in incoming/
        (`BatchJob._hold_unroutable`), so they are shown instead of counted nowhere."""

    def read(self, now: float | None = None) -> list[DestinationStatus]:
        """Every destination of the config, in config order."""
        # This process's pipeline writes its last-load records about once a second: written now,
        # a scrape that shows a delivery also shows its record (and `eventspark status` after it).
        pipeline_metrics().states.flush()
        with self._lock:
            self._budget.left = self._budget.total
            now = time.time() if now is None else now
            found = {d: DestinationStatus(d, dest.mode) for d, dest in self.config.destinations.items()}
            self._batch({d: s for d, s in found.items() if s.mode == "batch"}, now)
            for dest_id, status in found.items():
                if status.mode == "stream":
                    status.queue_events, status.exact, oldest = self._queues.pending(queue_dir(self.log_path, dest_id))
                    status.waiting_since(oldest)
                    _stream_retry(status, queue_dir(self.log_path, dest_id), now)
                self._finish(status, now)
            self._lines.forget_unseen()
            self._queues.forget_unseen()
            return list(found.values())

    def _batch(self, found: dict[str, DestinationStatus], now: float) -> None:
        incoming = self.log_path / "incoming"
        batch = {dest_id: self.config.destinations[dest_id] for dest_id in found}
        _secrets, token_dests, default = token_routes(self.config.api_keys, batch)
        held = []
        for path in sorted(incoming.iterdir()) if incoming.is_dir() else ():
            name = parse_log_name(path.name)
            replay = replay_destination(path.name) if name is None else None
            if name is None and replay is None:
                continue
            live = name is not None and name.rotated_at is None
            dests = (replay,) if replay is not None else token_dests.get(name.token_id, default) if name else ()
            if not dests and not live:
                held.append(path.name)
            if not live:
                status = read_status(path)
                _batch_retry(status, found, now)
                dests = tuple(d for d in dests if not _loaded(status, d))
            dests = tuple(d for d in dests if d in found)
            if dests:
                self._count_log(path, [found[d] for d in dests], live)
        for status in found.values():
            status.queue_events = status.live_events + status.pending_log_events
        self.held = held

    def _count_log(self, path: Path, statuses: list[DestinationStatus], live: bool) -> None:
        lines, exact, first = self._lines.count(path)
        for status in statuses:
            if live:
                status.live_events += lines
            else:
                status.pending_logs += 1
                status.pending_log_events += lines
            status.exact = status.exact and exact
            if lines:
                status.waiting_since(first)

    def _finish(self, status: DestinationStatus, now: float) -> None:
        failed = failed_log_path(self.log_path / "failed", status.destination)
        status.failed_events, exact, _first = self._lines.count(failed)
        status.exact = status.exact and exact
        if status.queue_events and status._oldest is not None:
            status.oldest_pending_age = max(0.0, now - status._oldest)
        state = read_state(self.log_path, status.destination)
        status.last_load_at, status.last_load_events = state.last_load_at, state.last_load_events
        status.last_error, status.last_error_at = state.last_error, state.last_error_at
        last_event = parse_timestamp(state.last_event_timestamp) if state.last_event_timestamp else None
        if last_event is not None:
            status.last_event_age = max(0.0, now - last_event)


def _stream_retry(status: DestinationStatus, directory: Path, now: float) -> None:
    """The stream worker's failing attempts, from the state it keeps in its queue's directory.
    With nothing queued nothing is being retried: after a give-up the state only keeps the outage's
    clock for the next events (docs/reliability.md), so it is not shown as a growing age."""
    state = read_retry_state(directory)
    if state is not None and (status.queue_events or not status.exact):
        status.retry_attempts = state.attempts
        status.retry_oldest_age = max(0.0, now - state.first_failure)


def storage_usage(log_path: Path) -> dict[str, Any] | None:
    """Bytes and files of `archive/` and `failed/` as the serving node's retention last measured
    them (`at`: when; every few minutes and after each pass); None when no node measured them."""
    from eventspark.logs.retention import read_usage

    return read_usage(log_path)


def _loaded(status: LogStatus, dest_id: str) -> bool:
    """Whether the log's status shows every table of the destination settled: uploaded, or given up
    into failed/ (none at all: not processed)."""
    tables = status.get(dest_id)
    return tables is not None and all(pair.settled for pair in tables.values())


def _batch_retry(status: LogStatus, found: dict[str, DestinationStatus], now: float) -> None:
    """Adds the failed pairs of a rotated log's status file to its destinations' retry state."""
    for dest_id, tables in status.items():
        into = found.get(dest_id)
        for pair in tables.values() if into is not None else ():
            if pair.settled or not pair.attempts:
                continue
            into.retry_pending_pairs += 1
            into.retry_attempts = max(into.retry_attempts, pair.attempts)
            if pair.first_failed > 0:
                age = max(0.0, now - pair.first_failed)
                into.retry_oldest_age = max(into.retry_oldest_age or 0.0, age)
