"""Fixtures of the setup tools' tests: a `serve` per module, and the fixtures of other test folders."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.collector.conftest import Server, kill_all, start_server
from tests.destinations.conftest import clickhouse_db, clickhouse_server, mysql_db  # noqa: F401 (fixtures)
from tests.http.conftest import recorder  # noqa: F401 (a fixture)

ADMIN = "admin-token"
S2S, JS = "s2stoken", "c2stoken"
"""The secrets of EventNative's test vectors, so that `api_key` compares exactly."""
TOKENS = [
    {"id": "main", "client_secret": JS, "server_secret": S2S},
    {"id": "other", "server_secret": "other-secret"},
]


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[dict[str, Any]], Server]]:
    """Starts `eventspark serve` with a config (server, tokens and log path filled in) for the
    tests of one module; every server is killed when the module ends."""
    started: list[Server] = []

    def run(config: dict[str, Any]) -> Server:
        directory = tmp_path_factory.mktemp("serve")
        full = {"server": {"admin_token": ADMIN}, "api_keys": TOKENS, **config}
        server = start_server(directory, full)
        started.append(server)
        return server

    yield run
    kill_all(started)


def post(server: Server, path: str, body: Any = None, content: bytes | None = None, **params: str) -> httpx.Response:
    """POST `path` with a JSON body (or raw `content`) and query parameters."""
    return httpx.post(f"{server.url}{path}", params=params, json=body, content=content, timeout=60)


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A port that accepts TCP connections (the kernel's backlog) but never answers a byte: the
    host of a destination whose packets vanish, as seen by a client."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def closed_port() -> int:
    """A loopback port nothing listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
