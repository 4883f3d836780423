"""The event endpoints: JS (client secret, CORS), server-to-server, bulk upload, pixel."""

from __future__ import annotations

import asyncio

from eventspark.collector import bulk, pixel
from eventspark.collector.api.common import OK, OK_RESPONSE, Handler, Routes
from eventspark.collector.auth import (
    PREFLIGHT_HEADERS,
    OriginRules,
    Token,
    cors_headers,
    origin_headers,
    request_token,
)
from eventspark.collector.body import events_of, parse_events
from eventspark.collector.core import Collector
from eventspark.collector.http import (
    Headers,
    HTTPError,
    Receive,
    Request,
    Response,
    Scope,
    json_response,
    read_body,
    sender,
)

MAX_CACHED_ORIGINS = 1024
_NO_ORIGIN_ANSWER: tuple[Response, Headers] = (OK_RESPONSE, [])
_JS_ANSWERS: dict[tuple[OriginRules, bytes], tuple[Response, Headers]] = {}
RANDOM_URL_PREFIX = "/api."
"""`/api.<anything>?p_<anything>=<token>`: the ad-blocker-proof JS endpoint."""


async def js_event(app: Collector, request: Request) -> Response:
    """POST /api/v1/event and /api.*: a browser's events, client secret, CORS."""
    token, secret = app.tokens.require_client(request_token(request))
    return await client_events(app, token, secret, request.headers, request.scope, request.receive)


async def client_events(
    app: Collector, token: Token, secret: str, headers: dict[bytes, bytes], scope: Scope, receive: Receive
) -> Response:
    """`js_event` once the token is known; the app calls it directly for `?token=<client secret>`."""
    ok, cors = js_answer(token.origins, headers.get(b"origin"))
    try:
        route = app.route(token)
        events = parse_events(await read_body(receive, headers, app.max_event_size))
        if app.accept(route, token, secret, events, scope, headers, server_side=False):
            await app.sync(route)
    except HTTPError as exc:
        raise exc.known(token.id, cors) from None
    return ok


def js_answer(rules: OriginRules, origin: bytes | None) -> tuple[Response, Headers]:
    """(the 200 answer, the CORS headers of an error answer) for a JS request from `origin`.

    Kept per token and origin, since a site's events come from few origins; origins are
    untrusted input, so the cache is bounded.
    """
    if origin is None:
        return _NO_ORIGIN_ANSWER
    key = (rules, origin)
    answer = _JS_ANSWERS.get(key)
    if answer is None:
        if len(_JS_ANSWERS) >= MAX_CACHED_ORIGINS:
            _JS_ANSWERS.clear()
        cors = origin_headers(origin, rules)
        ok = Response.prebuilt(200, OK, [*OK_RESPONSE.headers, *cors]) if cors else OK_RESPONSE
        answer = _JS_ANSWERS[key] = (ok, cors)
    return answer


async def s2s_event(app: Collector, request: Request) -> Response:
    """POST /api/v1/s2s/event: a back end's events, server secret."""
    token, secret = app.tokens.require_server(request_token(request))
    try:
        route = app.route(token)
        events = parse_events(await read_body(request.receive, request.headers, app.max_event_size))
        if app.accept(route, token, secret, events, request.scope, request.headers, server_side=True):
            await app.sync(route)
    except HTTPError as exc:
        raise exc.known(token.id) from None
    return OK_RESPONSE


async def bulk_upload(app: Collector, request: Request) -> Response:
    """POST /api/v1/events/bulk: NDJSON upload, server secret, answered once everything is written."""
    token, secret = app.tokens.require_server(request_token(request))
    try:
        route = app.route(token)
        limit = bulk.bulk_limit(app.max_event_size)
        body = await read_body(request.receive, request.headers, limit, "64 × server.max_event_size")
        ip, _ = sender(request.scope, request.headers, True, app.proxies)
        content_type = request.header(b"content-type")
        # Parsing and enriching a large upload would stall other requests: done on a thread.
        lines, count = await asyncio.to_thread(_bulk_lines, app, body, content_type, secret, ip)
        app.write(route, token, lines, count)
        if count:
            await app.sync(route)
    except HTTPError as exc:
        raise exc.known(token.id) from None
    return json_response({"status": "ok", "accepted": count})


def _bulk_lines(app: Collector, body: bytes, content_type: str | None, secret: str, ip: str) -> tuple[bytes, int]:
    events = bulk.bulk_events(body, content_type, app.max_event_size)
    return app.prepare(events, secret, ip, None, server_side=True), len(events)


async def pixel_gif(app: Collector, request: Request) -> Response:
    """GET /api/v1/p.gif?data=<base64 JSON>: the token in the URL or in the data."""
    events = events_of(pixel.decode_data(request.query_param("data"), app.max_event_size))
    token, secret = app.tokens.require_client(request_token(request) or pixel.token_in_data(events))
    cors = cors_headers(request, token.origins)
    try:
        route = app.route(token)
        if app.accept(route, token, secret, events, request.scope, request.headers, server_side=False):
            await app.sync(route)
    except HTTPError as exc:
        raise exc.known(token.id, cors) from None
    return Response(200, pixel.GIF, [*pixel.GIF_HEADERS, *cors])


def preflight(app: Collector, request: Request, js: bool) -> Response:
    """OPTIONS: the CORS preflight; JS endpoints echo an Origin their token allows.

    A preflight carries no `X-Auth-Token` value, so without a token in the URL the Origin is
    echoed and the real request is checked when it comes.
    """
    headers = list(PREFLIGHT_HEADERS)
    origin = request.headers.get(b"origin")
    if js and origin is not None:
        secret = request_token(request)
        token = app.tokens.client(secret) if secret else None
        if secret is None or (token is not None and token.origins.allows(origin.decode("latin-1"))):
            headers += [(b"access-control-allow-origin", origin), (b"vary", b"Origin")]
    return Response(200, b"", headers)


JS_METHODS: dict[str, Handler] = {"POST": js_event}
"""`/api/v1/event` and the random-URL prefix."""
S2S_METHODS: dict[str, Handler] = {"POST": s2s_event}
ROUTES: Routes = {
    "/api/v1/event": JS_METHODS,
    "/api/v1/events": JS_METHODS,  # EventNative's alias
    "/api/v1/s2s/event": S2S_METHODS,
    "/api/v1/s2s/events": S2S_METHODS,  # EventNative's alias
    "/api/v1/events/bulk": {"POST": bulk_upload},
    "/api/v1/p.gif": {"GET": pixel_gif},
}
JS_PATHS = frozenset({"/api/v1/event", "/api/v1/events", "/api/v1/p.gif"})
