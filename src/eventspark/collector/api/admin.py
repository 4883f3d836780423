"""Liveness, cluster members, Prometheus metrics and the destinations' status."""

from __future__ import annotations

import asyncio
from typing import Any

from eventspark.collector.api.common import Routes
from eventspark.collector.auth import check_admin
from eventspark.collector.core import Collector
from eventspark.collector.http import HTTPError, Request, Response, json_response
from eventspark.collector.metrics import CONTENT_TYPE as METRICS_TYPE
from eventspark.collector.metrics import render
from eventspark.config.sources import sources_status
from eventspark.coordination.base import CoordinationError
from eventspark.ops.status import storage_usage


async def ping(app: Collector, request: Request) -> Response:
    return Response(200, b"pong", [(b"content-type", b"text/plain; charset=utf-8")])


async def cluster(app: Collector, request: Request) -> Response:
    check_admin(request, app.admin_token)
    try:
        # A network call to the coordination store: off the event loop.
        names = await asyncio.to_thread(app.instances) or [app.server_name]
    except CoordinationError as exc:
        raise HTTPError(503, "The coordination store is unavailable", str(exc)) from None
    return json_response({"instances": [{"name": name} for name in sorted(names)]})


async def prometheus(app: Collector, request: Request) -> Response:
    check_admin(request, app.admin_token)
    if not app.config.server.metrics.prometheus.enabled:
        raise HTTPError(404, "Prometheus metrics are disabled", "set server.metrics.prometheus.enabled: true")
    # Reads the snapshots and the logs' counts: off the event loop.
    return Response(200, await asyncio.to_thread(_exposition, app), [(b"content-type", METRICS_TYPE)])


def _exposition(app: Collector) -> bytes:
    sample = app.snapshots.merged() if app.snapshots is not None else app.metrics.sample()
    return render(sample, app.status.read())


async def status(app: Collector, request: Request) -> Response:
    """`eventspark status` as JSON: `{"destinations": [...]}` (see `eventspark.ops.status`)."""
    check_admin(request, app.admin_token)
    statuses = await asyncio.to_thread(app.status.read)
    body: dict[str, Any] = {"destinations": [s.to_json() for s in statuses]}
    if app.status.held:  # rotated logs no batch destination takes: kept in incoming/, not loaded
        body["held_logs"] = app.status.held
    sources = sources_status(app.log_path)  # api_keys / destinations given as URLs: last reload
    if sources is not None:
        body["config_sources"] = sources
    storage = storage_usage(app.log_path)  # archive/ and failed/ sizes, measured by the retention
    if storage is not None:
        body["storage"] = storage
    return json_response(body)


ROUTES: Routes = {
    "/ping": {"GET": ping, "HEAD": ping},
    "/api/v1/cluster": {"GET": cluster},
    "/prometheus": {"GET": prometheus},
    "/api/v1/status": {"GET": status},
}
