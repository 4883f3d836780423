"""Setting up a destination: dry run, destination test, template evaluation.

`POST /api/v1/events/dry-run?destination_id=X` (server secret): what the body's events would
become in destination X, nothing written (`ops.dryrun`): for a body that is one event, the
spec's `[{"field", "type", "value"}]`; for several (an array or a template body), one such list
per event (EventNative v1.41's list of lists, which `?format=lists` gives for any body); with
`?format=full`, each event's table, status and fields. `POST /api/v1/destinations/test`
(admin): a destination config proved by its type's probe (`ops.probe`).
`POST /api/v1/templates/evaluate` (admin): a `table_name_template` on an object, EventNative's
body and answer; with `"field": "_transform"`, a JavaScript transform (docs/transforms.md).
docs/setup-tools.md has the details.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import orjson

from eventspark.collector.api.common import Routes
from eventspark.collector.auth import check_admin, request_token
from eventspark.collector.body import events_of, parse_failed, parse_json
from eventspark.collector.core import Collector
from eventspark.collector.http import HTTPError, Request, Response, json_response, read_body, sender
from eventspark.config.routing import takes_token
from eventspark.ops import dryrun, probe
from eventspark.steps.context import enrich_context, utc_timestamp
from eventspark.steps.template import TemplateEvalError, TemplateSyntaxError, compile_template
from eventspark.steps.transform import Transform, TransformFailed, TransformSyntaxError, parse_result

DRY_RUN_FORMATS = ("eventnative", "lists", "full")
"""`eventnative` (the default): the answer's shape follows the body's; `lists`: one field list
per event whatever the body; `full`: each event's table, status, fields and error."""
PROBE_DESTINATION_ID = "destination_test"
"""The id a tested config gets (it names nothing the node runs)."""


# --- dry run --------------------------------------------------------------------------------------


async def dry_run(app: Collector, request: Request) -> Response:
    token, secret = app.tokens.require_server(request_token(request))
    dest_id = request.query_param("destination_id")
    if not dest_id:
        raise HTTPError(400, "Error getting [destination_id] parameter - it must not be empty")
    dest = app.config.destinations.get(dest_id)
    if dest is None:
        raise HTTPError(404, f"Error: destination with id=[{dest_id}] does not exist")
    if not takes_token(dest, token):
        raise HTTPError(403, f"The token is not allowed to send events to destination [{dest_id}]", "only_tokens")
    answer = request.query_param("format") or "eventnative"
    if answer not in DRY_RUN_FORMATS:
        raise HTTPError(400, f"Unknown format {answer[:40]!r}", f"use one of {', '.join(DRY_RUN_FORMATS)}")
    events, one_object = _events(await read_body(request.receive, request.headers, app.max_event_size))
    if not 1 <= len(events) <= dryrun.MAX_EVENTS:
        raise parse_failed(f"a dry run takes 1 to {dryrun.MAX_EVENTS} events, got {len(events)}")
    ip, agent = sender(request.scope, request.headers, True, app.proxies)
    now = utc_timestamp()
    for event in events:  # as the s2s endpoint enriches them (the agent goes into hashed_anonymous_id)
        enrich_context(event, token=secret, source_ip=ip, user_agent=agent, server_side=True, timestamp=now)
    geo = app.config.geo.maxmind_path
    try:
        limit = app.config.server.max_columns
        results = await asyncio.to_thread(dryrun.dry_run, dest_id, dest, app.log_path, geo, events, limit)
    except Exception as exc:  # building the chain (a missing driver...): the destination's problem
        raise HTTPError(400, f"Error getting dry run response for destination with id=[{dest_id}]", str(exc)) from None
    if answer == "full":
        return json_response({"destination_id": dest_id, "events": [r.to_dict() for r in results]})
    problem = next((r for r in results if r.status != "ok"), None)
    if problem is not None:  # EventNative answered a skipped or failed event with 400
        raise HTTPError(400, f"Error getting dry run response for destination with id=[{dest_id}]", problem.error)
    lists = [r.fields for r in results]
    return json_response(lists[0] if one_object and answer == "eventnative" else lists)


def _events(body: bytes) -> tuple[list[dict[str, Any]], bool]:
    """The body's events, and whether the body is one event object (not an array, not a
    template body): the spec answers one event with a flat field list."""
    value = parse_json(body)
    events = events_of(value)
    # events_of gives a plain object back as it is, and new (merged) objects for a template body.
    return events, len(events) == 1 and events[0] is value


