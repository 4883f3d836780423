"""Locks, table versions and node liveness shared by the nodes of a cluster.

`build_coordination` picks the backend from the `coordination:` config section: in-process when it
is absent, Redis or etcd otherwise. Backend drivers are imported only when chosen.
"""

from __future__ import annotations

import socket
from typing import Any

from eventspark.config.models import CoordinationConfig
from eventspark.coordination.base import (
    Coordination,
    CoordinationError,
    CoordinationUnavailable,
    LockHandle,
    LockLost,
    LockTimeout,
)
from eventspark.coordination.memory import MemoryCoordination

__all__ = [
    "Coordination",
    "CoordinationError",
    "CoordinationUnavailable",
    "LockHandle",
    "LockLost",
    "LockTimeout",
    "MemoryCoordination",
    "build_coordination",
]


def build_coordination(config: CoordinationConfig | None, node_name: str) -> Coordination:
    """The coordination backend for `config`; does no I/O (backends connect on first use).

    `node_name` is the node's `server.name`; when empty, the host name is used.
    """
    name = node_name or socket.gethostname()
    if config is not None and config.redis is not None:
        try:
            from eventspark.coordination.redis import RedisCoordination
        except ModuleNotFoundError as exc:
            raise _missing_driver("redis", exc.name) from exc
        return RedisCoordination(config.redis, name, **_options(config))
    if config is not None and config.etcd is not None:
        try:
            from eventspark.coordination.etcd import EtcdCoordination
        except ModuleNotFoundError as exc:
            raise _missing_driver("etcd", exc.name) from exc
        return EtcdCoordination(config.etcd, name, **_options(config))
    if config is not None:
        return MemoryCoordination(name, heartbeat_ttl=config.heartbeat_ttl_sec)
    return MemoryCoordination(name)


def _options(config: CoordinationConfig) -> dict[str, Any]:
    options: dict[str, Any] = {"lease_seconds": config.lock_lease_sec, "heartbeat_ttl": config.heartbeat_ttl_sec}
    if config.key_prefix is not None:
        options["key_prefix"] = config.key_prefix
    return options


def _missing_driver(backend: str, missing: str | None) -> CoordinationError:
    return CoordinationError(
        f"coordination.{backend} needs its driver (module {missing!r} is missing): pip install 'eventspark[{backend}]'"
    )
