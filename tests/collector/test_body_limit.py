"""A body over its limit gets a 413 the client can read, not a connection reset (issue 18).

Against `eventspark serve` with raw sockets: the client sends a whole 5 MiB body in chunks, as
HTTP libraries do, and only then reads the answer. Before the server drained refused bodies it
closed the connection with the rest unread, and the kernel answered the client's next bytes with
a reset (1 run in 3 for a 3 MiB body).
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import orjson
import pytest

from eventspark.collector import http
from eventspark.collector.http import HTTPError, read_body
from tests.collector.conftest import Server

CLIENT, SERVER, ADMIN = "lim-js", "lim-s2s", "lim-admin"
BODY_SIZE = 5 * 1024 * 1024
"""Over every limit: 16 KiB events, 1 MiB bulk uploads (64 ×), 4 MiB Segment batches."""
CONFIG: dict[str, Any] = {
    "server": {"max_event_size": 16 * 1024, "admin_token": ADMIN},
    "api_keys": [{"id": "lim", "client_secret": CLIENT, "server_secret": SERVER}],
    "destinations": {"dw": {"type": "duckdb"}},
    "log": {"rotation_min": 60, "uploader_period_sec": 3600},
}
ENDPOINTS = {
    f"/api/v1/event?token={CLIENT}": 20,
    f"/api.x?p_t={CLIENT}": 2,
    f"/api/v1/s2s/event?token={SERVER}": 2,
    f"/api/v1/events/bulk?token={SERVER}": 2,
    f"/api/v1/segment/v1/batch?token={SERVER}": 2,
    f"/api/v1/events/dry-run?token={SERVER}&destination_id=dw": 2,
    f"/api/v1/replay?token={ADMIN}": 2,
    f"/api/v1/templates/evaluate?token={ADMIN}": 2,
    f"/api/v1/destinations/test?token={ADMIN}": 2,
}
"""Every POST endpoint that reads a body, and how many runs each."""
REFUSED_UNREAD = {"/api/v1/event?token=wrong": 401, f"/api/v1/s2s/event?token={CLIENT}": 401, "/api/v1/nope": 404}
"""Requests refused before their body is read: the server's HTTP parser skips the body (keep-alive)."""


