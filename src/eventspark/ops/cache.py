"""The events cache: the last events of each destination, with what became of them.

EventNative's `server.cache`. The collector records each accepted event as `pending` for every
destination of its token; the stream workers turn entries into `success` (the table and the
stored row's fields, types and values), `failed` (the reason) or `skipped`; the batch job records
a sample of its results after each pass (`eventspark.ops.cache_results`). `GET /api/v1/events/cache`
reads it back (`EventsCache.query`).

Recording costs the request path almost nothing: a per-destination rate limit (EventNative's: at
most `server.cache.events.size` events per destination per `time_window_sec`) is a counter check,
and what it lets through is handed to a background thread, which serialises, bounds and writes it
to the store. Stores (`eventspark.ops.cache_store`, `eventspark.ops.cache_redis`) keep at most
`size` entries per destination:

- Redis, when `meta.storage.redis` is configured: shared by every process and node;
- a SQLite file `<log.path>/cache/events.sqlite` when `server.workers > 1`: the forked collector
  workers and the parent's stream workers and uploader are separate processes;
- else memory, in the one serving process.

The cache is best effort: it never delays nor fails an event, and drops records when its store
is unreachable or its hand-off queue is full.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import orjson

from eventspark.config.models import Config
from eventspark.logs.failed import event_id_of as failed_event_id

_monotonic = time.monotonic

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
"""The most entries one answer returns per destination."""
MAX_ORIGINAL_BYTES = 32 * 1024
"""An original event larger than this (as JSON) is stored as a truncated preview."""
PREVIEW_CHARS = 1024
MAX_FIELDS = 300
"""The most fields of a stored record kept in an entry."""
MAX_VALUE_CHARS = 2048
"""A longer string value of a stored record is cut (and marked) in the entry."""
MAX_RECORD_CHARS = 64 * 1024
"""Characters of the values of one stored record; the fields after them are left out (marked)."""
MAX_ERROR_CHARS = 4096
MAX_EVENT_ID_CHARS = 200
"""A longer event id (the client chooses it) is cut and suffixed with its hash in an entry's key."""
FLUSH_SECONDS = 0.1
"""How often the background thread writes what was recorded."""
MAX_QUEUED = 10_000
"""Hand-offs waiting for the background thread beyond which new records are dropped."""
WARNING_SECONDS = 60.0
"""At most one warning about an unreachable store per this many seconds."""
TIE_BREAK = 1e-6
"""Seconds between the timestamps of the events of one hand-off: newest first stays in order.
Timestamps are whole microseconds, as answered (RFC 3339), so `start`/`end` compare exactly."""
STATUSES = ("pending", "success", "failed", "skipped")


@dataclass(slots=True)
class CachedEvent:
    """One entry: an event of one destination, as recorded at `timestamp` (unix seconds, UTC)."""

    destination_id: str
    event_id: str
    timestamp: float
    token_id: str
    status: str
    original: Any
    """The event as accepted (a dict), or `orjson.Fragment` of its JSON, or a truncation marker."""
    success: dict[str, Any] | None = None
    error: str = ""

    def body(self) -> bytes:
        """What a store keeps beside the destination, event id and timestamp."""
        return orjson.dumps(
            {
                "token_id": self.token_id,
                "status": self.status,
                "original": self.original,
                "success": self.success,
                "error": self.error,
            }
        )

    @classmethod
    def from_body(cls, destination_id: str, event_id: str, timestamp: float, body: bytes | str) -> CachedEvent:
        data = orjson.loads(body)
        return cls(
            destination_id,
            event_id,
            timestamp,
            data.get("token_id", ""),
            data.get("status", "pending"),
            data.get("original"),
            data.get("success"),
            data.get("error", ""),
        )

    def to_json(self) -> dict[str, Any]:
        """The entry as `GET /api/v1/events/cache` answers it."""
        return {
            "destination_id": self.destination_id,
            "token_id": self.token_id,
            "event_id": self.event_id,
            "timestamp": rfc3339(self.timestamp),
            "status": self.status,
            "original": self.original,
            "success": self.success,
            "error": self.error,
        }


class CacheStore(Protocol):
    """Where entries live; at most `size` per destination (the oldest go first)."""

    def add(self, events: list[CachedEvent]) -> None:
        """Inserts entries that are not there yet (pending events): an existing one, maybe
        already with a result, is left as it is."""

    def set(self, events: list[CachedEvent]) -> None:
        """Inserts or replaces entries (results), keeping the timestamp of an existing one."""

    def existing(self, destination_id: str, event_ids: list[str]) -> set[str]:
        """Which of `event_ids` have an entry."""

    def query(
        self, destination_ids: Sequence[str], start: float | None, end: float | None, tokens: set[str], limit: int
    ) -> tuple[int, list[CachedEvent]]:
        """(entries of these destinations, the newest `limit` per destination within [start, end]
        whose token is in `tokens` when given)."""

    def close(self) -> None: ...


