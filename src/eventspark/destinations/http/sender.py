"""One request on the wire: the standard library's `urllib`, a timeout per attempt, retries with
exponential back-off on 429, 5xx and connection errors, respecting `Retry-After`."""

from __future__ import annotations

import email.utils
import http.client
import logging
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
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

Kind = Literal["delivered", "refused", "transient"]


@dataclass(frozen=True, slots=True)
class Result:
    """What became of one request: `reason` says why when not delivered; `retry_after` is the
    wait the service asked for (seconds; 0: it did not say)."""

    kind: Kind
    reason: str = ""
    retry_after: float = 0.0
    status: int = 0


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer like any other (refused): following it could send the body and
    its secrets to another host."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


class Sender:
    """Sends requests of one destination; thread-safe (each call opens its own connection)."""

    def __init__(self, service_name: str, block: HttpBlock, redact: Redactor) -> None:
        self.service_name = service_name
        self.block = block
        self.redact = redact
        self._opener = urllib.request.build_opener(_NoRedirect())
        self._closing = threading.Event()

    def close(self) -> None:
        """Cuts waits between retries short (the request in flight ends with its timeout)."""
        self._closing.set()

    def reopen(self) -> None:
        self._closing.clear()

    def send(self, request: HttpRequest) -> Result:
        """The request, retried up to `retries` times while the answer is transient."""
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
        anything else refused with the answer's status, reason phrase and body."""
        headers = {"User-Agent": USER_AGENT, **request.headers}
        wire = urllib.request.Request(request.url, data=request.body, headers=headers, method=request.method)
        try:
            with self._opener.open(wire, timeout=self.block.timeout_sec) as response:
                response.read(MAX_READ_BYTES)
                return Result("delivered", status=response.status)
        except urllib.error.HTTPError as exc:
            with exc:
                return self._answer(exc.code, exc.reason, exc.headers.get("Retry-After"), _body(exc))
        except http.client.InvalidURL as exc:  # the same every time: not worth retrying
            return Result("refused", self.redact(f"{self.service_name}: cannot send the request: {exc}"))
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            return Result("transient", self.redact(f"{self.service_name} {_host(request.url)}: {_why(exc)}"))
        except ValueError as exc:  # a URL or header urllib cannot send: the same every time
            return Result("refused", self.redact(f"{self.service_name}: cannot send the request: {exc}"))

    def _answer(self, status: int, phrase: object, retry_after: str | None, body: str) -> Result:
        text = f"{self.service_name} answered HTTP {status} {phrase or ''}".rstrip()
        if body:
            text += f": {body}"
        reason = self.redact(text)
        if status == 429 or status == 408 or 500 <= status <= 599:
            return Result("transient", reason, _retry_after(retry_after), status)
        return Result("refused", reason, status=status)


def _body(error: urllib.error.HTTPError) -> str:
    try:
        raw = error.read(MAX_READ_BYTES)
    except (OSError, http.client.HTTPException):
        return ""
    text = raw.decode("utf-8", "replace").strip()
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
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}"


def _retry_after(value: str | None) -> float:
    """`Retry-After` in seconds: a number of seconds or an HTTP date; 0 when absent or unreadable."""
    if not value:
        return 0.0
    value = value.strip()
    try:
        return max(0.0, min(float(value), 3600.0))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, min(when.timestamp() - time.time(), 3600.0))
