"""The OpenAPI description of the operator endpoints: failed events and replay, batch passes,
the events cache, status, setup tools and the live events page."""

from __future__ import annotations

from eventspark.collector.api.openapi_blocks import (
    ADMIN,
    PUBLIC,
    SERVER,
    Schema,
    json_body,
    ok_json,
    operation,
    query,
    ref,
    responses,
)

WAIT = query(
    "wait",
    "seconds to wait for the batch pass (default 60); then 202 with a request id to poll",
    {"type": "number", "minimum": 0, "maximum": 600},
)
PENDING = {
    "type": "object",
    "required": ["status", "request_id"],
    "properties": {
        "status": {"enum": ["pending", "running"]},
        "request_id": {"type": "string"},
        "poll": {"type": "string", "description": "GET this path for the pass's answer"},
    },
}
PASS_SUMMARY = {"type": "object", "description": "the pass's summary: pairs loaded, failed, archived logs"}


def operator_paths() -> dict[str, Schema]:
    return {
        "/api/v1/fallback": {"get": _fallback()},
        "/api/v1/replay": {"post": _replay()},
        "/api/v1/batch/run": _batch_run(),
        "/api/v1/events/cache": {"get": _cache()},
        "/api/v1/status": {"get": _status()},
        **_tool_paths(),
    }


def _fallback() -> Schema:
    files = {
        "type": "object",
        "required": ["files"],
        "properties": {
            "files": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["file_name", "destination_id", "tables_statuses"],
                    "properties": {
                        "file_name": {"type": "string"},
                        "destination_id": {"type": "string"},
                        "tables_statuses": {"type": "object", "additionalProperties": ref("TableStatus")},
                        "size": {"type": "integer"},
                        "events": {"type": "integer"},
                        "modified": {"type": "string"},
                        "replayed": {"type": "boolean"},
                        "replay": {"type": "object"},
                    },
                },
            }
        },
    }
    return operation(
        "getFallback",
        "Failed files and their per-table replay status",
        "operator",
        ADMIN,
        responses(ok_json("Failed files", files), 400, 401),
        parameters=[query("destination_ids", "comma-separated destination ids (at most 100); none: all")],
    )


def _replay() -> Schema:
    body = {
        "type": "object",
        "required": ["file_name"],
        "properties": {
            "file_name": {"type": "string", "description": "a file under failed/ or archive/ of log.path"},
            "destination_id": {"type": "string"},
            "file_format": {"type": "string", "description": "`raw_json` for plain event lines"},
            "force": {"type": "boolean", "description": "replay a file that was replayed before"},
        },
    }
    answer = {
        "type": "object",
        "required": ["status", "file_name", "replay_id", "events"],
        "properties": {
            "status": {"const": "ok"},
            "file_name": {"type": "string"},
            "replay_id": {"type": "string"},
            "events": {"type": "integer"},
            "unreadable": {"type": "integer"},
            "destinations": {},
            "pass": {"anyOf": [PENDING, PASS_SUMMARY]},
        },
    }
    answers = responses(ok_json("Replayed (and loaded, for batch destinations)", answer), 400, 401, 404, 409, 413, 503)
    answers["202"] = ok_json("Handed to the pipeline; the batch pass is still running (`pass.poll`)", answer)
    return operation(
        "postReplay",
        "Replay a failed file or an archived log through the pipeline",
        "operator",
        ADMIN,
        answers,
        parameters=[WAIT],
        body=json_body(body),
        description="409 when the file was replayed already (unless `force`); docs/replay.md.",
    )