class RateLimit:
    """At most `size` records per key per `window` seconds (EventNative's cache rate limit)."""

    __slots__ = ("_state", "size", "window")

    def __init__(self, size: int, window: float) -> None:
        self.size = size
        self.window = window
        self._state: dict[str, list[float]] = {}

    def take(self, key: str, wanted: int, now: float) -> int:
        """How many of `wanted` records of `key` may be recorded now (and counts them)."""
        state = self._state.get(key)
        if state is None:
            state = self._state[key] = [now + self.window, float(self.size)]
        elif now >= state[0]:
            state[0], state[1] = now + self.window, float(self.size)
        left = state[1]
        if left <= 0:
            return 0
        granted = wanted if wanted < left else int(left)
        state[1] = left - granted
        return granted

    def window_end(self, keys: Iterable[str]) -> float:
        """When the first window of `keys` ends (0: one of them has no window yet)."""
        return min((self._state[key][0] if key in self._state else 0.0 for key in keys), default=0.0)


@dataclass(slots=True)
class Outcome:
    """What became of one event at one destination (stream worker, batch sample)."""

    event_id: str
    """'' when not known yet: read from `original` by the cache's thread."""
    original: Any
    """The event (dict), or its JSON line (bytes or text), as accepted."""
    status: str
    success: dict[str, Any] | Callable[[], dict[str, Any]] | None = None
    """The stored record, or a function that makes it (called only for the events kept)."""
    error: str = ""
    token_id: str = ""
    """'' when not known: found from the event's `api_key` (`EventsCache.tokens`)."""


