"""The collector as an ASGI application: a `Collector` that routes requests to the handlers.

`CollectorApp(config)` does no I/O; `open()` (run by the ASGI lifespan startup) creates the
directories and starts group commit, `close()` (lifespan shutdown, idempotent) rotates what was
written and closes every file (see `eventspark.collector.core`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import perf_counter

from eventspark.collector import routes
from eventspark.collector.core import Collector
from eventspark.collector.http import (
    ClientDisconnected,
    HTTPError,
    Receive,
    Request,
    Response,
    Scope,
    Send,
)
from eventspark.config.models import Config
from eventspark.logconfig import REQUEST, REQUEST_ID_KEY

logger = logging.getLogger(__name__)


class CollectorApp(Collector):
    """The EventNative API over this process's incoming logs and stream queues."""

    def __init__(
        self, config: Config, worker: int | None = None, instances: Callable[[], list[str]] | None = None
    ) -> None:
        super().__init__(config, worker, instances, _endpoint_names())

    # --- ASGI -------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self._lifespan(receive, send)
            return
        started = perf_counter()
        REQUEST.set(scope)  # log lines of this request carry its id (eventspark.logconfig)
        name = scope["path"]
        methods = routes.ROUTES.get(name)
        if methods is None:
            found = routes.find(name)
            name, methods = found if found else ("unknown", {})
        handler = methods.get(scope["method"], _no_handler)
        try:
            found = self._plain_queries.get(scope["query_string"]) if handler is routes.js_event else None
            if found is not None:
                # The JS SDK's `?token=<client secret>`, most of the traffic: `js_event` without a
                # Request object, the query string and the token found in one look-up.
                token, secret = found
                response = await routes.client_events(self, token, secret, dict(scope["headers"]), scope, receive)
            else:
                response = await handler(self, Request(scope, receive))
        except HTTPError as exc:
            self.metrics.reject(exc.token_id, exc.status)
            response = exc.response()
        except ClientDisconnected:
            return
        except Exception as exc:
            logger.exception("unexpected error on %s %s", scope["method"], scope["path"])
            response = HTTPError(500, "Internal server error", type(exc).__name__).response()
        headers = response.headers
        if REQUEST_ID_KEY in scope:  # something was logged: the client can quote the id of those lines
            headers = [*headers, (b"x-request-id", scope[REQUEST_ID_KEY].encode())]
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": response.body})
        self.latency[name].observe(perf_counter() - started)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self.open()
                    self.start_rotation()
                except OSError as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _no_handler(app: CollectorApp, request: Request) -> Response:
    """404 for an unknown path; for a known one, the CORS preflight or 405."""
    found = routes.find(request.path)
    if found is None:
        raise HTTPError(404, "Not found", f"no endpoint {request.path}")
    name, methods = found
    if request.method == "OPTIONS":
        return routes.preflight(app, request, routes.is_js(name))
    allow = ", ".join(methods)
    raise HTTPError(405, "Method not allowed", f"{name} accepts {allow}", [(b"allow", allow.encode())])


def _endpoint_names() -> list[str]:
    return [*routes.ROUTES, routes.RANDOM_URL_PREFIX, "unknown"]
