from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from eventspark.config.models import CoordinationConfig
from eventspark.coordination import (
    Coordination,
    CoordinationError,
    CoordinationUnavailable,
    MemoryCoordination,
    build_coordination,
)
from eventspark.coordination.etcd import EtcdCoordination, parse_endpoint
from eventspark.coordination.redis import RedisCoordination


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_no_config_means_in_process() -> None:
    made = build_coordination(None, "collector-01")
    assert isinstance(made, MemoryCoordination) and isinstance(made, Coordination)
    assert made.node_name == "collector-01"
    assert isinstance(build_coordination(CoordinationConfig(), "n"), MemoryCoordination)


def test_empty_node_name_falls_back_to_the_host_name() -> None:
    made = build_coordination(None, "")
    assert isinstance(made, MemoryCoordination)
    assert made.node_name == socket.gethostname()


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({"redis": {"host": "127.0.0.1", "port": 1}}, RedisCoordination),
        ({"etcd": {"endpoint": "http://127.0.0.1:1"}}, EtcdCoordination),
    ],
)
def test_config_picks_the_backend_without_connecting(section: dict[str, object], expected: type) -> None:
    # Port 1 has no server: building must not connect (constructors do no I/O).
    made = build_coordination(CoordinationConfig.model_validate(section), "node-a")
    assert isinstance(made, expected) and isinstance(made, Coordination)
    made.close()


def test_in_process_default_imports_no_driver() -> None:
    code = (
        "import sys\n"
        "from eventspark.coordination import build_coordination\n"
        "build_coordination(None, 'n')\n"
        "print(sorted(m for m in ('redis', 'etcd3gw', 'requests') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_missing_driver_is_named_with_the_package_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "eventspark.coordination.etcd")
    monkeypatch.setitem(sys.modules, "etcd3gw", None)
    with pytest.raises(CoordinationError, match=r"pip install 'eventspark\[etcd\]'"):
        build_coordination(CoordinationConfig.model_validate({"etcd": {"endpoint": "localhost"}}), "n")


@pytest.mark.parametrize("kind", ["redis", "etcd"])
def test_unreachable_store_raises_coordination_unavailable(kind: str) -> None:
    port = _closed_port()
    section = (
        {"redis": {"host": "127.0.0.1", "port": port}}
        if kind == "redis"
        else {"etcd": {"endpoint": f"127.0.0.1:{port}"}}
    )
    made = build_coordination(CoordinationConfig.model_validate(section), "node-a")
    started = time.monotonic()
    with pytest.raises(CoordinationUnavailable, match=rf"127\.0\.0\.1:{port} is unreachable while reading"):
        made.table_version("dest_events")
    unavailable = pytest.raises(CoordinationUnavailable, match=r"while (taking a lock|granting a lock lease)")
    with unavailable, made.lock("dest_events", timeout=1):
        pytest.fail("locked without a store")
    with pytest.raises(CoordinationUnavailable, match="recording a heartbeat"):
        made.heartbeat()
    made.close()  # never raises on shutdown
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("http://127.0.0.1:2379", ("http", "127.0.0.1", 2379)),
        ("https://etcd.internal", ("https", "etcd.internal", 2379)),
        ("etcd-1:12379", ("http", "etcd-1", 12379)),
        (" http://[::1]:2379 ", ("http", "::1", 2379)),
    ],
)
def test_parse_endpoint(endpoint: str, expected: tuple[str, str, int]) -> None:
    assert parse_endpoint(endpoint) == expected


@pytest.mark.parametrize("endpoint", ["ftp://host:2379", "http://", "http://host:notaport"])
def test_parse_endpoint_rejects_nonsense(endpoint: str) -> None:
    with pytest.raises(ValueError, match=r"etcd endpoint|[Pp]ort"):
        parse_endpoint(endpoint)
