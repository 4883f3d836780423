"""The Segment-compatible endpoints in the OpenAPI document (`openapi_document.py`)."""

from __future__ import annotations

from eventspark.collector.api.openapi_blocks import SERVER, Schema, json_body, ok_json, operation, ref, responses

SEGMENT_SECURITY = [*SERVER, {"serverTokenBasic": []}]
"""The write key: as the s2s endpoint takes a server secret, or as the basic-auth user; the
body's `writeKey` is read last (OpenAPI cannot say so)."""

_MESSAGE: Schema = {
    "type": "object",
    "description": "A Segment message (track, identify, page, screen, group, alias); limits: 64 levels, 10,000 leaves",
    "properties": {
        "type": {"type": "string"},
        "messageId": {"type": "string", "description": "becomes the event id"},
        "userId": {"type": "string"},
        "anonymousId": {"type": "string"},
        "timestamp": {"type": "string"},
        "context": {"type": "object"},
        "properties": {"type": "object"},
        "traits": {"type": "object"},
    },
    "additionalProperties": True,
}
_BODY: Schema = {
    "description": "A batch (`analytics-python`, `@segment/analytics-node`), or one message",
    "anyOf": [
        {
            "type": "object",
            "required": ["batch"],
            "properties": {
                "batch": {"type": "array", "items": _MESSAGE},
                "writeKey": {"type": "string", "description": "the server secret, when not given otherwise"},
                "sentAt": {"type": "string"},
            },
        },
        _MESSAGE,
    ],
}
_VARIANTS = {
    "/api/v1/segment": ("postSegment", False),
    "/api/v1/segment/v1/batch": ("postSegmentBatch", False),
    "/api/v1/segment/compat": ("postSegmentCompat", True),
    "/api/v1/segment/compat/v1/batch": ("postSegmentCompatBatch", True),
}


def segment_paths() -> dict[str, Schema]:
    return {path: {"post": _operation(op_id, compat)} for path, (op_id, compat) in _VARIANTS.items()}


def _operation(operation_id: str, compat: bool) -> Schema:
    layout = "EventNative 1.x's nested `eventn_ctx` layout" if compat else "the flat layout (JS SDK 2.x)"
    return operation(
        operation_id,
        f"Segment-compatible: messages mapped to {layout}, `src: segment_api`",
        "events",
        SEGMENT_SECURITY,
        responses(
            ok_json("Stored durably (handed to the OS, fsynced with `server.fsync`)", ref("Ok")),
            400,
            401,
            413,
            422,
            503,
        ),
        body=json_body(
            _BODY, "Plain or gzip (`Content-Encoding: gzip`); at most 4 MiB (or `server.max_event_size` when larger)"
        ),
        description="Point a Segment library's `host` at `<collector>/api/v1/segment` (docs/segment.md). "
        "A client secret answers 401.",
    )
