"""The live events page: `GET /ui`, its script and style sheet, and `GET /api/v1/ui/config`.

The page is three static files shipped as package data (`eventspark/collector/ui/`), read on
first use and kept in memory with their gzip form and ETag. They hold no data and are served
without a token; everything the page shows comes from admin endpoints (`/api/v1/ui/config`,
`/api/v1/events/cache`) that the script calls with the `X-Admin-Token` header.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources

from eventspark.collector.api.common import Routes
from eventspark.collector.auth import check_admin
from eventspark.collector.core import Collector
from eventspark.collector.http import Headers, Request, Response, json_response
from eventspark.config.routing import takes_token

POLL_INTERVAL_MS = 1000
"""How often the page asks the events cache for new events."""

# The page runs only its own script and style sheet (no inline code) and talks only to this
# server: anything an event smuggles into the page cannot run or call out.
SECURITY_HEADERS: Headers = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        b"object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # The admin token may be in the page's URL: never send it on as a Referer.
    (b"referrer-policy", b"no-referrer"),
]

_FILES = {
    "/ui": ("index.html", b"text/html; charset=utf-8"),
    "/ui/app.js": ("app.js", b"text/javascript; charset=utf-8"),
    "/ui/style.css": ("style.css", b"text/css; charset=utf-8"),
}


@dataclass(frozen=True, slots=True)
class Asset:
    """One file of the page as it is served."""

    body: bytes
    gzipped: bytes
    content_type: bytes
    etag: bytes


@cache
def asset(path: str) -> Asset:
    """The file served at `path` (a key of `_FILES`), read from the package once."""
    name, content_type = _FILES[path]
    body = resources.files("eventspark.collector").joinpath("ui", name).read_bytes()
    etag = b'"' + hashlib.sha256(body).hexdigest()[:32].encode() + b'"'
    return Asset(body, gzip.compress(body, mtime=0), content_type, etag)


async def page_file(app: Collector, request: Request) -> Response:
    """GET /ui, /ui/app.js, /ui/style.css: revalidated with the ETag, gzipped when accepted."""
    found = asset(request.path.rstrip("/") or "/")
    headers: Headers = [
        (b"content-type", found.content_type),
        # Always revalidate: a new version of eventspark must not run an old script.
        (b"cache-control", b"no-cache"),
        (b"etag", found.etag),
        (b"vary", b"Accept-Encoding"),
        *SECURITY_HEADERS,
    ]
    if found.etag in _etags(request.header(b"if-none-match")):
        return Response(304, b"", headers)
    if "gzip" in (request.header(b"accept-encoding") or ""):
        return Response(200, found.gzipped, [*headers, (b"content-encoding", b"gzip")])
    return Response(200, found.body, headers)


def _etags(header: str | None) -> set[bytes]:
    return {tag.strip().removeprefix("W/").encode() for tag in (header or "").split(",") if tag.strip()}


async def page_config(app: Collector, request: Request) -> Response:
    """GET /api/v1/ui/config (admin): destination ids, types and modes, token ids, the cache's size.

    Only names: no secret, no datasource.
    """
    check_admin(request, app.admin_token)
    config = app.config
    destinations = [
        {
            "id": dest_id,
            "type": dest.type,
            "mode": dest.mode,
            "tokens": [key.id for key in config.api_keys if takes_token(dest, key)],
        }
        for dest_id, dest in config.destinations.items()
    ]
    cache_config = config.server.cache
    return json_response(
        {
            "server_name": app.server_name,
            "destinations": destinations,
            "tokens": [key.id for key in config.api_keys],
            "cache": {"enabled": cache_config.enabled, "size": cache_config.events.size},
            "poll_interval_ms": POLL_INTERVAL_MS,
        },
        headers=[(b"cache-control", b"no-store")],
    )


ROUTES: Routes = {
    **{path: {"GET": page_file, "HEAD": page_file} for path in _FILES},
    "/api/v1/ui/config": {"GET": page_config},
}
