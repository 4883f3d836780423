"""A real HTTP server in front of an object store (moto, fake-gcs-server) for failure tests: it
forwards every request and records it, except that writes (PUT, POST) are answered with the
statuses queued in `answers`, one per write, while any remain."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
_BODIES = {
    "s3": (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>injected</Message></Error>"),
    "gcs": b'{"error": {"code": {status}, "message": "injected {code}"}}',
}
_CODES = {403: "AccessDenied", 429: "SlowDown", 500: "InternalError", 503: "ServiceUnavailable"}


class FaultyStore:
    def __init__(self, upstream: str, flavour: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.flavour = flavour
        self.answers: list[int] = []
        self.seen: list[tuple[str, str, int]] = []
        """(method, path, status answered) of every request."""
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=60.0)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def writes(self) -> list[int]:
        return [status for method, _path, status in self.seen if method in ("PUT", "POST")]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def _answer(self, method: str) -> int | None:
        with self._lock:
            if method in ("PUT", "POST") and self.answers:
                return self.answers.pop(0)
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        store = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return None

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()
                    while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                        out += self.rfile.read(size)
                        self.rfile.readline()
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _any(self) -> None:
                method = self.command
                body = self._body()
                status = store._answer(method)
                if status is not None:
                    code = _CODES.get(status, str(status))
                    text = _BODIES[store.flavour].replace(b"{code}", code.encode())
                    text = text.replace(b"{status}", str(status).encode())
                    kind = "application/xml" if store.flavour == "s3" else "application/json"
                    extra = [("Retry-After", "0")] if status == 429 else []
                    self._reply(status, [("Content-Type", kind), *extra], text)
                else:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                    request = store._client.build_request(
                        method, store.upstream + self.path, headers=headers, content=body
                    )
                    response = store._client.send(request, stream=True)
                    try:
                        data = b"".join(response.iter_raw())
                    finally:
                        response.close()
                    status = response.status_code
                    kept = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _HOP]
                    self._reply(status, kept, data)
                with store._lock:
                    store.seen.append((method, self.path, status))

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        return Handler
