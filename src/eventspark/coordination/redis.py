"""Coordination in Redis: token-guarded locks with renewed expiry, INCR versions, expiring node keys.

Keys (with the default prefix): `eventspark:lock:<name>` holds `<node>/<token>` with a PX expiry,
`eventspark:version:<name>` a counter, `eventspark:node:<node>` a heartbeat with a PX expiry.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from eventspark.config.models import RedisConfig
from eventspark.coordination.base import (
    DEFAULT_HEARTBEAT_TTL,
    DEFAULT_LEASE_SECONDS,
    CoordinationError,
    CoordinationUnavailable,
    LockHandle,
    holder_of,
    holder_value,
)
from eventspark.coordination.leases import LeaseRenewer, releasing, wait_for_lock
from eventspark.redis_client import redis_client

logger = logging.getLogger(__name__)

# Only the holder (same token) may extend or delete its lock: after an expiry and a takeover, a late
# renewal or release from the old holder must not touch the new holder's lock.
RENEW_IF_OWNER = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
DELETE_IF_OWNER = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""
REQUEST_TIMEOUT_SECONDS = 5.0
RETRIES = 3
"""A blip is retried for well under a second; then callers get CoordinationUnavailable and retry later."""


class RedisCoordination:
    """Coordination through one Redis server (or a Sentinel/cluster proxy in front of it)."""

    def __init__(
        self,
        config: RedisConfig,
        node_name: str,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL,
        key_prefix: str = "eventspark:",
    ) -> None:
        self.node_name = node_name
        self._where = f"Redis at {config.host}:{config.port}"
        self._lease_ms = max(1, round(lease_seconds * 1000))
        self._heartbeat_ms = max(1, round(heartbeat_ttl * 1000))
        self._beating = False
        self._prefix = key_prefix
        # The client connects lazily, on its first command: building it does no I/O.
        self._client = redis_client(
            config,
            REQUEST_TIMEOUT_SECONDS,
            decode_responses=True,
            retry=Retry(ExponentialWithJitterBackoff(cap=0.25, base=0.02), RETRIES),
        )
        self._renew_script = self._client.register_script(RENEW_IF_OWNER)
        self._delete_script = self._client.register_script(DELETE_IF_OWNER)

    @contextmanager
    def lock(self, name: str, timeout: float = 30.0) -> Iterator[LockHandle]:
        key = f"{self._prefix}lock:{name}"
        value = holder_value(self.node_name, secrets.token_hex(16))
        wait_for_lock(name, timeout, lambda: self._try_lock(key, value))
        try:
            with LeaseRenewer(lambda: self._renew(key, value), self._lease_ms / 3000, f"lock {name!r}") as renewer:
                yield LockHandle(name, renewer.confirm)
        finally:
            self._release(key, value)

    def _try_lock(self, key: str, value: str) -> tuple[bool, str | None]:
        with self._translated("taking a lock"):
            if self._client.set(key, value, nx=True, px=self._lease_ms):
                return True, None
            return False, holder_of(self._client.get(key))

    def _renew(self, key: str, value: str) -> bool:
        with self._translated("renewing a lock"):
            return bool(self._renew_script(keys=[key], args=[value, self._lease_ms]))

    def _release(self, key: str, value: str) -> None:
        with releasing(key), self._translated("releasing a lock"):
            self._delete_script(keys=[key], args=[value])

    def table_version(self, name: str) -> int:
        with self._translated("reading a table version"):
            return int(self._client.get(f"{self._prefix}version:{name}") or 0)

    def bump_table_version(self, name: str) -> int:
        with self._translated("bumping a table version"):
            return int(self._client.incr(f"{self._prefix}version:{name}"))

    def heartbeat(self) -> None:
        with self._translated("recording a heartbeat"):
            self._client.set(f"{self._prefix}node:{self.node_name}", "alive", px=self._heartbeat_ms)
        self._beating = True

    def instances(self) -> list[str]:
        prefix = f"{self._prefix}node:"
        with self._translated("listing instances"):
            keys = self._client.scan_iter(match=_glob_escape(prefix) + "*", count=500)
            return sorted({key[len(prefix) :] for key in keys})

    def close(self) -> None:
        # Only a node that listed itself unlists itself: `eventspark process` builds a coordination
        # under the same name as a running `serve` and must not hide it from the cluster.
        try:
            if self._beating:
                with self._translated("unlisting this node"):
                    self._client.delete(f"{self._prefix}node:{self.node_name}")
        except CoordinationError as exc:
            logger.warning("could not unlist node %s, its heartbeat will expire: %s", self.node_name, exc)
        finally:
            self._client.close()

    @contextmanager
    def _translated(self, action: str) -> Iterator[None]:
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise CoordinationUnavailable(f"{self._where} is unreachable while {action}: {exc}") from exc
        except redis.RedisError as exc:
            raise CoordinationError(f"{self._where} failed while {action}: {exc}") from exc


def _glob_escape(text: str) -> str:
    """Escape Redis MATCH wildcards so that a prefix matches literally."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)