# --- destination test -----------------------------------------------------------------------------


async def destination_test(app: Collector, request: Request) -> Response:
    check_admin(request, app.admin_token)
    raw = parse_json(await read_body(request.receive, request.headers, app.max_event_size))
    send_event = _flag(request.query_param("send_event"))
    timeout = _timeout(request.query_param("timeout"))
    try:
        dest = probe.parse_destination(raw)
    except ValueError as exc:
        raise HTTPError(400, "Invalid destination config", str(exc)) from None
    events_dir = app.log_path

    def work() -> str:
        return probe.probe_destination(PROBE_DESTINATION_ID, dest, events_dir, send_event, confine=True)

    try:
        checked = await probe.run_bounded_async(work, timeout)
    except probe.Busy as exc:
        raise HTTPError(429, "Too many destination tests at once", str(exc)) from None
    except Exception as exc:  # every failure is the destination's answer: 400 with its message
        raise HTTPError(400, probe.failure_message(exc), _error_text(exc)) from None
    return json_response({"status": "ok", "checked": checked})


def _flag(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


def _timeout(value: str | None) -> float:
    if value is None or value == "":
        return probe.DEFAULT_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= probe.MAX_TIMEOUT:
        raise HTTPError(400, "Invalid timeout", f"timeout is seconds, more than 0 and at most {probe.MAX_TIMEOUT:g}")
    return seconds


def _error_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 2000 else text[:2000] + "..."


# --- templates ------------------------------------------------------------------------------------


async def evaluate_template(app: Collector, request: Request) -> Response:
    """EventNative's body: `{"object": {...}, "expression": "...", "reformat": bool}`; answer
    `{"result", "error", "format"}` (400 with the error, and `message`, when it fails)."""
    check_admin(request, app.admin_token)
    body = parse_json(await read_body(request.receive, request.headers, app.max_event_size))
    if not isinstance(body, dict):
        raise parse_failed(f"expected a JSON object, got {type(body).__name__}")
    obj, expression = body.get("object"), body.get("expression", "")
    if not isinstance(obj, dict):
        raise HTTPError(400, "'object' is required field", "object must be a JSON object")
    if not isinstance(expression, str):
        raise HTTPError(400, "'expression' must be a string")
    if body.get("field") == "_transform":  # EventNative's UI tries a transform this way
        if not expression.strip():
            raise HTTPError(400, "'expression' is required field", "expression must be the transform's JavaScript")
        return await _evaluate_transform(obj, expression)
    try:
        template = compile_template(expression)
    except TemplateSyntaxError as exc:
        return _template_error("error parsing template", exc)
    try:
        result = template.render(obj) if body.get("reformat") is True else template.render_raw(obj)
    except TemplateEvalError as exc:
        return _template_error("error executing template", exc)
    return json_response(_template_answer(result, ""))


async def _evaluate_transform(obj: dict[str, Any], source: str) -> Response:
    """The transform's result on `obj` as JSON text (`null`: skipped), with the limits every
    destination has by default; run off the event loop (it may take its whole time limit)."""
    try:
        result = await asyncio.to_thread(_run_transform, obj, source)
    except TransformSyntaxError as exc:
        return _template_error("error parsing transform", exc, "javascript")
    except TransformFailed as exc:
        return _template_error("error executing transform", exc, "javascript")
    return json_response(_template_answer(result, "", "javascript"))


def _run_transform(obj: dict[str, Any], source: str) -> str:
    transform = Transform.compile(source)
    try:
        text = transform.run_text(orjson.dumps(obj).decode())
    finally:
        transform.close()  # one try: its engine process is not kept
    parse_result(text)  # the checks a destination applies (an array of objects, sizes)
    return "null" if text is None else text


def _template_error(message: str, exc: Exception, format: str = "go") -> Response:
    error = f"{message}: {exc}"
    return json_response({"message": error, **_template_answer("", error, format)}, status=400)


def _template_answer(result: str, error: str, format: str = "go") -> dict[str, Any]:
    return {"result": result, "error": error, "user_result": "", "user_error": "", "format": format}


ROUTES: Routes = {
    "/api/v1/events/dry-run": {"POST": dry_run},
    "/api/v1/destinations/test": {"POST": destination_test},
    "/api/v1/templates/evaluate": {"POST": evaluate_template},
}