def _batch_run() -> Schema:
    done = {"type": "object", "required": ["request_id"], "properties": {"request_id": {"type": "string"}}}
    run = responses(ok_json("The pass's summary", {"allOf": [PASS_SUMMARY, done]}), 400, 401, 409, 503)
    run["202"] = ok_json("Still running: poll `GET /api/v1/batch/run?request_id=`", PENDING)
    request_id = query("request_id", "what POST answered", {"type": "string", "pattern": "^[0-9a-f]{32}$"}, True)
    state = ok_json("Pending, running, or the pass's answer", {"anyOf": [PENDING, {"allOf": [PASS_SUMMARY, done]}]})
    return {
        "post": operation(
            "postBatchRun",
            "A batch pass now, on the node serving this directory",
            "operator",
            ADMIN,
            run,
            parameters=[WAIT],
            description="409 when no destination is in batch mode.",
        ),
        "get": operation(
            "getBatchRun",
            "The state or answer of a requested pass",
            "operator",
            ADMIN,
            responses(state, 400, 401, 404),
            parameters=[request_id],
        ),
    }


def _cache() -> Schema:
    answer = {
        "type": "object",
        "required": ["total_events", "response_events", "events"],
        "properties": {
            "total_events": {"type": "integer", "minimum": 0},
            "response_events": {"type": "integer", "minimum": 0},
            "events": {"type": "array", "items": ref("CachedEvent")},
        },
    }
    time = {"type": "string", "description": "RFC 3339 or unix seconds"}
    return operation(
        "getEventsCache",
        "The last events per destination, newest first",
        "operator",
        ADMIN,
        responses(ok_json("Cached events", answer), 400, 401, 404, 503),
        parameters=[
            query("destination_ids", "comma-separated destination ids; none: all"),
            query("token_ids", "comma-separated token ids; none: all"),
            query("start", "events cached at or after", time),
            query("end", "events cached at or before", time),
            query("limit", "most events in the answer", {"type": "integer", "minimum": 1, "maximum": 1000}),
        ],
        description="404 when `server.cache.enabled` is false; 503 when its Redis store is unavailable.",
    )


def _status() -> Schema:
    count = {"type": "integer", "minimum": 0}
    seconds = {"type": ["number", "null"], "description": "seconds (ages) or unix seconds (times); null: none"}
    numbers = ("queue_events", "live_events", "pending_logs", "pending_log_events", "failed_events", "last_load_events")
    times = ("oldest_pending_age", "last_load_at", "last_event_age", "last_error_at")
    destination = {
        "type": "object",
        "required": ["destination", "mode", *numbers, *times, "last_error", "exact"],
        "properties": {
            "destination": {"type": "string"},
            "mode": {"enum": ["batch", "stream"]},
            **dict.fromkeys(numbers, count),
            **dict.fromkeys(times, seconds),
            "last_error": {"type": "string"},
            "exact": {"type": "boolean", "description": "false when part of a count is an estimate"},
            "retry_attempts": count | {"description": "consecutive failed delivery attempts (retry policy)"},
            "retry_oldest_age": seconds | {"description": "seconds since the first of them; null: not failing"},
        },
    }
    answer = {
        "type": "object",
        "required": ["destinations"],
        "properties": {
            "destinations": {"type": "array", "items": destination},
            "storage": {
                "type": "object",
                "description": "bytes and files of archive/ and failed/ as the retention last measured "
                "them (`at`: unix seconds), with what it removed then; absent before its first run",
            },
        },
    }
    return operation(
        "getStatus",
        "Per destination: pending logs and events, queue depth, failed events, last load and error",
        "operator",
        ADMIN,
        responses(ok_json("`eventspark status` as JSON", answer), 401),
    )


