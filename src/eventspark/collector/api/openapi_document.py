"""The OpenAPI 3.1 document of the collector's HTTP API, as data (served by `openapi.py`).

One entry per (path, method) of `eventspark.collector.routes.ROUTES`, plus the ad-blocker-proof
random URL `/api.<anything>`; `tests/api/test_openapi.py` fails when the two drift apart, and
`tests/faults/test_fuzz.py` fuzzes a running `serve` from this document with schemathesis.
Status codes are the ones each endpoint answers; every error answer is `Error`.
"""

from __future__ import annotations

from eventspark import __version__
from eventspark.collector.api.openapi_blocks import (
    ADMIN,
    CLIENT,
    PUBLIC,
    SCHEMAS,
    SERVER,
    Schema,
    json_body,
    ok_json,
    operation,
    query,
    ref,
    responses,
    security_schemes,
)
from eventspark.collector.api.openapi_operator import operator_paths, ui_paths
from eventspark.collector.api.openapi_segment import segment_paths
from eventspark.collector.static_openapi import tracking_script_paths

__all__ = ["ADMIN", "CLIENT", "SERVER", "build_document"]

# --- paths ----------------------------------------------------------------------------------------

_EVENT_ERRORS = (400, 401, 413, 422, 503)
_CORS_NOTE = (
    "CORS: `Access-Control-Allow-Origin` echoes an Origin the token's `origins` allow; "
    "`OPTIONS` on the same path answers the preflight."
)
_EVENT_OK = ok_json("Stored durably (handed to the OS, fsynced with `server.fsync`)", ref("Ok"))


def _event_paths() -> dict[str, Schema]:
    body = json_body(ref("EventBody"))
    js = operation(
        "postEvent",
        "Events from a browser (JS SDK)",
        "events",
        CLIENT,
        responses(_EVENT_OK, *_EVENT_ERRORS),
        body=body,
        description=f"Client (JS) secret; a server secret works too. {_CORS_NOTE}",
    )
    random_url = {
        **js,
        "operationId": "postEventRandomUrl",
        "summary": "Events from a browser at an ad-blocker-proof URL `/api.<anything>`",
        "description": "As `/api/v1/event`; the token may also be any `p_<anything>` query parameter. " + _CORS_NOTE,
        "parameters": [
            {
                "name": "anything",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "pattern": "^[a-z0-9]+$"},
            },
            query("p_token", "the token under any `p_*` name (the first one is used)"),
        ],
    }
    s2s = operation(
        "postServerEvent",
        "Events from a back end (server-to-server); `src: api` is added",
        "events",
        SERVER,
        responses(_EVENT_OK, *_EVENT_ERRORS),
        body=body,
        description="Server secret; a client secret answers 401.",
    )
    return {
        "/api/v1/event": {"post": js},
        "/api/v1/events": {"post": _alias(js, "postEventsAlias", "/api/v1/event")},
        "/api.{anything}": {"post": random_url},
        "/api/v1/s2s/event": {"post": s2s},
        "/api/v1/s2s/events": {"post": _alias(s2s, "postServerEventsAlias", "/api/v1/s2s/event")},
        "/api/v1/events/bulk": {"post": _bulk()},
        "/api/v1/p.gif": {"get": _pixel()},
        **segment_paths(),
    }


def _alias(op: Schema, operation_id: str, path: str) -> Schema:
    """EventNative's second spelling of an endpoint: the same operation."""
    return {**op, "operationId": operation_id, "summary": f"Same as `{path}` (EventNative's alias)"}


def _bulk() -> Schema:
    accepted = {
        "type": "object",
        "required": ["status", "accepted"],
        "properties": {"status": {"const": "ok"}, "accepted": {"type": "integer", "minimum": 0}},
    }
    ndjson = {"type": "string", "description": "one JSON object per line"}
    body = {
        "required": True,
        "description": "Newline-delimited JSON; all or nothing (a bad line rejects the upload, naming it). "
        "At most 64 × `server.max_event_size` bytes.",
        "content": {
            "multipart/form-data": {
                "schema": {"type": "object", "properties": {"file": {"type": "string", "format": "binary"}}}
            },
            "application/x-ndjson": {"schema": ndjson},
        },
    }
    return operation(
        "postBulk",
        "Upload a file of events (NDJSON), processed synchronously",
        "events",
        SERVER,
        responses(ok_json("Every line stored", accepted), *_EVENT_ERRORS),
        body=body,
    )


def _pixel() -> Schema:
    gif = {"description": "A transparent 1×1 GIF", "content": {"image/gif": {"schema": {"type": "string"}}}}
    data = query("data", "the event: base64 (standard or URL-safe) JSON", required=True)
    return operation(
        "getPixel",
        "Tracking pixel: the event in `data`",
        "events",
        [*CLIENT, {}],
        responses(gif, 400, 401, 422, 503),
        parameters=[data],
        description="The token comes from the URL or, without one, from the event's `api_key` or `token`.",
    )


def _admin_paths() -> dict[str, Schema]:
    pong = {"description": "Alive", "content": {"text/plain": {"schema": {"const": "pong"}}}}
    instances = {
        "type": "object",
        "required": ["instances"],
        "properties": {
            "instances": {
                "type": "array",
                "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
            }
        },
    }
    metrics = {
        "description": "Prometheus text exposition",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
    ping = operation("ping", "Liveness", "admin", PUBLIC, responses(pong))
    return {
        "/ping": {"get": ping, "head": {**ping, "operationId": "pingHead"}},
        "/api/v1/cluster": {
            "get": operation(
                "getCluster",
                "Live nodes (coordination heartbeats)",
                "admin",
                ADMIN,
                responses(ok_json("Live nodes", instances), 401, 503),
            )
        },
        "/prometheus": {
            "get": operation(
                "getMetrics",
                "Prometheus metrics",
                "admin",
                ADMIN,
                responses(metrics, 401, 404),
                description="404 when `server.metrics.prometheus.enabled` is false.",
            )
        },
        "/api/v1/openapi.json": {
            "get": operation(
                "getOpenApi",
                "This document",
                "admin",
                PUBLIC,
                responses(ok_json("OpenAPI 3.1", {"type": "object", "required": ["openapi", "paths"]})),
            )
        },
    }


def build_document() -> Schema:
    """The whole document (a new dict each call)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "eventspark collector",
            "version": __version__,
            "description": "EventNative's HTTP API as eventspark serves it (docs/api.md). "
            'Errors are JSON `{"message", "error"}`.',
        },
        "tags": [
            {"name": "events", "description": "Sending events"},
            {"name": "admin", "description": "Liveness, cluster, metrics"},
            {"name": "operator", "description": "Failed events, replay, cache, passes, live page"},
            {"name": "tools", "description": "Setting up a destination"},
        ],
        "paths": {**_event_paths(), **_admin_paths(), **operator_paths(), **ui_paths(), **tracking_script_paths()},
        "components": {"schemas": SCHEMAS, "securitySchemes": security_schemes()},
    }
