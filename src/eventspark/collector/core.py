"""The collector's state and the steps every event endpoint shares (no HTTP routing here).

Handlers (`eventspark.collector.api`) take a `Collector`; the ASGI application
(`eventspark.collector.app`) is a `Collector` that routes requests to them, so imports go one
way: app → routes → api → core.

`Collector(config)` does no I/O; `open()` (run by the ASGI lifespan startup) creates the
directories and starts group commit, `close()` (lifespan shutdown, idempotent) rotates what was
written and closes every file. Between the two, every accepted request's lines have been
handed to the OS with `os.write` (and fsynced with `server.fsync`) before its 200 is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from eventspark.collector.auth import Token, TokenTable
from eventspark.collector.group_commit import GroupCommit
from eventspark.collector.http import HTTPError, Scope, sender
from eventspark.collector.metrics import CollectorMetrics
from eventspark.collector.multiplex import Route, build_routes
from eventspark.collector.proxies import TrustedProxies
from eventspark.config.models import Config
from eventspark.config.sources import SourcesWatch
from eventspark.logs.incoming import IncomingLogs
from eventspark.logs.upload import upload_rotated
from eventspark.ops.cache import events_cache_for, token_ids
from eventspark.ops.metrics import Snapshots, process_snapshots
from eventspark.ops.passes import RotationRequests
from eventspark.ops.status import StatusReader
from eventspark.steps.context import enrich_context, utc_timestamp
from eventspark.stream.queue import QueueWriter, queue_dir

logger = logging.getLogger(__name__)

DEFAULT_SERVER_NAME = "unnamed-server"
SOURCES_POLL_SEC = 1.0
"""How often a collector process looks for a config its serving process reloaded (one stat)."""
SOURCES_RETRY_SEC = 30.0
"""After a reloaded config this process could not use (the serving process did: it is retried)."""
_DUMPS_OPTION = orjson.OPT_APPEND_NEWLINE


class Collector:
    """This process's tokens, routes, incoming logs, stream spools and metrics (see module doc)."""

    def __init__(
        self,
        config: Config,
        worker: int | None = None,
        instances: Callable[[], list[str]] | None = None,
        endpoints: Iterable[str] = (),
    ) -> None:
        """`endpoints`: the route names the latency histograms are kept for."""
        self.config = config
        self.worker = worker
        self.server_name = config.server.name or DEFAULT_SERVER_NAME
        self.instances = instances or (lambda: [])
        """Live nodes of the cluster (the coordination store's heartbeats)."""
        self.max_event_size = config.server.max_event_size
        self.admin_token = config.server.admin_token
        self.tokens = TokenTable(config.api_keys)
        self.proxies = TrustedProxies(config.server.trusted_proxies)
        self._plain_queries = self.tokens.by_plain_query
        self.log_path = Path(config.log.path)
        self.logs = IncomingLogs(self.log_path / "incoming", worker, fsync=config.server.fsync)
        self.routes, self.spools = build_routes(config, self.tokens.tokens, self.logs, worker)
        self._routable = {token_id: route for token_id, route in self.routes.items() if route.has_destination}
        self.metrics = CollectorMetrics(self.routes, endpoints)
        self.status = StatusReader(config)
        """Queue depths and the like from the files under `log.path` (the gauges of `/prometheus`)."""
        self.snapshots: Snapshots | None = None
        """This process's metrics snapshots while open (`eventspark.ops.metrics`)."""
        # The dicts `metrics` renders, bound here for the hot path.
        self.accepted, self.latency = self.metrics.accepted, self.metrics.latency
        self.group_commit = GroupCommit() if config.server.fsync else None
        self.events_cache = events_cache_for(config)
        """The events cache (None: disabled); accepted events are recorded there as pending."""
        self._cached_destinations = {
            token_id: route.batch_destinations + route.stream_destinations for token_id, route in self.routes.items()
        }
        self._rotation: asyncio.Task[None] | None = None
        self._upload: asyncio.Task[None] | None = None
        """The upload of rotated logs to `log.remote` under way in a thread (`_start_upload`)."""
        self.sources_watch: SourcesWatch | None = None
        """The config published by the serving process when api_keys or destinations are URLs."""
        self._following: asyncio.Task[None] | None = None
        self._retired: dict[str, QueueWriter] = {}
        """Spools of stream destinations a reload removed: open until `close`, because a request
        that took its route before the reload may still write there or wait on their fsync."""
        self._open = False

    # --- life cycle -------------------------------------------------------------------------------

    def open(self) -> None:
        self.logs.incoming_dir.mkdir(parents=True, exist_ok=True)
        for dest_id in self.spools:
            queue_dir(self.log_path, dest_id).mkdir(parents=True, exist_ok=True)
        if self.group_commit is not None:
            self.group_commit.start()
        self.snapshots = process_snapshots(self.log_path)
        self.snapshots.add_source(self.metrics.sample)
        self.sources_watch = SourcesWatch.open(self.log_path)
        self._open = True

    def close(self) -> list[Path]:
        """Stops rotation and group commit, rotates the written logs, closes the files."""
        if not self._open:
            return []
        self._open = False
        if self._rotation is not None:
            with contextlib.suppress(RuntimeError):  # its loop may be closed already (forced exit)
                self._rotation.cancel()
            self._rotation = None
        if self._following is not None:
            with contextlib.suppress(RuntimeError):
                self._following.cancel()
            self._following = None
        if self.group_commit is not None:
            self.group_commit.stop()
        for spool in [*self.spools.values(), *self._retired.values()]:
            spool.close(sync=self.logs.fsync)
        rotated = self.logs.close()
        self._upload_now()
        if self.snapshots is not None:
            self.snapshots.release(self.metrics.sample)  # its last counts stay in the node's sums
        if self.events_cache is not None:
            self.events_cache.close()
        logger.info("collector stopped; rotated %d incoming log(s)", len(rotated))
        return rotated

    def start_rotation(self) -> None:
        """Rotates the incoming logs every `log.rotation_min` minutes (needs a running loop)."""
        self._rotation = asyncio.get_running_loop().create_task(self._rotate_periodically())
        if self.sources_watch is not None:
            self._following = asyncio.get_running_loop().create_task(self._follow_sources(self.sources_watch))

    async def _rotate_periodically(self) -> None:
        period = self.config.log.rotation_min * 60
        # A pass request may ask every collector process to rotate now (`ops.passes`).
        rotations = RotationRequests(self.log_path, self.worker)
        self._start_upload()  # what a previous run left
        while True:
            asked = await rotations.wait(period)
            try:
                self.logs.rotate()
            except OSError as exc:  # each file that failed is logged; no traceback a period
                logger.error("rotating incoming logs failed (%s); retrying next period", exc)
            rotations.done(asked)
            self._start_upload()

    # --- uploads to log.remote (eventspark.logs.upload) -------------------------------------------

    def _start_upload(self) -> None:
        """With `log.remote`, uploads the rotated logs in a thread: a slow or down store never holds
        up ingestion nor rotation. One upload at a time; one that fails is retried after the next
        rotation (its logs stay local)."""
        if self.config.log.remote is None or (self._upload is not None and not self._upload.done()):
            return
        self._upload = asyncio.get_running_loop().create_task(self._upload_in_thread())

    async def _upload_in_thread(self) -> None:
        try:
            await asyncio.to_thread(upload_rotated, self.config)
        except Exception:  # e.g. s3fs not installed: said at every rotation, events stay local
            logger.exception("uploading rotated logs to log.remote failed; retrying after the next rotation")

    def _upload_now(self) -> None:
        """The last upload, at shutdown: no request is served any more, so it runs here (bounded:
        `upload_rotated` gives up on a down store), after an upload thread still running (its lock)."""
        if self.config.log.remote is None:
            return
        try:
            upload_rotated(self.config)
        except Exception:
            logger.exception("uploading rotated logs to log.remote at shutdown failed; they stay local")

    # --- reloaded config (eventspark.config.sources) ----------------------------------------------

    async def _follow_sources(self, watch: SourcesWatch) -> None:
        from eventspark.config.loading import build_loaded

        while True:
            await asyncio.sleep(SOURCES_POLL_SEC)
            raw = watch.changed()
            if raw is None:
                continue
            try:  # validated by the serving process already: this should not fail
                loaded = await asyncio.to_thread(build_loaded, raw, embedded=False, checked=True)
                self.reconfigure(loaded.config)
            except Exception:  # e.g. a queue directory not made
                logger.exception("cannot use the reloaded config; keeping the current one, trying again")
                watch.retry()
                await asyncio.sleep(SOURCES_RETRY_SEC)  # not a traceback a second

    def reconfigure(self, config: Config) -> None:
        """Switches to the tokens and destinations of `config` (other sections are the same):
        stream spools of kept destinations stay open; removed ones are retired, not closed (see
        `_retired`; their queues stay on disk, and take up again if the destination comes back);
        a token without destinations is answered 422 as at start. On the loop's thread, so no
        handler runs in between; nothing changes when it raises."""
        tokens = TokenTable(config.api_keys)
        known = {**self._retired, **self.spools}
        routes, spools = build_routes(config, tokens.tokens, self.logs, self.worker, known)
        for dest_id in spools:
            queue_dir(self.log_path, dest_id).mkdir(parents=True, exist_ok=True)
        self._retired = {dest_id: spool for dest_id, spool in known.items() if dest_id not in spools}
        for token_id in routes:
            self.accepted.setdefault(token_id, 0)
        self.config, self.tokens, self._plain_queries = config, tokens, tokens.by_plain_query
        self.routes, self.spools = routes, spools
        self._routable = {token_id: route for token_id, route in routes.items() if route.has_destination}
        self._cached_destinations = {
            token_id: route.batch_destinations + route.stream_destinations for token_id, route in routes.items()
        }
        self.status = StatusReader(config)
        if self.events_cache is not None:  # the cached events of new tokens show their ids
            self.events_cache.tokens.update(token_ids(config))
        logger.info("config reloaded: %d token(s), %d destination(s)", len(tokens.tokens), len(config.destinations))

    # --- events -----------------------------------------------------------------------------------

    def route(self, token: Token) -> Route:
        """The token's route; 422 when no destination takes the token."""
        route = self._routable.get(token.id)
        if route is None:
            raise HTTPError(
                422,
                f"No destination is configured for token '{token.id}'",
                "add a destination, or list the token in a destination's only_tokens",
            )
        return route

    def prepare(
        self, events: list[dict[str, Any]], secret: str, ip: str, user_agent: str | None, server_side: bool
    ) -> bytes:
        """ContextEnrichment of every event (one `_timestamp` for all), then their log lines."""
        now = utc_timestamp()
        for event in events:
            enrich_context(
                event, token=secret, source_ip=ip, user_agent=user_agent, server_side=server_side, timestamp=now
            )
        if len(events) == 1:
            return orjson.dumps(events[0], option=_DUMPS_OPTION)
        return b"".join([orjson.dumps(event, option=_DUMPS_OPTION) for event in events])

    def write(self, route: Route, token: Token, lines: bytes, count: int) -> None:
        """Hands the lines to the OS in every file of the route; 503 when that fails."""
        if count == 0:
            return
        written = 0
        try:
            for file in route.files:
                file.write(lines, count)
                written += 1
        except OSError as exc:
            if written and route.incoming is not None:  # the incoming log comes first in `files`
                route.incoming.undo(len(lines), count)  # a stream queue's consumer may have read its lines
            logger.error("cannot store events of token %s: %s", token.id, exc)
            raise HTTPError(503, "Failed to store events", exc.strerror or str(exc)) from None
        self.accepted[token.id] += count

    async def sync(self, route: Route) -> None:
        """With `server.fsync`, waits for the group commit of the route's files; 503 when fsync fails."""
        if self.group_commit is None:
            return
        try:
            await self.group_commit.sync(route.files)
        except OSError as exc:
            logger.error("fsync of incoming logs failed: %s", exc)
            raise HTTPError(503, "Failed to store events", exc.strerror or str(exc)) from None

    def accept(
        self,
        route: Route,
        token: Token,
        secret: str,
        events: list[dict[str, Any]],
        scope: Scope,
        headers: dict[bytes, bytes],
        server_side: bool,
    ) -> bool:
        """Enriches and writes the events of one request; True when they must be synced (`sync`).

        Not a coroutine: without `server.fsync` a request needs no second await.
        """
        ip, user_agent = sender(scope, headers, server_side, self.proxies)
        count = len(events)
        self.write(route, token, self.prepare(events, secret, ip, user_agent, server_side), count)
        if self.events_cache is not None and count:  # a counter check; records go to a thread
            # .get: a reload may have removed the token while its request was read
            self.events_cache.accepted(self._cached_destinations.get(token.id, ()), token.id, events)
        return count > 0 and self.group_commit is not None