def _tool_paths() -> dict[str, Schema]:
    dest = query("destination_id", "the destination to dry-run the events for", required=True)
    answer_format = query(
        "format",
        "`eventnative` (default): the shape follows the body: one event object → a flat field list, "
        "an array or template body → a field list per event; `lists`: a field list per event for any body; "
        "`full`: table, status and error per event",
        {"enum": ["eventnative", "lists", "full"]},
    )
    full = {
        "type": "object",
        "required": ["destination_id", "events"],
        "properties": {
            "destination_id": {"type": "string"},
            "events": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["status", "table", "fields", "error"],
                    "properties": {
                        "status": {"type": "string"},
                        "table": {"type": "string"},
                        "fields": {"type": "array", "items": ref("Field")},
                        "error": {"type": "string"},
                    },
                },
            },
        },
    }
    flat = {"type": "array", "items": ref("Field"), "description": "a body that is one event object"}
    fields = {"type": "array", "items": flat, "description": "an array or template body, or `lists`: a list per event"}
    destination = {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}}
    checked = {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"const": "ok"}, "checked": {"type": "string"}},
    }
    return {
        "/api/v1/events/dry-run": {
            "post": operation(
                "postDryRun",
                "What the events would become in a destination, without writing",
                "tools",
                SERVER,
                responses(ok_json("Fields as stored", {"anyOf": [flat, fields, full]}), 400, 401, 403, 404, 413),
                parameters=[dest, answer_format],
                body=json_body(ref("EventBody")),
                description="A skipped or failed event answers 400 with the reason (EventNative's behaviour) "
                "unless `format=full`.",
            )
        },
        "/api/v1/destinations/test": {
            "post": operation(
                "postDestinationTest",
                "Connect to a destination config and create/drop a probe",
                "tools",
                ADMIN,
                responses(ok_json("Connected", checked), 400, 401, 413, 429),
                parameters=[
                    query("send_event", "HTTP destinations: also send a test event (`true`)"),
                    query("timeout", "seconds (default and maximum: see docs/setup-tools.md)", {"type": "number"}),
                ],
                body=json_body(destination, "one destination as in the config file"),
            )
        },
        "/api/v1/templates/evaluate": {"post": _template()},
    }


def _template() -> Schema:
    body = {
        "type": "object",
        "required": ["object", "expression"],
        "properties": {"object": ref("Event"), "expression": {"type": "string"}, "reformat": {"type": "boolean"}},
    }
    answer = {
        "type": "object",
        "required": ["result", "error", "format"],
        "properties": {"result": {"type": "string"}, "error": {"type": "string"}, "format": {"const": "go"}},
    }
    return operation(
        "postTemplateEvaluate",
        "Evaluate a table_name_template against an event",
        "tools",
        ADMIN,
        responses(ok_json("The result", answer), 400, 401, 413),
        body=json_body(body),
        description="A template that does not parse or run answers 400 with EventNative's fields as well.",
    )


def ui_paths() -> dict[str, Schema]:
    files = {
        "/ui": ("getUi", "The live events page", "text/html"),
        "/ui/app.js": ("getUiScript", "The page's script", "text/javascript"),
        "/ui/style.css": ("getUiStyle", "The page's style sheet", "text/css"),
    }
    paths: dict[str, Schema] = {}
    for path, (operation_id, summary, media) in files.items():
        answers = {
            "200": {"description": summary, "content": {media: {"schema": {"type": "string"}}}},
            "304": {"description": "Not modified (If-None-Match has the ETag)"},
        }
        get = operation(
            operation_id,
            summary,
            "operator",
            PUBLIC,
            answers,
            description="Static, no data and no token; the page asks for the admin token (or reads `?token=`) "
            "and calls the admin endpoints with it.",
        )
        paths[path] = {"get": get, "head": {**get, "operationId": operation_id + "Head"}}
    config = {
        "type": "object",
        "required": ["destinations", "tokens"],
        "properties": {
            "server_name": {"type": "string"},
            "destinations": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "type", "mode", "tokens"],
                    "properties": {
                        "id": {"type": "string"},
                        "type": {"type": "string"},
                        "mode": {"enum": ["batch", "stream"]},
                        "tokens": {"type": "array", "items": {"type": "string"}},
                    },
                },
            },
            "tokens": {"type": "array", "items": {"type": "string"}},
            "cache": {"type": "object"},
            "poll_interval_ms": {"type": "integer"},
        },
    }
    paths["/api/v1/ui/config"] = {
        "get": operation(
            "getUiConfig",
            "What the page's filters list: destination and token ids (no secrets)",
            "operator",
            ADMIN,
            responses(ok_json("Names", config), 401),
        )
    }
    return paths
