"""The recognition index of one destination: ids only, never events, each entry with a TTL.

Three kinds of entries, per anonymous id: the tables where rows without a user were written
(cleared once those rows got their user), the user's identity once an event identified it (so
later anonymous rows of the same id get it too), and "pending" for ids whose update failed and
is retried after the next load. `MemoryIndex` lives in the serving process (shared by its batch
passes and stream workers, lost on restart); `RedisIndex` (`recognition.redis`) is shared by
every process and node and outlives them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Protocol

from eventspark.steps.recognition import Identity


class RecognitionIndex(Protocol):
    def add_tables(self, tables: Mapping[str, Iterable[str]]) -> None:
        """Anonymous id → tables that got rows of it without a user."""
        ...

    def tables(self, ids: Iterable[str]) -> dict[str, set[str]]:
        """The tables of each id that has some."""
        ...

    def drop_tables(self, table: str, ids: Iterable[str]) -> None:
        """The rows of `ids` in `table` have their user now."""
        ...

    def set_identities(self, identities: Mapping[str, Identity]) -> None: ...

    def identities(self, ids: Iterable[str]) -> dict[str, Identity]:
        """The known identity of each id that has one."""
        ...

    def add_pending(self, ids: Iterable[str]) -> None: ...

    def pending(self) -> set[str]:
        """Ids whose update failed: retried on the next run."""
        ...

    def drop_pending(self, ids: Iterable[str]) -> None: ...

    def close(self) -> None: ...


class _Expiring:
    """A bounded map with a TTL per entry: the oldest written entries go first past `limit`."""

    def __init__(self, ttl: float, limit: int) -> None:
        self.ttl, self.limit = ttl, limit
        self.items: OrderedDict[str, tuple[float, object]] = OrderedDict()

    def get(self, key: str) -> object | None:
        found = self.items.get(key)
        if found is None:
            return None
        if found[0] < time.monotonic():
            del self.items[key]
            return None
        return found[1]

    def put(self, key: str, value: object) -> None:
        self.items[key] = (time.monotonic() + self.ttl, value)
        self.items.move_to_end(key)
        while len(self.items) > self.limit:
            self.items.popitem(last=False)

    def pop(self, key: str) -> None:
        self.items.pop(key, None)


class MemoryIndex:
    """The index in this process's memory, bounded by `limit` ids per kind of entry."""

    def __init__(self, ttl_seconds: float, limit: int) -> None:
        self._tables = _Expiring(ttl_seconds, limit)
        self._identities = _Expiring(ttl_seconds, limit)
        self._pending = _Expiring(ttl_seconds, limit)

    def add_tables(self, tables: Mapping[str, Iterable[str]]) -> None:
        for anonymous_id, names in tables.items():
            known = self._tables.get(anonymous_id)
            merged = set(names) | (known if isinstance(known, set) else set())
            self._tables.put(anonymous_id, merged)

    def tables(self, ids: Iterable[str]) -> dict[str, set[str]]:
        found = {anonymous_id: self._tables.get(anonymous_id) for anonymous_id in ids}
        return {a: set(names) for a, names in found.items() if isinstance(names, set) and names}

    def drop_tables(self, table: str, ids: Iterable[str]) -> None:
        for anonymous_id in ids:
            names = self._tables.get(anonymous_id)
            if isinstance(names, set):
                names.discard(table)
                if not names:
                    self._tables.pop(anonymous_id)

    def set_identities(self, identities: Mapping[str, Identity]) -> None:
        for anonymous_id, identity in identities.items():
            self._identities.put(anonymous_id, tuple(identity))

    def identities(self, ids: Iterable[str]) -> dict[str, Identity]:
        found = {anonymous_id: self._identities.get(anonymous_id) for anonymous_id in ids}
        return {a: identity for a, identity in found.items() if isinstance(identity, tuple)}

    def add_pending(self, ids: Iterable[str]) -> None:
        for anonymous_id in ids:
            self._pending.put(anonymous_id, True)

    def pending(self) -> set[str]:
        return {a for a in list(self._pending.items) if self._pending.get(a) is not None}

    def drop_pending(self, ids: Iterable[str]) -> None:
        for anonymous_id in ids:
            self._pending.pop(anonymous_id)

    def close(self) -> None:
        pass
