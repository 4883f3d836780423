"""The tracking script as EventNative served it (issue 17): `/s/lib.js`, `/t/inline.js`.

As EventNative, both prefixes serve the same files (`/s/<name>` and `/t/<name>`), `inline.js` being
rendered from its query under either (`eventspark.collector.static_inline`); where the files come from
is `eventspark.collector.static_files`. No token is needed: the script is public, the key it carries
is the page's client secret, checked when events arrive.
"""

from __future__ import annotations

from pathlib import Path

from eventspark.collector.api.common import Routes
from eventspark.collector.core import Collector
from eventspark.collector.http import Headers, HTTPError, Request, Response
from eventspark.collector.static_files import (
    directories,
    etag,
    find_file,
    load,
    own_directories,
    read_template,
    servable,
)
from eventspark.collector.static_inline import parse_inline_query, render_inline
from eventspark.sdk import SDK_PACKAGE, SDK_VERSION

PREFIXES = ("/s/", "/t/")
INLINE = "inline.js"
FILE_CACHE = b"public, max-age=3600"
"""An hour: a new lib.js reaches returning visitors within the hour (then revalidated by ETag)."""
INLINE_CACHE = b"public, max-age=300"

# Any site may embed the script, also with `crossorigin` or under Cross-Origin-Embedder-Policy.
COMMON_HEADERS: Headers = [
    (b"access-control-allow-origin", b"*"),
    (b"cross-origin-resource-policy", b"cross-origin"),
    (b"x-content-type-options", b"nosniff"),
    (b"vary", b"Accept-Encoding"),
]
JS_TYPE = (b"content-type", b"application/javascript; charset=utf-8")
MAP_TYPE = (b"content-type", b"application/json; charset=utf-8")


def route_name(path: str) -> str:
    """The route (and metrics label) of a path under a prefix: `/s/{file}` or `/t/{file}`."""
    return path[:3] + "{file}"


async def static_file(app: Collector, request: Request) -> Response:
    """GET/HEAD /s/<name>, /t/<name>: a file, or inline.js rendered from the query."""
    name = request.path[3:]
    if name == INLINE:
        return _inline(app, request)
    search = directories(app.config.server.static_files_dir)
    path = find_file(name, search)
    asset = load(path) if path is not None else None
    if asset is None:
        raise HTTPError(404, _missing(name, search), f"no static file {request.path[:120]}")
    content_type = MAP_TYPE if name.endswith(".map") else JS_TYPE
    headers: Headers = [content_type, (b"cache-control", FILE_CACHE), (b"etag", asset.etag), *COMMON_HEADERS]
    if asset.etag in _etags(request.header(b"if-none-match")):
        return Response(304, b"", headers)
    if "gzip" in (request.header(b"accept-encoding") or ""):
        return Response(200, asset.gzipped, [*headers, (b"content-encoding", b"gzip")])
    return Response(200, asset.body, headers)


def _inline(app: Collector, request: Request) -> Response:
    query = parse_inline_query(request.query, _default_host(app, request))
    template_path = find_file(INLINE, own_directories(app.config.server.static_files_dir))
    template = read_template(template_path) if template_path is not None else None
    body = render_inline(template, query)
    tag = etag(body)
    headers: Headers = [JS_TYPE, (b"cache-control", INLINE_CACHE), (b"etag", tag), *COMMON_HEADERS]
    if tag in _etags(request.header(b"if-none-match")):
        return Response(304, b"", headers)
    return Response(200, body, headers)


def _default_host(app: Collector, request: Request) -> str:
    """EventNative's default tracking_host: `server.public_url`, else the request's Host."""
    return app.config.server.public_url or request.header(b"host") or ""


def _missing(name: str, search: list[Path]) -> str:
    """The 404's message: what to do, without the server's directories (the answer is public)."""
    if not servable(name):
        return "Not found: only .js and .js.map files are served under /s/ and /t/"
    places = "server.static_files_dir and the fetched SDK" if len(search) > 1 else "the fetched SDK"
    return (
        f"{name} not found (looked in {places}). Set server.static_files_dir to a directory holding it, "
        f"or install the default tracking script ({SDK_PACKAGE} {SDK_VERSION}) with "
        "`eventspark tracking-script fetch`"
    )


def _etags(header: str | None) -> set[bytes]:
    return {tag.strip().removeprefix("W/").encode() for tag in (header or "").split(",") if tag.strip()}


METHODS = {"GET": static_file, "HEAD": static_file}
KNOWN_PATHS = ("/s/lib.js", "/t/inline.js")
"""The two URLs websites embed: routes (and metrics labels) of their own; other names go by prefix."""
ROUTES: Routes = {path: METHODS for path in (*KNOWN_PATHS, *(route_name(prefix) for prefix in PREFIXES))}
