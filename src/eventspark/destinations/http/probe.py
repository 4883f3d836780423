"""The HTTP family's probe (`DestinationType.probe`): the service's own check (`Service.probe`).

Each service says what proves its URL and key without delivering an event: a request to a
validation endpoint read by the service's verdict (Google Analytics' `/debug/...` servers,
Facebook's empty event list), or only a connection to its host (webhook, Amplitude). With
`send_event`, one probe event goes through the destination's own sending path instead, as the
operator asked. Every step is bounded by the block's `timeout_sec`.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

from eventspark.destinations.base import PartlyDelivered, TerminalError, TransientError
from eventspark.destinations.http.service import HttpRequest
from eventspark.destinations.http.sink import HttpSink
from eventspark.steps.context import utc_timestamp

MAX_ANSWER_BYTES = 64 * 1024


def probe(sink: HttpSink, send_event: bool = False) -> str:
    """What was checked; DestinationError with the service's answer (secrets redacted)."""
    try:
        if send_event:
            return _send_probe_event(sink)
        check = sink.service.probe()
        if check.request is None:
            return f"connected to {_connect(check.url, sink.block.timeout_sec)} (no event sent)"
        status, body = _fetch(check.request, sink.block.timeout_sec)
        problem = check.verdict(status, body) if check.verdict else None if 200 <= status <= 299 else f"HTTP {status}"
        if problem:
            raise TerminalError(f"{sink.service.name}: {problem}")
        return f"{sink.service.name} accepted the validation request (HTTP {status}; no event recorded)"
    except (OSError, http.client.HTTPException) as exc:
        raise TransientError(f"{sink.service.name}: {type(exc).__name__}: {exc}") from None
    except TerminalError as exc:
        raise TerminalError(sink.redact(str(exc))) from None
    except TransientError as exc:
        raise TransientError(sink.redact(str(exc))) from None
    finally:
        sink.close()


def probe_event() -> dict[str, Any]:
    """The event `send_event` delivers: recognisable, and the same shape as a collected one."""
    return {
        "event_type": "eventspark_probe",
        "eventn_ctx_event_id": str(uuid.uuid4()),
        "_timestamp": utc_timestamp(),
        "src": "eventspark_probe",
    }


def _send_probe_event(sink: HttpSink) -> str:
    try:
        (outcome,) = sink.send([probe_event()])
    except PartlyDelivered as exc:
        raise TransientError(str(exc)) from None
    if outcome is not None:
        raise TerminalError(outcome)
    return f"{sink.service.name} took one probe event (event_type eventspark_probe)"


def _address(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TerminalError("the URL is not an http(s) URL")
    return parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def _connect(url: str, timeout: float) -> str:
    """Opens (and closes) a connection to the URL's host and port, TLS handshake included."""
    scheme, host, port = _address(url)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        if scheme == "https":
            with ssl.create_default_context().wrap_socket(sock, server_hostname=host):
                pass
    return f"{scheme}://{host}:{port}"


def _fetch(request: HttpRequest, timeout: float) -> tuple[int, str]:
    """(status, body) of one request; the whole exchange within `timeout` seconds."""
    scheme, host, port = _address(request.url)
    parts = urlsplit(request.url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    deadline = time.monotonic() + timeout
    kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    connection = kind(host, port, timeout=timeout)
    try:
        connection.request(
            request.method, target, body=request.body, headers={"User-Agent": "eventspark"} | dict(request.headers)
        )
        if connection.sock is not None:
            connection.sock.settimeout(max(0.1, deadline - time.monotonic()))
        response = connection.getresponse()
        body = response.read(MAX_ANSWER_BYTES).decode("utf-8", "replace")
        return response.status, body
    finally:
        connection.close()
