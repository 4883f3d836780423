"""The tracking script's part of the OpenAPI document (`api/openapi_document.py`): `/s/lib.js`,
`/t/inline.js`, and any other file under `/s/{file}`, `/t/{file}` (`api/static.py`)."""

from __future__ import annotations

from eventspark.collector.api.openapi_blocks import PUBLIC, Schema, operation, query, responses
from eventspark.collector.static_inline import MAX_EVENTS, MAX_VALUE_CHARS

_TEXT = {"schema": {"type": "string"}}
_NOT_MODIFIED = {"304": {"description": "Not modified (If-None-Match has the ETag)"}}
_SOURCE = "From `server.static_files_dir`, else the @jitsu/sdk-js web build fetched at install time."


def tracking_script_paths() -> dict[str, Schema]:
    lib = _file_answers("lib.js (gzip when accepted)", {"application/javascript": _TEXT}, 404)
    inline = _file_answers("The inline snippet rendered from the query", {"application/javascript": _TEXT}, 400)
    # A .js.map file is JSON; inline.js under the generic path still needs its key (400).
    other = _file_answers("The file", {"application/javascript": _TEXT, "application/json": _TEXT}, 400, 404)
    file = {
        "name": "file",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]*[.]js([.]map)?$", "maxLength": 100},
    }
    return {
        "/s/lib.js": _get_and_head(
            "getTrackingScript", "The tracking script (@jitsu/sdk-js)", lib, [], _SOURCE + " 404 says how to get it."
        ),
        "/t/inline.js": _get_and_head(
            "getInlineSnippet",
            "EventNative's inline snippet: loads /s/lib.js with the query's settings",
            inline,
            _inline_parameters(),
            "A template `inline.js` in `server.static_files_dir`, else a built-in loader (docs/tracking-script.md).",
        ),
        "/s/{file}": _get_and_head("getStaticFileS", "Another .js or .js.map file under /s/", other, [file], _SOURCE),
        "/t/{file}": _get_and_head("getStaticFileT", "Another .js or .js.map file under /t/", other, [file], _SOURCE),
    }


def _file_answers(description: str, media: dict[str, Schema], *errors: int) -> Schema:
    return {**responses({"description": description, "content": media}, *errors), **_NOT_MODIFIED}


def _get_and_head(
    operation_id: str, summary: str, answers: Schema, parameters: list[Schema], description: str
) -> Schema:
    get = operation(operation_id, summary, "events", PUBLIC, answers, parameters=parameters, description=description)
    return {"get": get, "head": {**get, "operationId": operation_id + "Head"}}


def _inline_parameters() -> list[Schema]:
    text = {"type": "string", "maxLength": MAX_VALUE_CHARS}
    flag = {"type": "boolean"}
    return [
        query("key", "the client secret the page sends with", {**text, "minLength": 1}, required=True),
        query("tracking_host", "where lib.js and events go (default: server.public_url, else the Host)", text),
        query("cookie_domain", "the SDK's cookie domain", text),
        query("segment_hook", "the SDK's Segment interception", flag),
        query("ga_hook", "the SDK's Google Analytics interception", flag),
        query("randomize_url", "post events to `/api.<random>`", flag),
        query(
            "event",
            "events to track (then no automatic page view)",
            {"type": "array", "items": text, "maxItems": MAX_EVENTS},
        ),
    ]
