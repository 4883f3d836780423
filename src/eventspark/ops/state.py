"""Last load records: `<log.path>/state/dst=<destination id>.json`, one small file per destination.

The batch uploader writes its destinations' records after each pass, a stream worker records each
delivery in memory and the node's metrics thread writes what changed about once a second
(`flush_states`). Readers (`eventspark status`, `/prometheus`) are other processes: a file is
replaced atomically, so they read the old or the new record, never half of one.

A record: `{"last_load_at": <epoch s>, "last_load_events": N, "last_event_timestamp": "<_timestamp
of the newest event loaded>", "last_error": "...", "last_error_at": <epoch s>}`. The error stays
after a later successful load: the operator compares the two times.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote

import orjson

log = logging.getLogger(__name__)

STATE_DIR = "state"
MAX_ERROR_CHARS = 2000
"""Errors are cut to this length: a warehouse may answer with a whole page."""


@dataclass(slots=True)
class DestinationState:
    """What the pipeline last did for one destination."""

    last_load_at: float | None = None
    last_load_events: int = 0
    last_event_timestamp: str = ""
    last_error: str = ""
    last_error_at: float | None = None


def state_path(log_path: Path, dest_id: str) -> Path:
    """`<log.path>/state/dst=<id>.json`; the id is percent-encoded, so it cannot leave the folder."""
    return log_path / STATE_DIR / f"dst={quote(dest_id, safe='')}.json"


def read_state(log_path: Path, dest_id: str) -> DestinationState:
    """The destination's record; an empty one when it has none (or it is unreadable)."""
    try:
        raw = orjson.loads(state_path(log_path, dest_id).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return DestinationState()
    if not isinstance(raw, dict):
        return DestinationState()
    state = DestinationState()
    for name, kind in (("last_load_at", float), ("last_error_at", float), ("last_load_events", int)):
        value = raw.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            setattr(state, name, kind(value))
    for name in ("last_event_timestamp", "last_error"):
        if isinstance(raw.get(name), str):
            setattr(state, name, raw[name])
    return state


def write_state(log_path: Path, dest_id: str, state: DestinationState) -> None:
    """Replaces the record atomically (no fsync: losing the last second of it in a power loss is fine)."""
    target = state_path(log_path, dest_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(orjson.dumps(asdict(state)))
    os.replace(tmp, target)


class StateRecorder:
    """The records this process changes, kept in memory until `flush` (thread-safe).

    Each record starts from the file, so a restart continues the last load time and error.
    """

    def __init__(self) -> None:
        self._states: dict[tuple[Path, str], DestinationState] = {}
        self._dirty: set[tuple[Path, str]] = set()
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()

    def _state(self, key: tuple[Path, str]) -> DestinationState:
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = read_state(*key)
        return state

    def loaded(self, log_path: Path, dest_id: str, events: int, last_event_timestamp: str = "") -> None:
        """`events` events were loaded now; `last_event_timestamp`: the newest one's `_timestamp`."""
        key = (log_path, dest_id)
        with self._lock:
            state = self._state(key)
            state.last_load_at, state.last_load_events = time.time(), events
            if last_event_timestamp:
                state.last_event_timestamp = last_event_timestamp
            self._dirty.add(key)

    def failed(self, log_path: Path, dest_id: str, error: str) -> None:
        key = (log_path, dest_id)
        with self._lock:
            state = self._state(key)
            state.last_error, state.last_error_at = error[:MAX_ERROR_CHARS], time.time()
            self._dirty.add(key)

    def flush(self) -> None:
        """Writes the records changed since the last flush. One flush at a time (the metrics thread
        and the uploader both flush): an older copy never replaces a newer one, and two writers never
        share a temporary file."""
        with self._flush_lock:
            with self._lock:
                dirty = [(key, DestinationState(**asdict(self._states[key]))) for key in self._dirty]
                self._dirty.clear()
            for (log_path, dest_id), state in dirty:
                try:
                    write_state(log_path, dest_id, state)
                except OSError as exc:  # a full disk must not stop the pipeline over a status record
                    log.warning("cannot write the state of destination %s: %s", dest_id, exc)