class EventsCache:
    """The process's recorder and reader of one store (`events_cache_for` builds it)."""

    def __init__(
        self, store: CacheStore, size: int, window: float, local: bool = False, tokens: Mapping[str, str] | None = None
    ) -> None:
        """`local`: the store is in this process's memory (reads need no thread); `tokens`: token
        id by secret, for results that do not name their token."""
        self.store = store
        self.tokens = dict(tokens or {})
        self.size = size
        self.local = local
        self._accepted_limit = RateLimit(size, window)
        self._quiet: dict[str, float] = {}
        """By token: until when every destination of the token is over its limit."""
        self._result_limit = RateLimit(size, window)
        self._queue: collections.deque[tuple[Any, ...]] = collections.deque()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._stop = threading.Event()
        self._start_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self.dropped = 0
        """Hand-offs and records dropped (queue full, store unreachable)."""
        self._warned = -WARNING_SECONDS

    # --- recording (any thread) -------------------------------------------------------------------

    def accepted(self, destination_ids: tuple[str, ...], token_id: str, events: list[dict[str, Any]]) -> None:
        """The collector accepted `events` (enriched) of a token for its destinations: the hot
        path. Once every destination of the token is over its limit, a clock reading and one
        comparison until the earliest of their windows ends."""
        now = _monotonic()
        if now < self._quiet.get(token_id, 0.0):
            return
        take = self._accepted_limit.take
        granted = [(dest_id, n) for dest_id in destination_ids if (n := take(dest_id, len(events), now))]
        if granted:
            self._hand_off(("accepted", token_id, granted, events, time.time()))
        else:
            self._quiet[token_id] = self._accepted_limit.window_end(destination_ids)

    def results(self, destination_id: str, outcomes: list[Outcome] | Callable[[], list[Outcome]]) -> None:
        """Results of a destination: an entry already there is updated; the others are recorded
        as new entries within the rate limit (the collector did not record them). `outcomes` may
        be a function that makes them: called on the cache's thread, not the caller's."""
        if outcomes:
            self._hand_off(("results", destination_id, outcomes, time.time()))

    def _hand_off(self, item: tuple[Any, ...]) -> None:
        if len(self._queue) >= MAX_QUEUED:
            self.dropped += 1
            return
        self._queue.append(item)
        if self._pid != os.getpid():
            self._start()

    def _start(self) -> None:
        # Lazily, and again in a forked child: a fork copies no thread.
        with self._start_lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, name="eventspark-events-cache", daemon=True)
            self._thread.start()

    # --- the background thread --------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_SECONDS):
            self.flush()
        self.flush()

    def flush(self) -> None:
        """Writes everything handed off so far (the background thread; tests call it directly)."""
        with self._flush_lock:
            items = []
            while self._queue:
                items.append(self._queue.popleft())
            if not items:
                return
            try:
                self._write(items)
            except Exception as exc:  # the cache is best effort: an unreachable store loses records
                self.dropped += len(items)
                if time.monotonic() - self._warned >= WARNING_SECONDS:  # not 10 lines a second
                    self._warned = time.monotonic()
                    log.warning("events cache: %d record(s) dropped so far: %s", self.dropped, exc)

    def _write(self, items: list[tuple[Any, ...]]) -> None:
        # Pending events first: a result handed off in the same round then finds its entry.
        pending: list[CachedEvent] = []
        for item in items:
            if item[0] == "accepted":
                _kind, token_id, granted, events, stamp = item
                for dest_id, count in granted:
                    pending.extend(
                        pending_entry(dest_id, token_id, event, _stamp(stamp, i))
                        for i, event in enumerate(events[:count])
                    )
        if pending:
            self.store.add(pending)
        for item in items:
            if item[0] == "results":
                self._write_results(*item[1:])

    def _write_results(self, dest_id: str, outcomes: list[Outcome] | Callable[[], list[Outcome]], stamp: float) -> None:
        if callable(outcomes):
            outcomes = outcomes()
        for outcome in outcomes:
            if not outcome.event_id:
                outcome.original = _parsed(outcome.original)
                outcome.event_id = event_id_of(outcome.original)
        known = self.store.existing(dest_id, [o.event_id for o in outcomes if o.event_id])
        fresh = [o for o in outcomes if o.event_id not in known]
        granted = self._result_limit.take(dest_id, len(fresh), time.monotonic())
        chosen = [o for o in outcomes if o.event_id in known] + fresh[:granted]
        if chosen:
            self.store.set([result_entry(dest_id, o, _stamp(stamp, i), self.tokens) for i, o in enumerate(chosen)])

    # --- reading ----------------------------------------------------------------------------------

    def query(
        self,
        destination_ids: Sequence[str],
        start: float | None = None,
        end: float | None = None,
        tokens: Iterable[str] = (),
        limit: int = DEFAULT_LIMIT,
    ) -> tuple[int, list[CachedEvent]]:
        """(entries of the destinations, the newest `limit` per destination, newest first overall)."""
        total, found = self.store.query(destination_ids, start, end, set(tokens), limit)
        found.sort(key=lambda entry: entry.timestamp, reverse=True)
        return total, found

    def close(self) -> None:
        """Writes what is left and stops the thread (this process's only)."""
        if self._thread is not None and self._pid == os.getpid():
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
            self._pid = 0
        self.flush()


# --- entries --------------------------------------------------------------------------------------


def _stamp(stamp: float, position: int) -> float:
    return round(stamp + position * TIE_BREAK, 6)


def pending_entry(dest_id: str, token_id: str, event: dict[str, Any], stamp: float) -> CachedEvent:
    return CachedEvent(dest_id, event_id_of(event), stamp, token_id, "pending", bounded_original(event))


def result_entry(dest_id: str, outcome: Outcome, stamp: float, tokens: Mapping[str, str]) -> CachedEvent:
    event = _parsed(outcome.original)
    token_id = outcome.token_id
    if not token_id and isinstance(event, dict):
        token_id = tokens.get(event.get("api_key"), "")  # type: ignore[arg-type]
    original = bounded_original(event) if not isinstance(event, bytes) else bounded_line(event)
    success = outcome.success() if callable(outcome.success) else outcome.success
    error = outcome.error[:MAX_ERROR_CHARS]
    return CachedEvent(dest_id, outcome.event_id, stamp, token_id, outcome.status, original, success, error)


def _parsed(original: Any) -> Any:
    """The event of a JSON line (bytes or text), else `original` as it is (a dict, or bytes that
    are not JSON)."""
    if isinstance(original, str):
        original = original.encode()
    if isinstance(original, bytes):
        try:
            return orjson.loads(original)
        except orjson.JSONDecodeError:
            return original
    return original


def bounded_original(event: Any) -> Any:
    """The event as JSON for an entry: a truncation marker when it is larger than the bound."""
    try:
        data = orjson.dumps(event)
    except TypeError as exc:
        return {"_unserialisable": str(exc)}
    return bounded_line(data)


