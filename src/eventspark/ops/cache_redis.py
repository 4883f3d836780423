"""The events cache in Redis (`meta.storage.redis`): shared by every process of every node.

Per destination, two keys (with the default prefix `eventspark:events_cache:`):
`<prefix>index:<destination>`, a sorted set of event ids scored by the time they were first
recorded, and `<prefix>entry:<destination>`, a hash of event id → entry JSON. A Lua script adds
entries and trims both keys to `size` in one step; both keys expire `ttl` seconds after the last
write, so a removed destination leaves nothing behind for long.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eventspark.config.models import RedisConfig
from eventspark.ops.cache import CachedEvent
from eventspark.redis_client import redis_client

DEFAULT_PREFIX = "eventspark:events_cache:"
DEFAULT_TTL_SECONDS = 7 * 24 * 3600
TIMEOUT_SECONDS = 2.0
MAX_PER_CALL = 500
"""Entries per script call (bounds the script's arguments and its run time)."""

# KEYS: index, entries. ARGV: size, ttl, then (event id, score, body, "add"|"set") per entry.
# "add" leaves an existing entry alone (a pending event must not hide a result that came first);
# "set" replaces the body and keeps the first score.
PUT = """
local index, entries = KEYS[1], KEYS[2]
local size, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, #ARGV, 4 do
  local id, score, body, mode = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local added = redis.call('zadd', index, 'NX', score, id)
  if added == 1 or mode == 'set' then
    redis.call('hset', entries, id, body)
  end
end
local extra = redis.call('zcard', index) - size
if extra > 0 then
  local old = redis.call('zrange', index, 0, extra - 1)
  redis.call('zremrangebyrank', index, 0, extra - 1)
  for i = 1, #old, 500 do
    redis.call('hdel', entries, unpack(old, i, math.min(i + 499, #old)))
  end
end
redis.call('expire', index, ttl)
redis.call('expire', entries, ttl)
return extra
"""


class RedisStore:
    """Entries in Redis; the client connects on its first command (no I/O in the constructor)."""

    def __init__(
        self, config: RedisConfig, size: int, prefix: str = DEFAULT_PREFIX, ttl: int = DEFAULT_TTL_SECONDS
    ) -> None:
        self.size = size
        self.prefix = prefix
        self.ttl = ttl
        self._client = redis_client(config, TIMEOUT_SECONDS)
        self._put = self._client.register_script(PUT)

    def keys(self, destination_id: str) -> tuple[str, str]:
        return f"{self.prefix}index:{destination_id}", f"{self.prefix}entry:{destination_id}"

    def add(self, events: list[CachedEvent]) -> None:
        self._write(events, "add")

    def set(self, events: list[CachedEvent]) -> None:
        self._write(events, "set")

    def _write(self, events: list[CachedEvent], mode: str) -> None:
        by_destination: dict[str, list[CachedEvent]] = {}
        for event in events:
            by_destination.setdefault(event.destination_id, []).append(event)
        for dest_id, entries in by_destination.items():
            for i in range(0, len(entries), MAX_PER_CALL):
                args: list[Any] = [self.size, self.ttl]
                for e in entries[i : i + MAX_PER_CALL]:
                    args += [e.event_id, repr(e.timestamp), e.body(), mode]
                self._put(keys=self.keys(dest_id), args=args)

    def existing(self, destination_id: str, event_ids: list[str]) -> set[str]:
        if not event_ids:
            return set()
        scores = self._client.zmscore(self.keys(destination_id)[0], event_ids)
        return {event_id for event_id, score in zip(event_ids, scores, strict=True) if score is not None}

    def query(
        self, destination_ids: Sequence[str], start: float | None, end: float | None, tokens: set[str], limit: int
    ) -> tuple[int, list[CachedEvent]]:
        total, found = 0, []
        low = "-inf" if start is None else repr(start)
        high = "+inf" if end is None else repr(end)
        for dest_id in destination_ids:
            index, entries = self.keys(dest_id)
            with self._client.pipeline(transaction=False) as pipe:
                pipe.zcard(index)
                # With a token filter, every id in range is read (at most `size`), then filtered.
                pipe.zrevrangebyscore(index, high, low, start=0, num=-1 if tokens else limit, withscores=True)
                count, ids = pipe.execute()
            total += count
            found.extend(self._entries(dest_id, entries, ids, tokens, limit))
        return total, found

    def _entries(
        self, dest_id: str, key: str, ids: list[tuple[bytes, float]], tokens: set[str], limit: int
    ) -> list[CachedEvent]:
        out: list[CachedEvent] = []
        for i in range(0, len(ids), MAX_PER_CALL):
            chunk = ids[i : i + MAX_PER_CALL]
            bodies = self._client.hmget(key, [event_id for event_id, _ in chunk])
            for (event_id, score), body in zip(chunk, bodies, strict=True):
                if body is None:  # trimmed between the two reads
                    continue
                entry = CachedEvent.from_body(dest_id, event_id.decode(), score, body)
                if not tokens or entry.token_id in tokens:
                    out.append(entry)
                    if len(out) >= limit:
                        return out
        return out

    def delete(self, destination_ids: Sequence[str]) -> None:
        """Removes the destinations' keys (tests)."""
        keys = [key for dest_id in destination_ids for key in self.keys(dest_id)]
        if keys:
            self._client.delete(*keys)

    def close(self) -> None:
        self._client.close()
