"""Coordination in etcd (v3 API through its JSON gateway, with the etcd3gw client).

Keys (with the default prefix): `eventspark/lock/<name>` is created only if absent (a transaction
comparing its create_revision with 0) and attached to a lease kept alive while held;
`eventspark/version/<name>` counts patches in the key's own version (each put increments it);
`eventspark/node/<node>` is attached to a lease of the heartbeat TTL, refreshed by each heartbeat.
"""

from __future__ import annotations

import base64
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import etcd3gw
import requests
from etcd3gw import exceptions as etcd_errors

from eventspark.config.models import EtcdConfig
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

REQUEST_TIMEOUT_SECONDS = 5.0
DEFAULT_PORT = 2379


class EtcdCoordination:
    """Coordination through an etcd v3 cluster (3.4 or newer), reached at one client endpoint."""

    def __init__(
        self,
        config: EtcdConfig,
        node_name: str,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL,
        key_prefix: str = "eventspark/",
    ) -> None:
        if not key_prefix.isascii():
            raise ValueError(f"etcd key prefix must be ASCII, got {key_prefix!r}")
        self.node_name = node_name
        scheme, host, port = parse_endpoint(config.endpoint)
        self._where = f"etcd at {scheme}://{host}:{port}"
        # etcd leases have whole-second TTLs (and a server-side minimum of about 2 s).
        self._lease_ttl = max(1, math.ceil(lease_seconds))
        self._heartbeat_ttl = max(1, math.ceil(heartbeat_ttl))
        self._prefix = key_prefix
        self._client = etcd3gw.Etcd3Client(host=host, port=port, protocol=scheme, timeout=REQUEST_TIMEOUT_SECONDS)
        self._node_lease: etcd3gw.Lease | None = None
        self._node_guard = threading.Lock()

    @contextmanager
    def lock(self, name: str, timeout: float = 30.0) -> Iterator[LockHandle]:
        key = self._key("lock/", name)
        with self._translated("granting a lock lease"):
            lease = self._client.lease(self._lease_ttl)
        value = holder_value(self.node_name, format(lease.id, "x")).encode()
        # Kept alive from the start, so that a long wait does not let the lease expire before use.
        try:
            with LeaseRenewer(lambda: self._keepalive(lease), self._lease_ttl / 3, f"lock {name!r}") as renewer:
                wait_for_lock(name, timeout, lambda: self._try_lock(key, value, lease))
                yield LockHandle(name, renewer.confirm)
        finally:
            self._revoke(lease, f"lock {name!r}")

    def _try_lock(self, key: bytes, value: bytes, lease: etcd3gw.Lease) -> tuple[bool, str | None]:
        encoded = _b64(key)
        txn = {
            "compare": [{"key": encoded, "result": "EQUAL", "target": "CREATE", "create_revision": 0}],
            "success": [{"request_put": {"key": encoded, "value": _b64(value), "lease": lease.id}}],
            "failure": [{"request_range": {"key": encoded}}],
        }
        with self._translated("taking a lock"):
            result = self._client.transaction(txn)
            if result.get("succeeded"):
                return True, None
            kvs = result["responses"][0]["response_range"].get("kvs", [])
            return False, holder_of(_unb64(kvs[0].get("value", "")).decode(errors="replace")) if kvs else None

    def _keepalive(self, lease: etcd3gw.Lease) -> bool:
        with self._translated("renewing a lease"):
            return lease.refresh() > 0

    def _revoke(self, lease: etcd3gw.Lease, what: str) -> None:
        with releasing(f"the lease of {what}"), self._translated("revoking a lease"):
            lease.revoke()

    def table_version(self, name: str) -> int:
        with self._translated("reading a table version"):
            found = self._client.get(self._key("version/", name), metadata=True)
            return int(found[0][1].get("version", 0)) if found else 0

    def bump_table_version(self, name: str) -> int:
        # One transaction writes the key and reads it back: the key's version after this put is
        # the new table version, with no read-modify-write race between nodes.
        encoded = _b64(self._key("version/", name))
        txn = {
            "compare": [],
            "success": [
                {"request_put": {"key": encoded, "value": _b64(self.node_name.encode())}},
                {"request_range": {"key": encoded}},
            ],
            "failure": [],
        }
        with self._translated("bumping a table version"):
            result = self._client.transaction(txn)
            return int(result["responses"][1]["response_range"]["kvs"][0]["version"])

    def heartbeat(self) -> None:
        with self._node_guard, self._translated("recording a heartbeat"):
            if self._node_lease is not None and self._node_lease.refresh() > 0:
                return
            lease = self._client.lease(self._heartbeat_ttl)
            self._client.put(self._key("node/", self.node_name), b"alive", lease=lease)
            self._node_lease = lease

    def instances(self) -> list[str]:
        prefix = self._key("node/", "")
        with self._translated("listing instances"):
            found = self._client.get(prefix, metadata=True, keys_only=True, range_end=_prefix_end(prefix))
            return sorted(kv["key"][len(prefix) :].decode(errors="replace") for _, kv in found)

    def close(self) -> None:
        with self._node_guard:
            if self._node_lease is not None:
                self._revoke(self._node_lease, f"node {self.node_name!r}")
                self._node_lease = None
        self._client.session.close()

    def _key(self, kind: str, name: str) -> bytes:
        # Bytes, not str: etcd3gw encodes str keys as latin-1, which fails on other characters.
        return f"{self._prefix}{kind}{name}".encode()

    @contextmanager
    def _translated(self, action: str) -> Iterator[None]:
        try:
            yield
        except (etcd_errors.ConnectionFailedError, etcd_errors.ConnectionTimeoutError) as exc:
            reason = exc.detail_text or str(exc)
            raise CoordinationUnavailable(f"{self._where} is unreachable while {action}: {reason}") from exc
        except requests.RequestException as exc:
            raise CoordinationUnavailable(f"{self._where} is unreachable while {action}: {exc}") from exc
        except etcd_errors.Etcd3Exception as exc:
            reason = exc.detail_text or str(exc)
            raise CoordinationError(f"{self._where} failed while {action}: {reason}") from exc
        except (KeyError, IndexError, ValueError) as exc:
            message = f"{self._where} gave an unexpected answer while {action}: {exc!r}"
            raise CoordinationError(message) from exc


def parse_endpoint(endpoint: str) -> tuple[str, str, int]:
    """'http://host:2379', 'https://host' or 'host:port' → (scheme, host, port)."""
    text = endpoint.strip()
    parts = urlsplit(text if "://" in text else f"http://{text}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"etcd endpoint must look like http://host:2379, got {endpoint!r}")
    return parts.scheme, parts.hostname, parts.port or DEFAULT_PORT


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def _prefix_end(prefix: bytes) -> bytes:
    """The first key after every key starting with `prefix` (etcd's range_end for a prefix)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])
