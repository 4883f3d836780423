"""Liveness, cluster members and Prometheus metrics."""

from __future__ import annotations

import asyncio

from eventspark.collector.api.common import Routes
from eventspark.collector.auth import check_admin
from eventspark.collector.core import Collector
from eventspark.collector.http import HTTPError, Request, Response, json_response
from eventspark.collector.metrics import CONTENT_TYPE as METRICS_TYPE
from eventspark.coordination.base import CoordinationError


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
    return Response(200, app.metrics.render(), [(b"content-type", METRICS_TYPE)])


ROUTES: Routes = {
    "/ping": {"GET": ping, "HEAD": ping},
    "/api/v1/cluster": {"GET": cluster},
    "/prometheus": {"GET": prometheus},
}
