"""`POST /api/v1/templates/evaluate` over real HTTP: EventNative's body and answer."""

from __future__ import annotations

from typing import Any

import pytest

from tests.collector.conftest import Server
from tests.tools.conftest import ADMIN, S2S, post

EVENT = {"event_type": "Page View", "_timestamp": "2020-06-16T23:00:00.000000Z", "user": {"id": 7}}


@pytest.fixture(scope="module")
def server(serve: Any) -> Server:
    return serve({"destinations": {}})


def evaluate(server: Server, body: Any, token: str = ADMIN) -> Any:
    return post(server, "/api/v1/templates/evaluate", body, token=token)


def test_table_name_template(server: Server) -> None:
    expression = '{{.event_type}}_{{._timestamp.Format "2006_01"}}'
    raw = evaluate(server, {"object": EVENT, "expression": expression})
    assert raw.status_code == 200
    assert raw.json() == {
        "result": "Page View_2020_06",
        "error": "",
        "user_result": "",
        "user_error": "",
        "format": "go",
    }
    reformatted = evaluate(server, {"object": EVENT, "expression": expression, "reformat": True})
    assert reformatted.json()["result"] == "page_view_2020_06"  # as a table name
    nested = evaluate(server, {"object": EVENT, "expression": "{{if eq .user.id 7}}seven{{else}}other{{end}}"})
    assert nested.json()["result"] == "seven"
    assert evaluate(server, {"object": {}, "expression": "{{.missing}}"}).json()["result"] == "null"


def test_template_errors(server: Server) -> None:
    syntax = evaluate(server, {"object": EVENT, "expression": "{{.event_type"})
    assert syntax.status_code == 400
    assert syntax.json()["error"].startswith("error parsing template") and syntax.json()["result"] == ""
    assert syntax.json()["message"] == syntax.json()["error"]
    execution = evaluate(server, {"object": {}, "expression": '{{._timestamp.Format "2006"}}'})
    assert execution.status_code == 400 and execution.json()["error"].startswith("error executing template")
    code = evaluate(server, {"object": EVENT, "expression": "{{.__class__.__init__}}"})
    assert code.status_code == 200 and code.json()["result"] == "null"  # no attribute access: just a key
    too_long = evaluate(server, {"object": EVENT, "expression": "x" * 5000})
    assert too_long.status_code == 400 and "longer than" in too_long.json()["error"]


def test_bad_requests(server: Server) -> None:
    assert evaluate(server, {"object": EVENT, "expression": "x"}, token=S2S).status_code == 401
    missing = evaluate(server, {"expression": "x"})
    assert missing.status_code == 400 and missing.json()["message"] == "'object' is required field"
    assert evaluate(server, {"object": EVENT, "expression": 5}).status_code == 400
    assert evaluate(server, {"object": EVENT, "field": "_transform"}).status_code == 400
    assert evaluate(server, [1]).status_code == 400
    assert post(server, "/api/v1/templates/evaluate", content=b"nope", token=ADMIN).status_code == 400
