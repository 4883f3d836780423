"""The collector as an ASGI application.

`CollectorApp(config)` does no I/O; `open()` (run by the ASGI lifespan startup) creates the
directories and starts group commit, `close()` (lifespan shutdown, idempotent) rotates what was
written and closes every file. Between the two, every accepted request's lines have been
handed to the OS with `os.write` (and fsynced with `server.fsync`) before its 200 is sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from eventspark.collector import routes
from eventspark.collector.auth import Token, TokenTable
from eventspark.collector.group_commit import GroupCommit
from eventspark.collector.http import ClientDisconnected, HTTPError, Receive, Request, Response, Scope, Send
from eventspark.collector.metrics import CollectorMetrics
from eventspark.collector.multiplex import Route, build_routes
from eventspark.config.models import Config
from eventspark.logs.incoming import IncomingLogs
from eventspark.steps.context import client_ip, enrich_context

logger = logging.getLogger(__name__)

DEFAULT_SERVER_NAME = "unnamed-server"
_DUMPS_OPTION = orjson.OPT_APPEND_NEWLINE


class CollectorApp:
    def __init__(self, config: Config, worker: int | None = None) -> None:
        self.config = config
        self.server_name = config.server.name or DEFAULT_SERVER_NAME
        self.max_event_size = config.server.max_event_size
        self.admin_token = config.server.admin_token
        self.tokens = TokenTable(config.api_keys)
        self.logs = IncomingLogs(Path(config.log.path) / "incoming", worker, fsync=config.server.fsync)
        self.routes, self.spools = build_routes(config, self.tokens.tokens, self.logs, worker)
        self.metrics = CollectorMetrics()
        self.metrics.watch_queues(self.routes.values())
        self.group_commit = GroupCommit() if config.server.fsync else None
        self._latency = {name: self.metrics.latency.labels(name) for name in _endpoint_names()}
        self._rotation: asyncio.Task[None] | None = None
        self._open = False

    # --- life cycle -------------------------------------------------------------------------------

    def open(self) -> None:
        self.logs.incoming_dir.mkdir(parents=True, exist_ok=True)
        for spool in self.spools.values():
            spool.file.path.parent.mkdir(parents=True, exist_ok=True)
        if self.group_commit is not None:
            self.group_commit.start()
        self._open = True

    def close(self) -> list[Path]:
        """Stops rotation and group commit, rotates the written logs, closes the files."""
        if not self._open:
            return []
        self._open = False
        if self._rotation is not None:
            self._rotation.cancel()
            self._rotation = None
        if self.group_commit is not None:
            self.group_commit.stop()
        for spool in self.spools.values():
            spool.close(sync=self.logs.fsync)
        rotated = self.logs.close()
        logger.info("collector stopped; rotated %d incoming log(s)", len(rotated))
        return rotated

    def start_rotation(self) -> None:
        """Rotates the incoming logs every `log.rotation_min` minutes (needs a running loop)."""
        self._rotation = asyncio.get_running_loop().create_task(self._rotate_periodically())

    async def _rotate_periodically(self) -> None:
        period = self.config.log.rotation_min * 60
        while True:
            await asyncio.sleep(period)
            try:
                self.logs.rotate()
            except OSError:
                logger.exception("rotating incoming logs failed; retrying next period")

    # --- ASGI -------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.handle(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

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

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        request = Request(scope, receive)
        name, response = await self._respond(request)
        if response is None:
            return
        await response.send(send)
        self._latency[name].observe(time.perf_counter() - started)

    async def _respond(self, request: Request) -> tuple[str, Response | None]:
        found = routes.find(request.path)
        if found is None:
            return "unknown", HTTPError(404, "Not found", f"no endpoint {request.path}").response()
        name, methods = found
        handler = methods.get(request.method)
        try:
            if handler is not None:
                return name, await handler(self, request)
            if request.method == "OPTIONS":
                return name, routes.preflight(self, request, routes.is_js(name))
            allow = ", ".join(methods).encode()
            raise HTTPError(
                405, "Method not allowed", f"{name} accepts {allow.decode()}", [(b"allow", allow)]
            )
        except HTTPError as exc:
            self.metrics.reject(exc.token_id, exc.status)
            return name, exc.response()
        except ClientDisconnected:
            return name, None
        except Exception as exc:
            logger.exception("unexpected error on %s %s", request.method, request.path)
            return name, HTTPError(500, "Internal server error", type(exc).__name__).response()

    # --- events -----------------------------------------------------------------------------------

    def route(self, token: Token) -> Route:
        """The token's route; 422 when no destination takes the token."""
        route = self.routes[token.id]
        if not route.has_destination:
            raise HTTPError(
                422,
                f"No destination is configured for token '{token.id}'",
                "add a destination, or list the token in a destination's only_tokens",
            )
        return route

    def sender(self, request: Request, server_side: bool) -> tuple[str, str | None]:
        """(source IP, User-Agent for JS endpoints) of a request."""
        real, forwarded = request.headers.get(b"x-real-ip"), request.headers.get(b"x-forwarded-for")
        if real or forwarded:
            proxies = {
                "x-real-ip": (real or b"").decode("latin-1"),
                "x-forwarded-for": (forwarded or b"").decode("latin-1"),
            }
            ip = client_ip(proxies, request.peer)
        else:
            ip = request.peer or ""
        return ip, None if server_side else request.header(b"user-agent")

    def prepare(
        self, events: list[dict[str, Any]], secret: str, ip: str, user_agent: str | None, server_side: bool
    ) -> bytes:
        """ContextEnrichment of every event, then their log lines."""
        now = datetime.now(UTC)
        for event in events:
            enrich_context(
                event, token=secret, source_ip=ip, user_agent=user_agent, server_side=server_side, now=now
            )
        if len(events) == 1:
            return orjson.dumps(events[0], option=_DUMPS_OPTION)
        return b"".join([orjson.dumps(event, option=_DUMPS_OPTION) for event in events])

    async def commit(self, route: Route, token: Token, lines: bytes, count: int) -> None:
        """Writes the lines to the route's files (and fsyncs them with `server.fsync`)."""
        if count == 0:
            return
        try:
            files = route.write(lines, count)
            if self.group_commit is not None:
                await self.group_commit.sync(files)
        except OSError as exc:
            logger.error("cannot store events of token %s: %s", token.id, exc)
            raise HTTPError(503, "Failed to store events", exc.strerror or str(exc)) from None
        self.metrics.accepted_counter(token.id).inc(count)

    async def ingest(
        self,
        route: Route,
        token: Token,
        secret: str,
        events: list[dict[str, Any]],
        request: Request,
        server_side: bool,
    ) -> None:
        ip, user_agent = self.sender(request, server_side)
        await self.commit(
            route, token, self.prepare(events, secret, ip, user_agent, server_side), len(events)
        )


def _endpoint_names() -> list[str]:
    return [*routes.ROUTES, routes.RANDOM_URL_PREFIX, "unknown"]
