"""The table of the HTTP API: every handler module's routes, and how a path finds them."""

from __future__ import annotations

from eventspark.collector.api import admin, cache, events, openapi, replay, segment, static, tools, ui
from eventspark.collector.api.common import Handler, Routes
from eventspark.collector.api.events import RANDOM_URL_PREFIX, client_events, js_event, preflight

__all__ = ["RANDOM_URL_PREFIX", "ROUTES", "client_events", "find", "is_js", "js_event", "preflight"]

ROUTES: Routes = {
    **admin.ROUTES,
    **events.ROUTES,
    **replay.ROUTES,
    **cache.ROUTES,
    **tools.ROUTES,
    **ui.ROUTES,
    **openapi.ROUTES,
    **segment.ROUTES,
    **static.ROUTES,
}


def find(path: str) -> tuple[str, dict[str, Handler]] | None:
    """(route name, handlers by method) for a path; trailing slashes are ignored."""
    methods = ROUTES.get(path)
    if methods is not None:
        return path, methods
    if path.startswith(RANDOM_URL_PREFIX):
        return RANDOM_URL_PREFIX, events.JS_METHODS
    if path.startswith(static.PREFIXES):  # the tracking script: /s/<file>, /t/<file>
        return static.route_name(path), static.METHODS
    if len(path) > 1 and path.endswith("/"):
        return find(path.rstrip("/") or "/")
    return None


def is_js(name: str) -> bool:
    return name in events.JS_PATHS or name == RANDOM_URL_PREFIX
