"""The recognition index in Redis (`meta.storage.redis`): shared by every process and node.

Keys, with the default prefix `eventspark:recognition:` and per destination `<d>`:
`<prefix><d>:t:<anonymous id>` a set of table names, `<prefix><d>:u:<anonymous id>` the identity
as JSON, both expiring `ttl` seconds after their last write; `<prefix><d>:pending` a set of ids
whose update failed (expiring with its last write too). Commands go in pipelines of CHUNK ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from eventspark.config.models import RedisConfig
from eventspark.redis_client import redis_client
from eventspark.steps.recognition import Identity

DEFAULT_PREFIX = "eventspark:recognition:"
TIMEOUT_SECONDS = 5.0
CHUNK = 1000


def _chunks(items: list[Any]) -> Iterable[list[Any]]:
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


class RedisIndex:
    """One destination's index; the client connects on its first command (no I/O here)."""

    def __init__(self, config: RedisConfig, dest_id: str, ttl_seconds: float, prefix: str = DEFAULT_PREFIX) -> None:
        self.base = f"{prefix}{dest_id}:"
        self.ttl = max(1, int(ttl_seconds))
        self._client = redis_client(config, TIMEOUT_SECONDS)

    def add_tables(self, tables: Mapping[str, Iterable[str]]) -> None:
        for part in _chunks(list(tables.items())):
            with self._client.pipeline(transaction=False) as pipe:
                for anonymous_id, names in part:
                    key = f"{self.base}t:{anonymous_id}"
                    pipe.sadd(key, *names)
                    pipe.expire(key, self.ttl)
                pipe.execute()

    def tables(self, ids: Iterable[str]) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for part in _chunks(list(ids)):
            with self._client.pipeline(transaction=False) as pipe:
                for anonymous_id in part:
                    pipe.smembers(f"{self.base}t:{anonymous_id}")
                for anonymous_id, names in zip(part, pipe.execute(), strict=True):
                    if names:
                        found[anonymous_id] = {n.decode() for n in names}
        return found

    def drop_tables(self, table: str, ids: Iterable[str]) -> None:
        for part in _chunks(list(ids)):
            with self._client.pipeline(transaction=False) as pipe:
                for anonymous_id in part:
                    pipe.srem(f"{self.base}t:{anonymous_id}", table)
                pipe.execute()

    def set_identities(self, identities: Mapping[str, Identity]) -> None:
        for part in _chunks(list(identities.items())):
            with self._client.pipeline(transaction=False) as pipe:
                for anonymous_id, identity in part:
                    pipe.set(f"{self.base}u:{anonymous_id}", orjson.dumps(list(identity)), ex=self.ttl)
                pipe.execute()

    def identities(self, ids: Iterable[str]) -> dict[str, Identity]:
        found: dict[str, Identity] = {}
        for part in _chunks(list(ids)):
            values = self._client.mget([f"{self.base}u:{anonymous_id}" for anonymous_id in part])
            for anonymous_id, value in zip(part, values, strict=True):
                if value is not None:
                    found[anonymous_id] = tuple(orjson.loads(value))
        return found

    def add_pending(self, ids: Iterable[str]) -> None:
        ids = list(ids)
        if ids:
            key = f"{self.base}pending"
            for part in _chunks(ids):
                self._client.sadd(key, *part)
            self._client.expire(key, self.ttl)

    def pending(self) -> set[str]:
        return {member.decode() for member in self._client.smembers(f"{self.base}pending")}

    def drop_pending(self, ids: Iterable[str]) -> None:
        for part in _chunks(list(ids)):
            self._client.srem(f"{self.base}pending", *part)

    def close(self) -> None:
        self._client.close()

    def delete_all(self) -> None:
        """Removes every key of this destination (tests)."""
        keys = list(self._client.scan_iter(match=f"{self.base}*", count=1000))
        for part in _chunks(keys):
            self._client.delete(*part)
