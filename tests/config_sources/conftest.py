"""A local HTTP server serving config payloads that a test changes while `serve` runs."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import pytest


@dataclass
class ConfigServer:
    """Serves `payloads[path]` (bytes, or JSON-able) to requests with `user:password` basic auth."""

    port: int
    user: str = "cfg"
    password: str = "s3cret"
    payloads: dict[str, Any] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)

    def url(self, path: str, auth: bool = True) -> str:
        creds = f"{self.user}:{self.password}@" if auth else ""
        return f"http://{creds}127.0.0.1:{self.port}{path}"

    def body(self, path: str) -> bytes | None:
        value = self.payloads.get(path)
        if value is None or isinstance(value, bytes):
            return value
        return orjson.dumps(value)


def _handler(config: ConfigServer) -> type[BaseHTTPRequestHandler]:
    expected = "Basic " + base64.b64encode(f"{config.user}:{config.password}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            config.hits[self.path] = config.hits.get(self.path, 0) + 1
            if self.headers.get("Authorization") != expected:
                self._answer(401, b"unauthorized", [("WWW-Authenticate", 'Basic realm="config"')])
                return
            body = config.body(self.path)
            if body is None:
                self._answer(404, b"not found")
                return
            self._answer(200, body, [("Content-Type", "application/json")])

        def _answer(self, status: int, body: bytes, headers: list[tuple[str, str]] = ()) -> None:  # type: ignore[assignment]
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def config_server() -> Iterator[ConfigServer]:
    config = ConfigServer(port=0)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(config))
    config.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield config
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)
