"""Failed events, replay and a pass now: `GET /api/v1/fallback`, `POST /api/v1/replay`,
`POST|GET /api/v1/batch/run` (admin token).

The work is in `eventspark.ops` (files under `log.path`, so any collector worker process can do
it); the batch passes run in the serving parent's uploader, asked through request files
(`ops.passes`). A call waits for its pass up to `?wait=` seconds (default `DEFAULT_WAIT`, at most
`MAX_WAIT`), then answers 202 with the request id to poll at `GET /api/v1/batch/run?request_id=`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from eventspark.collector.api.common import Routes
from eventspark.collector.auth import check_admin
from eventspark.collector.core import Collector
from eventspark.collector.http import HTTPError, Request, Response, json_response, read_body
from eventspark.ops.fallback import describe, failed_files
from eventspark.ops.passes import RotationRequests, request_pass, request_state, valid_id, wait_answer_async
from eventspark.ops.replay import ReplayError, hand_over, needs_batch_pass, plan_replay, save_pass

DEFAULT_WAIT = 60.0
MAX_WAIT = 600.0
MAX_BODY = 16 * 1024
MAX_IDS = 100
POLL_PATH = "/api/v1/batch/run?request_id="


async def fallback(app: Collector, request: Request) -> Response:
    """`{"files": [{file_name, destination_id, tables_statuses, size, events, modified, replayed}]}`."""
    check_admin(request, app.admin_token)
    raw = request.query_param("destination_ids") or ""
    ids = {part.strip() for part in raw.split(",") if part.strip()}
    if len(ids) > MAX_IDS:
        raise HTTPError(400, "Too many destination_ids", f"at most {MAX_IDS}")

    def listing() -> list[dict[str, Any]]:
        return [describe(file) for file in failed_files(app.log_path, ids or None)]

    return json_response({"files": await asyncio.to_thread(listing)})


async def replay(app: Collector, request: Request) -> Response:
    """Hands the file's events to the pipeline, then waits for the batch pass (module docstring)."""
    check_admin(request, app.admin_token)
    wait = _wait(request)
    body = _json_object(await read_body(request.receive, request.headers, MAX_BODY, "the replay request limit"))
    force = body.get("force", False)
    if not isinstance(force, bool):
        raise HTTPError(400, "force must be true or false")
    config = app.config
    try:
        plan = await asyncio.to_thread(
            plan_replay, config, body.get("file_name"), body.get("destination_id"), body.get("file_format"), force
        )
        record = await asyncio.to_thread(hand_over, config, plan)
    except ReplayError as exc:
        raise HTTPError(exc.status, exc.message, exc.error) from None
    except OSError as exc:  # a full disk...: the record of the replay says what was handed over
        raise HTTPError(503, "Failed to hand the events over", exc.strerror or str(exc)) from None
    answer: dict[str, Any] = {
        "status": "ok",
        "file_name": plan.file_name,
        "replay_id": record["id"],
        "events": record["events"],
        "unreadable": record["unreadable"],
        "destinations": record["destinations"],
    }
    if not needs_batch_pass(record):
        return json_response(answer)
    request_id = await asyncio.to_thread(request_pass, app.log_path, f"replay {record['id']}")
    result = await wait_answer_async(app.log_path, request_id, wait)
    await asyncio.to_thread(save_pass, app.log_path, record, request_id, result)
    if result is None:
        answer["pass"] = _pending(request_id)
        return json_response(answer, 202)
    answer["pass"] = result
    return json_response(answer)


async def batch_run(app: Collector, request: Request) -> Response:
    """Rotates this process's incoming logs, asks the uploader for a pass, answers its summary."""
    check_admin(request, app.admin_token)
    wait = _wait(request)
    if not any(dest.mode == "batch" for dest in app.config.destinations.values()):
        raise HTTPError(409, "No batch destination is configured", "stream destinations load continuously")
    try:
        app.logs.rotate()  # on the event loop: the thread that writes these files
    except OSError as exc:
        raise HTTPError(503, "Failed to rotate the incoming logs", exc.strerror or str(exc)) from None
    request_id = await asyncio.to_thread(request_pass, app.log_path, "POST /api/v1/batch/run", True)
    RotationRequests(app.log_path, app.worker).done([request_id])  # the other processes rotate theirs
    result = await wait_answer_async(app.log_path, request_id, wait)
    if result is None:
        return json_response(_pending(request_id), 202)
    return json_response({**result, "request_id": request_id})


async def batch_run_state(app: Collector, request: Request) -> Response:
    """`?request_id=`: `{"status": "pending"|"running"}` or the pass's answer."""
    check_admin(request, app.admin_token)
    request_id = request.query_param("request_id") or ""
    if not valid_id(request_id):
        raise HTTPError(400, "Invalid request_id", "32 hexadecimal digits, as POST /api/v1/batch/run answered")
    state, answer = await asyncio.to_thread(request_state, Path(app.log_path), request_id)
    if state == "unknown":
        raise HTTPError(404, "Unknown request", request_id)
    if answer is None:
        return json_response(_pending(request_id, state))
    return json_response({**answer, "request_id": request_id})


def _pending(request_id: str, state: str = "pending") -> dict[str, Any]:
    return {"status": state, "request_id": request_id, "poll": POLL_PATH + request_id}


def _wait(request: Request) -> float:
    raw = request.query_param("wait")
    if raw is None:
        return DEFAULT_WAIT
    try:
        wait = float(raw)
    except ValueError:
        raise HTTPError(400, "Invalid wait", f"seconds, 0 to {MAX_WAIT:g}") from None
    if not 0 <= wait <= MAX_WAIT:
        raise HTTPError(400, "Invalid wait", f"seconds, 0 to {MAX_WAIT:g}")
    return wait


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise HTTPError(400, "Failed to parse body", str(exc)) from None
    if not isinstance(parsed, dict):
        raise HTTPError(400, "The body must be a JSON object", '{"file_name": ..., "destination_id": ...}')
    return parsed


ROUTES: Routes = {
    "/api/v1/fallback": {"GET": fallback},
    "/api/v1/replay": {"POST": replay},
    "/api/v1/batch/run": {"POST": batch_run, "GET": batch_run_state},
}
