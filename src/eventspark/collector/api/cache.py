"""The events cache: `GET /api/v1/events/cache` (admin token).

`?destination_ids=a,b&token_ids=t&start=&end=&limit=100` answers the newest `limit` entries of
each destination (all destinations of the config when none is named), newest first:
`{"total_events": N, "response_events": M, "events": [...]}` (`eventspark.ops.cache`).
"""

from __future__ import annotations

import asyncio

import orjson

from eventspark.collector.api.common import Routes
from eventspark.collector.auth import check_admin
from eventspark.collector.core import Collector
from eventspark.collector.http import JSON_TYPE, HTTPError, Request, Response
from eventspark.ops.cache import DEFAULT_LIMIT, MAX_LIMIT, EventsCache, parse_time
from eventspark.ops.cache_store import MemoryStore

MAX_IDS = 100
"""The most destination or token ids one request may name."""
MAX_ID_CHARS = 256


async def events_cache(app: Collector, request: Request) -> Response:
    check_admin(request, app.admin_token)
    cache: EventsCache | None = app.events_cache
    if cache is None:
        raise HTTPError(404, "The events cache is disabled", "set server.cache.enabled: true (and events.size > 0)")
    destinations = _ids(request, "destination_ids") or _all_destinations(app, cache)
    tokens = _ids(request, "token_ids")
    start, end = _time(request, "start"), _time(request, "end")
    limit = _limit(request)
    if cache.local:
        total, found = cache.query(destinations, start, end, tokens, limit)
    else:  # a file or a network store: off the event loop
        try:
            total, found = await asyncio.to_thread(cache.query, destinations, start, end, tokens, limit)
        except Exception as exc:
            raise HTTPError(503, "The events cache store is unavailable", f"{type(exc).__name__}: {exc}") from None
    body = {"total_events": total, "response_events": len(found), "events": [e.to_json() for e in found]}
    return Response(200, orjson.dumps(body), [JSON_TYPE])


def _all_destinations(app: Collector, cache: EventsCache) -> list[str]:
    names = list(app.config.destinations)
    if isinstance(cache.store, MemoryStore):  # e.g. a destination removed from the config
        names += [name for name in cache.store.destinations() if name not in app.config.destinations]
    return names


def _ids(request: Request, name: str) -> list[str]:
    raw = request.query_param(name)
    if not raw:
        return []
    ids = [part.strip() for part in raw.split(",") if part.strip()]
    if len(ids) > MAX_IDS or any(len(part) > MAX_ID_CHARS for part in ids):
        raise HTTPError(400, f"Bad {name}", f"at most {MAX_IDS} ids of at most {MAX_ID_CHARS} characters")
    return list(dict.fromkeys(ids))


def _time(request: Request, name: str) -> float | None:
    raw = request.query_param(name)
    if raw is None or raw == "":
        return None
    try:
        return parse_time(raw)
    except ValueError as exc:
        raise HTTPError(400, f"Bad {name}", str(exc)) from None


def _limit(request: Request) -> int:
    raw = request.query_param("limit")
    if raw is None or raw == "":
        return DEFAULT_LIMIT
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6) or not 1 <= int(raw) <= MAX_LIMIT:
        raise HTTPError(400, "Bad limit", f"an integer from 1 to {MAX_LIMIT}")
    return int(raw)


ROUTES: Routes = {
    "/api/v1/events/cache": {"GET": events_cache},
}