def bounded_line(line: bytes) -> Any:
    """A JSON line for an entry (`orjson.Fragment`: not parsed again); a marker when too large or
    not JSON."""
    line = line.strip()
    if len(line) > MAX_ORIGINAL_BYTES:
        return {"_truncated": True, "size": len(line), "preview": line[:PREVIEW_CHARS].decode("utf-8", "replace")}
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return {"_not_json": line[:PREVIEW_CHARS].decode("utf-8", "replace")}
    return orjson.Fragment(line)


def event_id_of(event: Any) -> str:
    """The event's id as the failed log finds it (`logs.failed.event_id_of`), bounded (`bounded_id`)."""
    return bounded_id(failed_event_id(event))


def bounded_id(event_id: str) -> str:
    """The event id as an entry's key: a client may send a megabyte of id; a long one is cut and
    made unique again by its hash (the event's own id stays in `original`)."""
    if len(event_id) <= MAX_EVENT_ID_CHARS:
        return event_id
    digest = hashlib.blake2b(event_id.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return f"{event_id[: MAX_EVENT_ID_CHARS - 18]}…{digest}"


def stored_record(table: str, fields: Iterable[tuple[str, str, Any]]) -> dict[str, Any]:
    """`{"table", "record": [{"field", "type", "value"}]}`, bounded in fields and value sizes."""
    record: list[dict[str, Any]] = []
    left = MAX_RECORD_CHARS
    for name, sql_type, value in fields:
        if len(record) >= MAX_FIELDS or left <= 0:
            record.append({"field": "_truncated", "type": "", "value": f"more than {len(record)} fields"})
            break
        if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
            value = value[:MAX_VALUE_CHARS] + "…[truncated]"
        elif not isinstance(value, str | int | float | bool | type(None)):
            value = str(value)[:MAX_VALUE_CHARS]
        left -= len(name) + (len(value) if isinstance(value, str) else 8)
        record.append({"field": name, "type": sql_type, "value": value})
    return {"table": table, "record": record}


# --- time -----------------------------------------------------------------------------------------


def rfc3339(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> float:
    """Unix seconds from unix seconds (`1700000000`, `1700000000.5`) or RFC 3339; ValueError."""
    text = text.strip()
    if not text or len(text) > 64:
        raise ValueError("expected RFC 3339 or unix seconds")
    try:
        stamp = float(text) if text[0].isdigit() and "-" not in text and ":" not in text else _rfc3339(text)
    except (ValueError, OverflowError):
        stamp = math.nan
    if not math.isfinite(stamp):
        raise ValueError(f"{text!r} is neither RFC 3339 nor unix seconds")
    return round(stamp, 6)


def _rfc3339(text: str) -> float:
    parsed = datetime.fromisoformat(text.replace("z", "Z"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


# --- one cache per process and store --------------------------------------------------------------

_caches: dict[tuple[Any, ...], EventsCache] = {}
_caches_lock = threading.Lock()


def events_cache_for(config: Config) -> EventsCache | None:
    """This process's cache for `config` (None when disabled): the collector, the stream workers
    and the uploader of one process share it; a forked child gets its own."""
    section = config.server.cache
    if not section.enabled or section.events.size <= 0:
        return None
    key = (os.getpid(), *store_key(config), section.events.size, section.events.time_window_sec)
    with _caches_lock:
        cache = _caches.get(key)
        if cache is None:
            store, local = build_store(config)
            events = section.events
            cache = _caches[key] = EventsCache(store, events.size, events.time_window_sec, local, token_ids(config))
        return cache


def token_ids(config: Config) -> dict[str, str]:
    """Token id by client and server secret."""
    keys = [*config.api_keys, *config.server.auth]
    return {secret: key.id for key in keys for secret in (key.client_secret, key.server_secret) if secret}


def store_key(config: Config) -> tuple[Any, ...]:
    redis = config.meta.storage.redis
    if redis is not None:
        return ("redis", redis.host, redis.port)
    if config.server.workers > 1:
        return ("sqlite", str(Path(config.log.path).resolve()))
    return ("memory", str(Path(config.log.path).resolve()))


def build_store(config: Config) -> tuple[CacheStore, bool]:
    """The store for `config` (see the module doc) and whether it is in this process's memory."""
    size = config.server.cache.events.size
    redis = config.meta.storage.redis
    if redis is not None:
        from eventspark.ops.cache_redis import RedisStore

        return RedisStore(redis, size), False
    from eventspark.ops.cache_store import MemoryStore, SqliteStore

    if config.server.workers > 1:
        return SqliteStore(Path(config.log.path) / "cache" / "events.sqlite", size), False
    return MemoryStore(size), True
