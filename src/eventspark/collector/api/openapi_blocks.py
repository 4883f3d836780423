"""Building blocks of the OpenAPI document (`openapi_document.py`): answers, token schemes,
the shared schemas."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

# --- building blocks ------------------------------------------------------------------------------

ERRORS = {
    400: "Invalid body or parameters (`message` says what, `error` the details)",
    401: "Missing or wrong token",
    403: "The token may not use this destination",
    404: "Not found",
    409: "Conflicts with the current state (e.g. already done)",
    413: "Body larger than the limit (`server.max_event_size`); read to its end first (up to 64 MiB or 10 s, "
    "else the connection is closed)",
    422: "No destination is configured for the token",
    429: "Too many such requests at once",
    501: "Not implemented in this version",
    503: "A service the answer needs (disk, coordination store, node) is unavailable",
}
CLIENT = [{"clientTokenQuery": []}, {"clientTokenHeader": []}]
SERVER = [{"serverTokenQuery": []}, {"serverTokenHeader": []}]
ADMIN = [{"adminTokenQuery": []}, {"adminTokenHeader": []}]
PUBLIC: list[dict[str, list[str]]] = []


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def json_content(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


def ok_json(description: str, schema: Schema) -> Schema:
    return {"description": description, "content": json_content(schema)}


def responses(ok: Schema, *errors: int, status: int = 200) -> Schema:
    """`ok` under `status`, then the `Error` answers with the given codes."""
    answers = {str(status): ok}
    for code in errors:
        answers[str(code)] = {"description": ERRORS[code], "content": json_content(ref("Error"))}
    return answers


def operation(
    operation_id: str,
    summary: str,
    tag: str,
    security: list[dict[str, list[str]]],
    answers: Schema,
    parameters: list[Schema] | None = None,
    body: Schema | None = None,
    description: str | None = None,
) -> Schema:
    op: Schema = {"operationId": operation_id, "summary": summary, "tags": [tag], "security": security}
    if description:
        op["description"] = description
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = body
    op["responses"] = answers
    return op


def query(name: str, description: str, schema: Schema | None = None, required: bool = False) -> Schema:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": schema or {"type": "string"},
    }


def json_body(schema: Schema, description: str = "") -> Schema:
    return {"required": True, "description": description, "content": json_content(schema)}


# --- schemas --------------------------------------------------------------------------------------

SCHEMAS: dict[str, Schema] = {
    "Error": {
        "type": "object",
        "required": ["message", "error"],
        "properties": {
            "message": {"type": "string", "description": "what went wrong"},
            "error": {"type": "string", "description": "details: the parser's, driver's or warehouse's message"},
        },
    },
    "Ok": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"const": "ok"}},
    },
    "Event": {
        "type": "object",
        "description": "Any JSON object; limits: `server.max_event_size` bytes, 64 levels, 10,000 leaves",
        "additionalProperties": True,
    },
    "EventBody": {
        "description": "One event, an array of events, or a template merged into each of `events`",
        "anyOf": [
            ref("Event"),
            {"type": "array", "items": ref("Event")},
            {
                "type": "object",
                "required": ["template", "events"],
                "properties": {"template": ref("Event"), "events": {"type": "array", "items": ref("Event")}},
            },
        ],
    },
    "Field": {
        "type": "object",
        "required": ["field", "type", "value"],
        "properties": {
            "field": {"type": "string", "description": "column name"},
            "type": {"type": "string", "description": "SQL type in the destination's dialect"},
            "value": {"description": "the value as it would be stored"},
        },
    },
    "TableStatus": {
        "type": "object",
        "required": ["uploaded", "error"],
        "properties": {"uploaded": {"type": "boolean"}, "error": {"type": "string"}},
    },
    "CachedEvent": {
        "type": "object",
        "required": ["destination_id", "status", "original", "error"],
        "properties": {
            "destination_id": {"type": "string"},
            "token_id": {"type": "string"},
            "event_id": {"type": ["string", "null"]},
            "timestamp": {"type": "string", "description": "RFC 3339 UTC, when cached"},
            "status": {"enum": ["pending", "success", "failed", "skipped"]},
            "original": {"type": ["object", "null"], "description": "the event as accepted (enriched)"},
            "success": {
                "oneOf": [
                    {"type": "null"},
                    {
                        "type": "object",
                        "required": ["table", "record"],
                        "properties": {
                            "table": {"type": "string"},
                            "record": {"type": "array", "items": ref("Field")},
                        },
                    },
                ],
            },
            "error": {"type": "string"},
        },
    },
}


def security_schemes() -> Schema:
    def key(where: str, name: str, description: str) -> Schema:
        return {"type": "apiKey", "in": where, "name": name, "description": description}

    return {
        "clientTokenQuery": key("query", "token", "a token's client (JS) secret"),
        "clientTokenHeader": key("header", "X-Auth-Token", "a token's client (JS) secret"),
        "serverTokenQuery": key("query", "token", "a token's server secret"),
        "serverTokenHeader": key("header", "X-Auth-Token", "a token's server secret"),
        "adminTokenQuery": key("query", "token", "server.admin_token"),
        "adminTokenHeader": key("header", "X-Admin-Token", "server.admin_token"),
        "serverTokenBasic": {
            "type": "http",
            "scheme": "basic",
            "description": "a token's server secret as the user, any password (Segment's write key)",
        },
    }
