"""A real local HTTP server for the HTTP destinations' tests: it records every request it receives
(method, path, query, headers, body) and answers as told: 200 by default, or a scripted series of
answers (any status, headers such as Retry-After, a body) or a hang (no answer until released)."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    query: list[tuple[str, str]]
    """In the order sent, values decoded."""
    raw_query: str
    headers: dict[str, str]
    """Names lower-cased."""
    body: bytes


@dataclass
class Answer:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    hang: bool = False


class Recorder:
    """Start with `start()`; `url` is its base URL; `requests` what it received, in order."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.arrivals: list[float] = []
        """`time.monotonic()` of each request's arrival."""
        self._script: deque[Answer] = deque()
        self._rules: list[tuple[bytes, Answer]] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # quiet
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                received = Received(
                    self.command,
                    parts.path,
                    parse_qsl(parts.query, keep_blank_values=True),
                    parts.query,
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                )
                answer = recorder._record(received)
                if answer.hang:
                    recorder._release.wait(30)
                    self.close_connection = True
                    return
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> Recorder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

    def answer(self, status: int = 200, body: bytes | str = b"", times: int = 1, **headers: str) -> None:
        """The next `times` requests get this answer (then the default 200). Header names use
        `_` for `-`: `answer(429, Retry_After="1")`."""
        data = body.encode() if isinstance(body, str) else body
        named = {name.replace("_", "-"): value for name, value in headers.items()}
        with self._lock:
            self._script.extend(Answer(status, named, data) for _ in range(times))

    def answer_when(self, marker: bytes | str, status: int, body: bytes | str = b"", **headers: str) -> None:
        """Every request whose body or query holds `marker` gets this answer (before the script):
        answers by content, whatever the order requests arrive in."""
        mark = marker.encode() if isinstance(marker, str) else marker
        data = body.encode() if isinstance(body, str) else body
        named = {name.replace("_", "-"): value for name, value in headers.items()}
        with self._lock:
            self._rules.append((mark, Answer(status, named, data)))

    def hang(self, times: int = 1) -> None:
        """The next `times` requests get no answer (until `stop`)."""
        with self._lock:
            self._script.extend(Answer(hang=True) for _ in range(times))

    def _record(self, received: Received) -> Answer:
        with self._lock:
            self.requests.append(received)
            self.arrivals.append(time.monotonic())
            for mark, answer in self._rules:
                if mark in received.body or mark in received.raw_query.encode():
                    return answer
            return self._script.popleft() if self._script else Answer()

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            assert time.monotonic() < deadline, f"{len(self.requests)} requests received, waited for {count}"
            time.sleep(0.02)
        return list(self.requests)
