"""Transforms through `eventspark serve`: EventNative's `POST /api/v1/templates/evaluate` with
`"field": "_transform"`, the dry run, and a webhook (the HTTP family) in stream mode, which sends
the transformed events."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson
import pytest

from tests.collector.conftest import Server
from tests.http.helpers import FAST
from tests.http.recorder import Recorder
from tests.stream.warehouses import S2S_PATH, serve_config
from tests.tools.conftest import ADMIN, S2S, post, recorder, serve  # noqa: F401 (fixtures)

EVENT = {"event_type": "order", "items": [{"sku": "a"}, {"sku": "b"}], "eventn_ctx": {"event_id": "o1"}}
MULTIPLY = 'return $.items.map(i => ({sku: i.sku, JITSU_TABLE_NAME: "items", __sql_type_sku: "varchar(8)"}))'


@pytest.fixture(scope="module")
def server(serve: Any) -> Server:  # noqa: F811 (the fixture imported above)
    destination = {"type": "postgres", "datasource": {"db": "test", "host": "127.0.0.1"}, "transform": MULTIPLY}
    return serve({"destinations": {"pg": destination}})


def evaluate(server: Server, expression: str, obj: Any = EVENT) -> httpx.Response:
    body = {"object": obj, "expression": expression, "field": "_transform"}
    return post(server, "/api/v1/templates/evaluate", body, token=ADMIN)


def test_evaluate_runs_the_transform(server: Server) -> None:
    answer = evaluate(server, MULTIPLY)
    assert answer.status_code == 200 and answer.json()["format"] == "javascript"
    assert orjson.loads(answer.json()["result"]) == [
        {"sku": "a", "JITSU_TABLE_NAME": "items", "__sql_type_sku": "varchar(8)"},
        {"sku": "b", "JITSU_TABLE_NAME": "items", "__sql_type_sku": "varchar(8)"},
    ]
    assert evaluate(server, "return null").json()["result"] == "null"
    assert evaluate(server, '$.event_type == "order" ? null : $').json()["result"] == "null"  # an expression


def test_evaluate_reports_errors_and_limits(server: Server) -> None:
    syntax = evaluate(server, "return {")
    assert syntax.status_code == 400 and syntax.json()["error"].startswith("error parsing transform: SyntaxError")
    thrown = evaluate(server, "throw new Error('nope')")
    assert thrown.status_code == 400 and thrown.json()["error"] == "error executing transform: Error: nope"
    started = time.monotonic()
    loop = evaluate(server, "while (true) {}")
    assert loop.status_code == 400 and "ran longer than 1000 ms" in loop.json()["error"]
    assert time.monotonic() - started < 60  # 1 s of CPU time; more on a loaded machine
    assert httpx.get(f"{server.url}/ping", timeout=5).status_code == 200  # the event loop was free
    wrong = evaluate(server, "return 'text'")
    assert wrong.status_code == 400 and "the result is a string" in wrong.json()["error"]
    assert evaluate(server, "").status_code == 400
    denied = post(
        server, "/api/v1/templates/evaluate", {"object": {}, "expression": "1", "field": "_transform"}, token=S2S
    )
    assert denied.status_code == 401


def test_dry_run_shows_every_row(server: Server) -> None:
    answer = post(server, "/api/v1/events/dry-run", EVENT, token=S2S, destination_id="pg", format="full")
    assert answer.status_code == 200, answer.text
    first = answer.json()["events"][0]
    assert first["status"] == "ok" and first["table"] == "items"
    assert {"field": "sku", "type": "varchar(8)", "value": "a"} in first["fields"]
    assert [row["table"] for row in first["more"]] == ["items"]
    assert {"field": "eventn_ctx_event_id", "type": "text", "value": "o1_1"} in first["more"][0]["fields"]


def test_webhook_sends_the_transformed_events(serve: Any, recorder: Recorder) -> None:  # noqa: F811
    transform = 'if ($.event_type == "skip") return null; return [{...$, copy: 1}, {...$, copy: 2}]'
    hook = {
        "type": "webhook",
        "mode": "stream",
        "webhook": {**FAST, "url": f"{recorder.url}/hook"},
        "transform": transform,
    }
    server = serve(serve_config({"hook": hook}) | {"api_keys": [{"id": "web", "server_secret": "web-s2s"}]})
    with httpx.Client(base_url=server.url, timeout=5) as client:
        for n, kind in enumerate(["a", "skip", "b"]):
            body = {"event_type": kind, "n": n, "eventn_ctx": {"event_id": f"e{n}"}}
            assert client.post(S2S_PATH, json=body).status_code == 200
    deadline = time.monotonic() + 30
    sent: list[tuple[int, int]] = []
    while len(sent) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
        sent = sorted((body["n"], body["copy"]) for r in recorder.requests if r.body for body in [orjson.loads(r.body)])
    assert sent == [(0, 1), (0, 2), (2, 1), (2, 2)]
    assert "Traceback" not in server.text()
