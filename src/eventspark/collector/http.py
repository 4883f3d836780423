"""ASGI plumbing for the collector: the request view, body reading, responses and HTTP errors.

Deliberately small and allocation-light: it runs for every event the collector receives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

import orjson

from eventspark.collector.proxies import TrustedProxies

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

JSON_TYPE = (b"content-type", b"application/json")


class HTTPError(Exception):
    """An error answer: JSON `{"message": ..., "error": ...}` with `status`."""

    def __init__(self, status: int, message: str, error: str = "", headers: Headers | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error = error
        self.headers: Headers = headers or []
        self.token_id: str | None = None  # for metrics, once the token is known

    def known(self, token_id: str, headers: Headers = ()) -> HTTPError:  # type: ignore[assignment]
        """This error, raised once the token is known: counted for it, with its CORS headers."""
        self.token_id = token_id
        self.headers.extend(headers)
        return self

    def response(self) -> Response:
        body = orjson.dumps({"message": self.message, "error": self.error})
        return Response(self.status, body, [JSON_TYPE, *self.headers])


class ClientDisconnected(Exception):
    """The client went away before its body was read; nothing is answered."""


class Response:
    """A complete answer; `headers` get Content-Length added here. Instances may be reused."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, headers: Headers) -> None:
        self.status = status
        self.body = body
        self.headers = [*headers, (b"content-length", str(len(body)).encode())]

    @classmethod
    def prebuilt(cls, status: int, body: bytes, headers: Headers) -> Response:
        """A response whose `headers` already hold its Content-Length (hot path)."""
        response = cls.__new__(cls)
        response.status, response.body, response.headers = status, body, headers
        return response


def json_response(data: Any, status: int = 200, headers: Headers | None = None) -> Response:
    return Response(status, orjson.dumps(data), [JSON_TYPE, *(headers or ())])


class Request:
    """What handlers need from an HTTP scope; the query string is parsed on first use."""

    __slots__ = ("_query", "headers", "method", "path", "receive", "scope")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.scope = scope
        self.receive = receive
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        # ASGI header names are lower-case; a repeated header keeps its last value.
        self.headers: dict[bytes, bytes] = dict(scope["headers"])
        self._query: list[tuple[str, str]] | None = None

    @property
    def query(self) -> list[tuple[str, str]]:
        if self._query is None:
            self._query = parse_query(self.scope["query_string"])
        return self._query

    def query_param(self, name: str) -> str | None:
        for key, value in self.query:
            if key == name:
                return value
        return None

    def header(self, name: bytes) -> str | None:
        value = self.headers.get(name)
        return None if value is None else value.decode("utf-8", "replace")

    @property
    def peer(self) -> str | None:
        client = self.scope.get("client")
        return client[0] if client else None


def sender(
    scope: Scope, headers: dict[bytes, bytes], server_side: bool, proxies: TrustedProxies
) -> tuple[str, str | None]:
    """(source IP, User-Agent) of a request.

    The agent is returned for s2s requests too (`server_side`): ContextEnrichment stores it only
    in JS events, but hashes it into `hashed_anonymous_id` on both, as EventNative 1.41 did.
    """
    client = scope.get("client")
    ip = client[0] if client else ""
    if b"x-real-ip" in headers or b"x-forwarded-for" in headers:
        ip = proxies.client_ip(ip, headers)
    agent = headers.get(b"user-agent")
    return ip, None if agent is None else agent.decode("utf-8", "replace")


def parse_query(raw: bytes) -> list[tuple[str, str]]:
    """Query pairs in order; plain `a=b&c=d` strings skip the general (slower) decoder."""
    if not raw:
        return []
    text = raw.decode("latin-1")
    if "%" in text or "+" in text:
        return parse_qsl(text, keep_blank_values=True)
    return [(key, value) for key, _, value in (part.partition("=") for part in text.split("&") if part)]


DRAIN_MAX_BYTES = 64 * 1024 * 1024
"""A body over its limit is still read, and discarded, up to this many bytes: a client that is
still sending when the server closes the connection gets a reset instead of the 413."""
DRAIN_MAX_SEC = 10.0
"""...and for at most this long; past either bound the connection is closed at once, as before."""


async def read_body(
    receive: Receive, headers: dict[bytes, bytes], limit: int, setting: str = "server.max_event_size"
) -> bytes:
    """The whole body; 413 once it is known to exceed `limit` bytes (named by `setting`).

    A refused body is drained first (up to DRAIN_MAX_BYTES and DRAIN_MAX_SEC) so that the client
    reads the 413; a client waiting for `100 Continue` is refused before it sends anything.
    """
    if b"expect" in headers and _declared(headers) > limit:
        raise _too_large(limit, setting, close=True)  # not receive(): that would send 100 Continue
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):  # the usual case: the server has the whole body
        if len(body) > limit:
            raise _too_large(limit, setting)
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        return body
    declared = _declared(headers)
    if declared > limit:
        drained = declared <= DRAIN_MAX_BYTES and await _drain(receive, len(body))
        raise _too_large(limit, setting, close=not drained)
    return await _read_chunks(receive, body, limit, setting)


def _declared(headers: dict[bytes, bytes]) -> int:
    """The Content-Length header's value; -1 when absent or not a number (chunked bodies)."""
    declared = headers.get(b"content-length")
    return int(declared) if declared is not None and declared.isdigit() else -1


async def _read_chunks(receive: Receive, first: bytes, limit: int, setting: str) -> bytes:
    chunks = [first]
    size = len(first)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        more = message.get("more_body", False)
        if size > limit:
            drained = not more or await _drain(receive, size)
            raise _too_large(limit, setting, close=not drained)
        chunks.append(chunk)
        if not more:
            return b"".join(chunks)


async def _drain(receive: Receive, received: int) -> bool:
    """Reads and discards the rest of a body; False when it is longer than DRAIN_MAX_BYTES or
    takes longer than DRAIN_MAX_SEC (the connection is then closed with the rest unread)."""
    try:
        async with asyncio.timeout(DRAIN_MAX_SEC):
            while received <= DRAIN_MAX_BYTES:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnected
                received += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return True
    except TimeoutError:
        pass
    return False


def _too_large(limit: int, setting: str, close: bool = False) -> HTTPError:
    # `close`: the rest of the body was not read, the connection cannot carry another request.
    return HTTPError(
        413,
        "Request body is too large",
        f"the limit is {limit} bytes ({setting})",
        [(b"connection", b"close")] if close else None,
    )