def post_raw(port: int, target: str, size: int, extra: str = "", send_body: bool = True) -> tuple[int, bytes]:
    """(status, body) of a POST of `size` bytes sent in 256 KiB chunks; raises ConnectionError
    (a reset) when the server cut the connection before the client could read its answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        head = f"POST {target} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n"
        sock.sendall((head + extra + "\r\n").encode())
        chunk = b'{"a": "' + b"x" * (256 * 1024 - 7)
        sent = 0
        while send_body and sent < size:
            sock.sendall(chunk[: size - sent])
            sent += len(chunk)
            time.sleep(0.001)  # a client on a real network is slower than the server
        return read_response(sock)


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        if not piece:
            raise ConnectionError(f"connection closed before an answer: {data!r}")
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        piece = sock.recv(65536)
        if not piece:
            break
        body += piece
    return status, body


def test_a_body_over_the_limit_gets_a_readable_413_on_every_endpoint(run_server: Any) -> None:
    server: Server = run_server(CONFIG)
    port = int(server.url.rsplit(":", 1)[1])
    outcomes: dict[str, list[str]] = {}
    for target, runs in ENDPOINTS.items():
        for _ in range(runs):
            try:
                status, body = post_raw(port, target, BODY_SIZE)
                outcome = f"{status} {orjson.loads(body)['message']}"
            except ConnectionError as exc:  # ConnectionResetError, BrokenPipeError included
                outcome = f"reset: {exc!r}"
            outcomes.setdefault(target.split("?")[0], []).append(outcome)
    expected = {path: ["413 Request body is too large"] * len(got) for path, got in outcomes.items()}
    assert outcomes == expected
    for target, status in REFUSED_UNREAD.items():
        assert post_raw(port, target, BODY_SIZE)[0] == status
    assert server.process.poll() is None


def test_expect_100_continue_is_refused_before_the_body_is_sent(run_server: Any) -> None:
    server: Server = run_server(CONFIG)
    port = int(server.url.rsplit(":", 1)[1])
    status, body = post_raw(
        port, f"/api/v1/event?token={CLIENT}", BODY_SIZE, extra="Expect: 100-continue\r\n", send_body=False
    )
    assert status == 413  # not "100 Continue": the client need not send 5 MiB for nothing
    assert orjson.loads(body)["message"] == "Request body is too large"


def test_the_connection_takes_the_next_request_after_a_drained_413(run_server: Any) -> None:
    server: Server = run_server(CONFIG)
    port = int(server.url.rsplit(":", 1)[1])
    small = b'{"event_type": "after_413"}'
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        head = f"POST /api/v1/event?token={CLIENT} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {BODY_SIZE}\r\n\r\n".encode() + b"x" * BODY_SIZE)
        assert read_response(sock)[0] == 413
        sock.sendall(f"{head}Content-Length: {len(small)}\r\n\r\n".encode() + small)
        assert read_response(sock)[0] == 200  # the same connection: the refused body was read whole
    assert server.stop() == 0
    assert [orjson.loads(line)["event_type"] for line in server.new_lines()] == ["after_413"]


# --- the bounds of draining (the ASGI function alone) ---------------------------------------------


def chunks(sizes: list[int], delay: float = 0.0) -> Any:
    """An ASGI `receive` giving a body in chunks of `sizes` bytes; counts its calls."""
    messages = [
        {"type": "http.request", "body": b"x" * size, "more_body": n < len(sizes) - 1} for n, size in enumerate(sizes)
    ]

    async def receive() -> dict[str, Any]:
        receive.calls += 1  # type: ignore[attr-defined]
        if delay:
            await asyncio.sleep(delay)
        return messages.pop(0)

    receive.calls = 0  # type: ignore[attr-defined]
    return receive


def refusal(receive: Any, headers: dict[bytes, bytes], limit: int) -> HTTPError:
    with pytest.raises(HTTPError) as raised:
        asyncio.run(read_body(receive, headers, limit))
    assert raised.value.status == 413
    return raised.value


def test_a_drained_body_keeps_the_connection() -> None:
    receive = chunks([100] * 10)
    error = refusal(receive, {b"content-length": b"1000"}, limit=500)
    assert receive.calls == 10  # everything read
    assert (b"connection", b"close") not in error.headers
    receive = chunks([100] * 10)  # chunked: no declared length
    error = refusal(receive, {}, limit=500)
    assert receive.calls == 10
    assert (b"connection", b"close") not in error.headers


def test_past_the_drain_bounds_the_connection_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http, "DRAIN_MAX_BYTES", 300)
    receive = chunks([100] * 10)
    error = refusal(receive, {}, limit=50)
    assert receive.calls < 10
    assert (b"connection", b"close") in error.headers
    receive = chunks([100] * 10)  # declared beyond the bound: not read at all
    error = refusal(receive, {b"content-length": b"1000"}, limit=50)
    assert receive.calls == 1
    assert (b"connection", b"close") in error.headers
    monkeypatch.setattr(http, "DRAIN_MAX_BYTES", 10_000)
    monkeypatch.setattr(http, "DRAIN_MAX_SEC", 0.05)
    receive = chunks([100] * 10, delay=0.02)  # a client too slow to drain
    error = refusal(receive, {b"content-length": b"1000"}, limit=50)
    assert receive.calls < 10
    assert (b"connection", b"close") in error.headers


def test_expect_100_continue_over_the_limit_is_refused_without_reading() -> None:
    receive = chunks([100])
    error = refusal(receive, {b"expect": b"100-continue", b"content-length": b"1000"}, limit=50)
    assert receive.calls == 0  # uvicorn sends "100 Continue" on the first receive()
    assert (b"connection", b"close") in error.headers
