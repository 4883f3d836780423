"""Real services for the coordination tests: the machine's Redis and an etcd started once per session.

Every test gets its own key prefix, so tests never see each other's locks, versions or nodes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from eventspark.config.models import EtcdConfig, RedisConfig
from eventspark.coordination import Coordination, MemoryCoordination
from tests.coordination.contender import open_coordination
from tests.coordination.etcd_server import EtcdNotInstallable, EtcdServer

REDIS_HOST = "127.0.0.1"
REDIS_PORT = 6379

# Short leases and TTLs keep the suite fast; etcd rounds TTLs up to whole seconds (minimum ~2 s).
LEASE_SECONDS = {"memory": 1.0, "redis": 1.0, "etcd": 2.0}
HEARTBEAT_TTL = {"memory": 0.5, "redis": 1.0, "etcd": 2.0}


@pytest.fixture(scope="session")
def redis_config() -> RedisConfig:
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"the test Redis at {REDIS_HOST}:{REDIS_PORT} is not reachable: {exc}")
    finally:
        client.close()
    return RedisConfig(host=REDIS_HOST, port=REDIS_PORT)


@pytest.fixture(scope="session")
def etcd_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdConfig]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    try:
        server.start()
    except EtcdNotInstallable as exc:  # fails the run: a skip would hide that etcd was never tested
        pytest.fail(f"etcd is needed by the coordination tests and could not be started: {exc}")
    yield EtcdConfig(endpoint=server.endpoint)
    server.stop()


@dataclass
class Backend:
    """One backend under test: makes nodes that share its store and key prefix."""

    kind: str
    config: dict[str, Any] = field(default_factory=dict)
    key_prefix: str = ""
    opened: list[Coordination] = field(default_factory=list)

    @property
    def lease_seconds(self) -> float:
        return LEASE_SECONDS[self.kind]

    @property
    def heartbeat_ttl(self) -> float:
        return HEARTBEAT_TTL[self.kind]

    def spec(self) -> dict[str, Any]:
        """JSON-able description for contender subprocesses."""
        return {
            "kind": self.kind,
            "config": self.config,
            "key_prefix": self.key_prefix,
            "lease_seconds": self.lease_seconds,
        }

    def node(self, name: str) -> Coordination:
        """A new node on this backend (closed at teardown). Memory nodes share nothing."""
        if self.kind == "memory":
            made: Coordination = MemoryCoordination(name, heartbeat_ttl=self.heartbeat_ttl)
        else:
            made = open_coordination(self.spec(), name, heartbeat_ttl=self.heartbeat_ttl)
        self.opened.append(made)
        return made

    def peer(self, first: Coordination, name: str = "node-b") -> Coordination:
        """Another node sharing `first`'s store; an in-process store is not shared, so `first` itself."""
        return first if self.kind == "memory" else self.node(name)

    def close(self) -> None:
        for made in self.opened:
            made.close()


def _backend(request: pytest.FixtureRequest, kind: str) -> Backend:
    run = uuid.uuid4().hex[:10]
    if kind == "redis":
        config = request.getfixturevalue("redis_config")
        return Backend(kind, config.model_dump(), f"eventspark-test-{run}:")
    if kind == "etcd":
        config = request.getfixturevalue("etcd_config")
        return Backend(kind, config.model_dump(), f"eventspark-test-{run}/")
    return Backend(kind)


def _forget_redis_keys(backend: Backend) -> None:
    # The Redis server is shared with other suites: leave nothing behind.
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT)
    try:
        keys = list(client.scan_iter(match=backend.key_prefix + "*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def _backend_for_one_test(request: pytest.FixtureRequest, kind: str) -> Iterator[Backend]:
    made = _backend(request, kind)
    yield made
    made.close()
    if made.kind == "redis":
        _forget_redis_keys(made)


@pytest.fixture(params=["memory", "redis", "etcd"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Each backend in turn."""
    yield from _backend_for_one_test(request, request.param)


@pytest.fixture(params=["redis", "etcd"], name="shared_backend")
def shared_backend_fixture(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """The backends shared between processes, with leases that expire."""
    yield from _backend_for_one_test(request, request.param)
