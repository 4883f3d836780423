"""One request on the wire: the standard library's `http.client`, a deadline per attempt, retries
with exponential back-off on 429, 5xx and connection errors, respecting `Retry-After`."""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import logging
import math
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from datetime import UTC
from typing import Literal
from urllib.parse import urlsplit

from eventspark.destinations.http.config import HttpBlock
from eventspark.destinations.http.service import HttpRequest, Redactor

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 500
"""The longest part of a refusal's body kept as the failed record's reason."""
MAX_READ_BYTES = 64 * 1024
"""The most of an answer read (only the reason matters)."""
USER_AGENT = "eventspark"
MAX_RETRY_AFTER = 3600.0
"""The longest `Retry-After` honoured (seconds): a longer or absurd one counts as this."""

Kind = Literal["delivered", "refused", "transient"]


@dataclass(frozen=True, slots=True)
class Result:
    """What became of one request: `reason` says why when not delivered; `retry_after` is the
    wait the service asked for (seconds; 0: it did not say)."""

    kind: Kind
    reason: str = ""
    retry_after: float = 0.0
    status: int = 0
    body: str = ""
    """The refusal's body as received (up to `MAX_READ_BYTES`), for the service to read: never
    logged nor recorded as it is (it may echo secrets)."""


class Sender:
    """Sends requests of one destination; thread-safe (each call opens its own connection)."""

    def __init__(self, service_name: str, block: HttpBlock, redact: Redactor) -> None:
        self.service_name = service_name
        self.block = block
        self.redact = redact
        self._closing = threading.Event()

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    def close(self) -> None:
        """Cuts waits between retries short, and requests not started yet end at once (transient:
        their events stay queued); the request in flight ends with its deadline."""
        self._closing.set()

    def reopen(self) -> None:
        self._closing.clear()

    def send(self, request: HttpRequest) -> Result:
        """The request, retried up to `retries` times while the answer is transient."""
        if self._closing.is_set():
            return STOPPING
        block = self.block
        delay = block.retry_min_sec
        result = self.attempt(request)
        for _ in range(block.retries):
            if result.kind != "transient":
                break
            wait = min(max(delay, result.retry_after), block.retry_max_sec)
            if result.retry_after > block.retry_max_sec:
                break  # the service asked for a long pause: the worker keeps the events and waits
            log.info("%s: %s; retrying in %.1f s", self.service_name, result.reason, wait)
            if self._closing.wait(wait):
                break
            delay = min(delay * 2, block.retry_max_sec)
            result = self.attempt(request)
        return result

    def attempt(self, request: HttpRequest) -> Result:
        """One attempt, classified: 2xx delivered; 429, 408, 5xx and connection errors transient;
        anything else (3xx included: redirects are not followed) refused with the answer's
        status, reason phrase and body. `timeout_sec` bounds the whole attempt once connected
        (sending, waiting, reading the answer): a watchdog shuts the socket down at the deadline;
        connecting is bounded by `timeout_sec` too, name resolution by the system's resolver."""
        try:
            parts = urlsplit(request.url)
            port = parts.port
        except ValueError:  # an IPv6 address not closed, a port out of range...
            return Result("refused", f"{self.service_name}: cannot send the request: the URL is not valid")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return Result("refused", f"{self.service_name}: cannot send the request: not an http(s) URL")
        where = _host(request.url)
        timeout = self.block.timeout_sec
        connection: http.client.HTTPConnection
        if parts.scheme == "https":
            connection = http.client.HTTPSConnection(parts.hostname, port, timeout=timeout, context=_tls())
        else:
            connection = http.client.HTTPConnection(parts.hostname, port, timeout=timeout)
        expired = threading.Event()

        def cut() -> None:
            expired.set()
            sock = connection.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        watchdog = threading.Timer(timeout, cut)
        watchdog.daemon = True
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = {"User-Agent": USER_AGENT, **request.headers}
        watchdog.start()
        try:
            connection.connect()
            if expired.is_set():
                raise TimeoutError
            connection.request(request.method, target, body=request.body, headers=headers)
            response = connection.getresponse()
            body = _read(response)
            if expired.is_set():
                raise TimeoutError
            if 200 <= response.status <= 299:
                return Result("delivered", status=response.status)
            return self._answer(response.status, response.reason, response.getheader("Retry-After"), body)
        except http.client.InvalidURL:  # the same every time: not worth retrying
            return Result("refused", f"{self.service_name}: cannot send the request: the URL is not valid")
        except (http.client.HTTPException, OSError) as exc:
            why = "timed out" if expired.is_set() else _why(exc)
            return Result("transient", self.redact(f"{self.service_name} {where}: {why}"))
        except ValueError as exc:  # a header http.client cannot send: the same every time
            # Not the exception's text: it quotes the header's value, which may hold a secret.
            what = "a header is not Latin-1" if isinstance(exc, UnicodeError) else "a header is not valid"
            return Result("refused", f"{self.service_name}: cannot send the request: {what}")
        finally:
            watchdog.cancel()
            connection.close()

    def _answer(self, status: int, phrase: object, retry_after: str | None, body: str) -> Result:
        # The status is never redacted (a short secret must not turn "401" into "4***").
        text = f"{self.service_name} answered HTTP {status}"
        extra = f"{phrase or ''}".strip()
        if body:
            extra += f": {_cut(body)}"
        reason = f"{text} {self.redact(extra)}".rstrip()
        if status == 429 or status == 408 or 500 <= status <= 599:
            return Result("transient", reason, _retry_after(retry_after), status)
        return Result("refused", reason, status=status, body=body)


STOPPING = Result("transient", "the worker is stopping: not sent")


def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()


def _read(response: http.client.HTTPResponse) -> str:
    try:
        raw = response.read(MAX_READ_BYTES)
    except (OSError, http.client.HTTPException):
        return ""
    return raw.decode("utf-8", "replace").strip()


def _cut(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS] + "..."


def _why(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    if isinstance(reason, BaseException):
        exc = reason
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error: {exc.reason or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    return f"{type(exc).__name__}: {exc}"


def _host(url: str) -> str:
    """Where a request went, without the path and query (which may carry secrets)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "(a URL not valid)"
    return f"{parts.scheme}://{parts.hostname}{f':{port}' if port else ''}"


def _retry_after(value: str | None) -> float:
    """`Retry-After` in seconds: a number of seconds or an HTTP date; 0 when absent or unreadable."""
    if not value:
        return 0.0
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, min(seconds, MAX_RETRY_AFTER)) if math.isfinite(seconds) else 0.0
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 0.0
    if when.tzinfo is None:  # "-0000": UTC, by RFC 5322
        when = when.replace(tzinfo=UTC)
    return max(0.0, min(when.timestamp() - time.time(), MAX_RETRY_AFTER))
