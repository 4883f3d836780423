"""A stand-in server for the page's rendering tests: the real page files, a scripted events cache.

It serves `/ui` and its files through `eventspark.collector.api.ui` (the same bytes and headers
as `serve`) and answers `/api/v1/ui/config` and `/api/v1/events/cache` from data a test sets,
following the cache endpoint's contract, so that every field of it can carry hostile text. The
tests of the real endpoint run against `eventspark serve` (test_live.py).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from eventspark.collector.api import ui


class StubServer:
    """`url`, `config` and `events` (mutable while it runs), `cache_queries` (what the page asked)."""

    def __init__(self, admin_token: str, config: dict[str, Any], events: list[dict[str, Any]]) -> None:
        self.admin_token = admin_token
        self.config = config
        self.events = events
        self.cache_queries: list[dict[str, list[str]]] = []
        self.cache_error: tuple[int, dict[str, str]] | None = None
        """(status, JSON body) the cache endpoint answers instead, when set."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> StubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def cache_answer(self, query: dict[str, list[str]]) -> dict[str, Any]:
        """The contract's answer: filtered by `destination_ids` and `token_ids`, `limit` per destination."""
        self.cache_queries.append(query)
        destinations = set(",".join(query.get("destination_ids", [])).split(",")) - {""}
        tokens = set(",".join(query.get("token_ids", [])).split(",")) - {""}
        limit = int(query.get("limit", ["100"])[0])
        chosen = [
            event
            for event in self.events
            if (not destinations or event["destination_id"] in destinations)
            and (not tokens or event["token_id"] in tokens)
        ]
        per_destination: dict[str, int] = {}
        answer = []
        for event in chosen:
            count = per_destination.get(event["destination_id"], 0)
            if count < limit:
                per_destination[event["destination_id"]] = count + 1
                answer.append(event)
        return {"total_events": len(self.events), "response_events": len(answer), "events": answer}


def _handler(stub: StubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path in ("/ui", "/ui/app.js", "/ui/style.css"):
                asset = ui.asset(parts.path)
                headers = [(b"content-type", asset.content_type), *ui.SECURITY_HEADERS]
                self._answer(200, asset.body, headers)
            elif parts.path in ("/api/v1/ui/config", "/api/v1/events/cache"):
                self._admin(parts.path, parse_qs(parts.query))
            else:
                self._json(404, {"message": "Not found", "error": parts.path})

        def _admin(self, path: str, query: dict[str, list[str]]) -> None:
            if self.headers.get("X-Admin-Token") != stub.admin_token:
                self._json(401, {"message": "Admin token does not match", "error": "stub"})
            elif path == "/api/v1/ui/config":
                self._json(200, stub.config)
            elif stub.cache_error is not None:
                self._json(*stub.cache_error)
            else:
                self._json(200, stub.cache_answer(query))

        def _json(self, status: int, data: Any) -> None:
            self._answer(status, orjson.dumps(data), [(b"content-type", b"application/json")])

        def _answer(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
            self.send_response(status)
            for name, value in headers:
                self.send_header(name.decode(), value.decode())
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: pytest shows failures, not every request

    return Handler
