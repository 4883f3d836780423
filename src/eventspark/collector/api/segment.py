"""Segment-compatible endpoints: `/api/v1/segment[/compat][/v1/batch]` (docs/segment.md).

Segment's libraries post `{"batch": [...], "writeKey": ..., "sentAt": ...}` to `<host>/v1/batch`
with `Authorization: Basic base64("<writeKey>:")`; a body without `batch` is one message (the
`/v1/track` style). The write key is a token's server secret, found where the s2s endpoint
looks (query `token`, `X-Auth-Token`, `p_*`), then in the basic-auth user, then in the body's
`writeKey`. The messages are mapped (`eventspark.collector.segment`) and then take the s2s path:
`Collector.accept` (ContextEnrichment, incoming log, stream queues, events cache).
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

import orjson

from eventspark.collector.api.common import OK_RESPONSE, Handler, Routes
from eventspark.collector.auth import TOKEN_NOT_FOUND, Token, request_token
from eventspark.collector.body import parse_failed, walk_limits
from eventspark.collector.core import Collector
from eventspark.collector.http import HTTPError, Request, Response, read_body
from eventspark.collector.multiplex import Route
from eventspark.collector.segment import map_messages

THREAD_BODY_SIZE = 64 * 1024
"""Bodies larger than this are parsed and mapped on a thread, not on the event loop."""
ACCEPT_STEP = 2000
"""Events enriched and written in one go: a 4 MB batch of 300,000 tiny messages held the event loop
for 6 s in one step (other requests waited); steps of this size take a few ms each."""
MALFORMED_BATCH = "malformed Segment body 'batch' type. Expected array of objects"
SEGMENT_LIMIT = 4 * 1024 * 1024
"""The largest body with a known write key (or `server.max_event_size` when larger). Segment's
libraries send at most 500 KB a batch; a body is parsed whole, and its Python objects take about
35 times its size (a 64 MB batch took 2.1 GB), so this is not the bulk endpoint's 64 × limit."""
LIMIT_SETTING = "4 MiB or server.max_event_size when larger"
UNAUTHENTICATED_LIMIT = 1024 * 1024
"""A body whose write key is only inside it is read before the key is known: at most this (or
`server.max_event_size` when larger), which holds Segment's largest batch (500 KB)."""
UNAUTHENTICATED_SETTING = "1 MiB or server.max_event_size when the write key is only in the body"
NO_WRITE_KEY = (
    "no write key in the 'token' query parameter, the X-Auth-Token header, a 'p_*' query parameter, "
    "basic auth (the user) or the body's 'writeKey'"
)


def segment_endpoint(compat: bool) -> Handler:
    """The handler of the plain (`compat=False`) or the compat variant."""

    async def handler(app: Collector, request: Request) -> Response:
        return await segment_events(app, request, compat)

    return handler


async def segment_events(app: Collector, request: Request, compat: bool) -> Response:
    """POST: a Segment batch or message, server secret (write key)."""
    secret = request_token(request)  # query, headers, then the basic auth user (Segment's libraries)
    known = _authorize(app, secret) if secret else None
    try:
        body = await _body(request, *_body_limit(app, authenticated=known is not None))
        events, write_key = await _events(body, compat)
        # The body's write key is the last place looked at, as it needs the body read first.
        token, secret, route = known or _authorize(app, write_key)
    except HTTPError as exc:
        raise exc.known(known[0].id) if known else exc from None
    try:
        if await _accept_in_steps(app, request, route, token, secret, events):
            await app.sync(route)
    except HTTPError as exc:
        raise exc.known(token.id) from None
    return OK_RESPONSE


async def _accept_in_steps(
    app: Collector, request: Request, route: Route, token: Token, secret: str, events: list[dict[str, Any]]
) -> bool:
    """`Collector.accept` for `ACCEPT_STEP` events at a time, letting other requests run in between."""
    must_sync = False
    for start in range(0, len(events), ACCEPT_STEP):
        if start:
            await asyncio.sleep(0)
        step = events[start : start + ACCEPT_STEP]
        must_sync |= app.accept(route, token, secret, step, request.scope, request.headers, server_side=True)
    return must_sync


def _authorize(app: Collector, secret: str | None) -> tuple[Token, str, Route]:
    """(token, secret, route) for a server secret; 401 for anything else, 422 without destination."""
    if not secret:
        raise HTTPError(401, TOKEN_NOT_FOUND, NO_WRITE_KEY)
    token, secret = app.tokens.require_server(secret)
    return token, secret, app.route(token)


def _body_limit(app: Collector, authenticated: bool) -> tuple[int, str]:
    """(the largest body, the setting that says so)."""
    if authenticated:
        return max(SEGMENT_LIMIT, app.max_event_size), LIMIT_SETTING
    return max(UNAUTHENTICATED_LIMIT, app.max_event_size), UNAUTHENTICATED_SETTING


async def _body(request: Request, limit: int, setting: str) -> bytes:
    body = await read_body(request.receive, request.headers, limit, setting)
    encoding = request.headers.get(b"content-encoding", b"identity").strip().lower()
    if encoding == b"gzip":  # analytics-python's `gzip=True`
        return _gunzip(body, limit, setting)
    if encoding not in (b"identity", b""):
        raise parse_failed(f"unsupported Content-Encoding {encoding.decode('latin-1')[:40]!r}: use gzip or none")
    return body


def _gunzip(body: bytes, limit: int, setting: str) -> bytes:
    """The inflated body, never more than `limit` bytes (a small bomb cannot fill memory)."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise parse_failed(f"gzip: {exc}") from None
    if len(data) > limit or inflater.unconsumed_tail:
        raise HTTPError(413, "Request body is too large", f"inflated, it exceeds {limit} bytes ({setting})")
    if not inflater.eof:
        raise parse_failed("gzip: the stream is truncated")
    return data


async def _events(body: bytes, compat: bool) -> tuple[list[dict[str, Any]], str | None]:
    if len(body) > THREAD_BODY_SIZE:
        return await asyncio.to_thread(parse_segment_body, body, compat)
    return parse_segment_body(body, compat)


def parse_segment_body(body: bytes, compat: bool) -> tuple[list[dict[str, Any]], str | None]:
    """(the mapped events, the body's `writeKey`); 400 for what is not a Segment body."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise parse_failed(str(exc)) from None
    if value.__class__ is not dict:
        raise parse_failed(f"expected a JSON object, got {_kind(value)}")
    write_key = value.get("writeKey")
    write_key = write_key if write_key.__class__ is str else None
    if "batch" not in value:
        messages = [value]
    else:
        messages = value["batch"]
        if messages.__class__ is not list or any(m.__class__ is not dict for m in messages):
            raise parse_failed(MALFORMED_BATCH)
    for number, message in enumerate(messages, 1):
        walk_limits(message, f"message {number}: ")
    return map_messages(messages, compat), write_key


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


PLAIN: dict[str, Handler] = {"POST": segment_endpoint(compat=False)}
COMPAT: dict[str, Handler] = {"POST": segment_endpoint(compat=True)}
ROUTES: Routes = {
    "/api/v1/segment": PLAIN,
    "/api/v1/segment/v1/batch": PLAIN,
    "/api/v1/segment/compat": COMPAT,
    "/api/v1/segment/compat/v1/batch": COMPAT,
}
