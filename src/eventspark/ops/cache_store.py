"""Events cache stores of one node: in memory (one process), or a SQLite file (several processes).

Both keep at most `size` entries per destination, dropping the oldest (by the time they were
first recorded).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from eventspark.ops.cache import CachedEvent

BUSY_TIMEOUT_MS = 5000
JOURNAL_LIMIT_BYTES = 4 * 1024 * 1024
_IN_CHUNK = 500
"""Event ids per `IN (...)` of one statement (SQLite allows 32,766 parameters)."""


def _selected(entry: CachedEvent, start: float | None, end: float | None, tokens: set[str]) -> bool:
    if start is not None and entry.timestamp < start:
        return False
    if end is not None and entry.timestamp > end:
        return False
    return not tokens or entry.token_id in tokens


def _newest(
    entries: OrderedDict[str, CachedEvent], start: float | None, end: float | None, tokens: set[str], limit: int
) -> list[CachedEvent]:
    """The newest `limit` selected entries. Entries are in the order they were first recorded,
    which is their time order but for a clock stepping back: the scan goes from the newest
    and stops at `limit` (a query runs on the event loop: no sort of 100,000 entries)."""
    out: list[CachedEvent] = []
    for entry in reversed(entries.values()):
        if _selected(entry, start, end, tokens):
            out.append(entry)
            if len(out) >= limit:
                break
    return out


class MemoryStore:
    """Entries in this process's memory: per destination, event id → entry, oldest first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: dict[str, OrderedDict[str, CachedEvent]] = {}
        self._lock = threading.Lock()

    def add(self, events: list[CachedEvent]) -> None:
        with self._lock:
            for event in events:
                entries = self._destination(event.destination_id)
                if event.event_id not in entries:
                    entries[event.event_id] = event
                    self._trim(entries)

    def set(self, events: list[CachedEvent]) -> None:
        with self._lock:
            for event in events:
                entries = self._destination(event.destination_id)
                old = entries.get(event.event_id)
                if old is not None:
                    event.timestamp = old.timestamp  # keeps its place
                entries[event.event_id] = event
                self._trim(entries)

    def existing(self, destination_id: str, event_ids: list[str]) -> set[str]:
        with self._lock:
            entries = self._entries.get(destination_id, {})
            return {event_id for event_id in event_ids if event_id in entries}

    def query(
        self, destination_ids: Sequence[str], start: float | None, end: float | None, tokens: set[str], limit: int
    ) -> tuple[int, list[CachedEvent]]:
        total, found = 0, []
        with self._lock:
            for dest_id in destination_ids:
                entries = self._entries.get(dest_id)
                if not entries:
                    continue
                total += len(entries)
                found.extend(_newest(entries, start, end, tokens, limit))
        return total, found

    def destinations(self) -> list[str]:
        with self._lock:
            return list(self._entries)

    def close(self) -> None:
        pass

    def _destination(self, dest_id: str) -> OrderedDict[str, CachedEvent]:
        entries = self._entries.get(dest_id)
        if entries is None:
            entries = self._entries[dest_id] = OrderedDict()
        return entries

    def _trim(self, entries: OrderedDict[str, CachedEvent]) -> None:
        while len(entries) > self.size:
            entries.popitem(last=False)


SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    destination_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    ts REAL NOT NULL,
    token_id TEXT NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (destination_id, event_id)
);
CREATE INDEX IF NOT EXISTS events_by_time ON events (destination_id, ts);
"""


class SqliteStore:
    """Entries in one SQLite file (WAL) shared by the processes of one node: the forked collector
    workers write pending events, the parent's stream workers and uploader write results. Each
    process opens its own connection on first use; nothing is opened by the constructor."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def _db(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # a cache: losing the last writes to a power cut is fine
            conn.execute(f"PRAGMA journal_size_limit={JOURNAL_LIMIT_BYTES}")  # the WAL shrinks back after a burst
            conn.executescript(SCHEMA)
            self._conn, self._pid = conn, os.getpid()
        return self._conn

    def add(self, events: list[CachedEvent]) -> None:
        rows = [(e.destination_id, e.event_id, e.timestamp, e.token_id, e.body()) for e in events]
        with self._lock, self._db() as db:
            db.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?)", rows)
            self._trim(db, {e.destination_id for e in events})

    def set(self, events: list[CachedEvent]) -> None:
        rows = [(e.destination_id, e.event_id, e.timestamp, e.token_id, e.body()) for e in events]
        with self._lock, self._db() as db:
            db.executemany(
                "INSERT INTO events VALUES (?, ?, ?, ?, ?) ON CONFLICT (destination_id, event_id) "
                "DO UPDATE SET token_id = excluded.token_id, body = excluded.body",
                rows,
            )
            self._trim(db, {e.destination_id for e in events})

    def _trim(self, db: sqlite3.Connection, destinations: set[str]) -> None:
        for dest_id in destinations:
            (count,) = db.execute("SELECT count(*) FROM events WHERE destination_id = ?", (dest_id,)).fetchone()
            if count > self.size:
                db.execute(
                    "DELETE FROM events WHERE rowid IN (SELECT rowid FROM events WHERE destination_id = ? "
                    "ORDER BY ts LIMIT ?)",
                    (dest_id, count - self.size),
                )

    def existing(self, destination_id: str, event_ids: list[str]) -> set[str]:
        found: set[str] = set()
        with self._lock:
            db = self._db()
            for i in range(0, len(event_ids), _IN_CHUNK):
                chunk = event_ids[i : i + _IN_CHUNK]
                marks = ", ".join("?" * len(chunk))
                sql = f"SELECT event_id FROM events WHERE destination_id = ? AND event_id IN ({marks})"
                found.update(row[0] for row in db.execute(sql, (destination_id, *chunk)))
        return found

    def query(
        self, destination_ids: Sequence[str], start: float | None, end: float | None, tokens: set[str], limit: int
    ) -> tuple[int, list[CachedEvent]]:
        total, found = 0, []
        where, bounds = self._bounds(start, end, tokens)
        with self._lock:
            db = self._db()
            for dest_id in destination_ids:
                (count,) = db.execute("SELECT count(*) FROM events WHERE destination_id = ?", (dest_id,)).fetchone()
                total += count
                rows = db.execute(
                    f"SELECT event_id, ts, body FROM events WHERE destination_id = ?{where} ORDER BY ts DESC LIMIT ?",
                    (dest_id, *bounds, limit),
                )
                found.extend(CachedEvent.from_body(dest_id, event_id, ts, body) for event_id, ts, body in rows)
        return total, found

    @staticmethod
    def _bounds(start: float | None, end: float | None, tokens: set[str]) -> tuple[str, tuple[object, ...]]:
        where, values = "", []
        if start is not None:
            where, values = where + " AND ts >= ?", [*values, start]
        if end is not None:
            where, values = where + " AND ts <= ?", [*values, end]
        if tokens:
            where += f" AND token_id IN ({', '.join('?' * len(tokens))})"
            values.extend(sorted(tokens))
        return where, tuple(values)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None
