"""In-process coordination: the default for a single node (threads of one process only)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from eventspark.coordination.base import DEFAULT_HEARTBEAT_TTL, LockHandle, LockTimeout


class MemoryCoordination:
    """Locks and versions held in this process; nothing survives a restart, nothing is shared."""

    def __init__(self, node_name: str, *, heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL) -> None:
        self.node_name = node_name
        self._heartbeat_ttl = heartbeat_ttl
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._holders: dict[str, str] = {}
        self._versions: dict[str, int] = {}
        self._last_beat: float | None = None

    @contextmanager
    def lock(self, name: str, timeout: float = 30.0) -> Iterator[LockHandle]:
        # No lease: held until released, never lost (`LockHandle` without a check).
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        started = time.monotonic()
        if not lock.acquire(timeout=max(timeout, 0.0)):
            raise LockTimeout(name, self._holders.get(name), time.monotonic() - started)
        self._holders[name] = f"{self.node_name} (thread {threading.current_thread().name})"
        try:
            yield LockHandle(name)
        finally:
            self._holders.pop(name, None)
            lock.release()

    def table_version(self, name: str) -> int:
        with self._guard:
            return self._versions.get(name, 0)

    def bump_table_version(self, name: str) -> int:
        with self._guard:
            version = self._versions.get(name, 0) + 1
            self._versions[name] = version
            return version

    def heartbeat(self) -> None:
        self._last_beat = time.monotonic()

    def instances(self) -> list[str]:
        beat = self._last_beat
        if beat is None or time.monotonic() - beat > self._heartbeat_ttl:
            return []
        return [self.node_name]

    def close(self) -> None:
        self._last_beat = None
