"""The OpenAPI document: valid, and the same operations as the routes table (no drift)."""

from __future__ import annotations

from typing import Any

import pytest
from openapi_spec_validator import validate

from eventspark.collector import routes
from eventspark.collector.api.openapi_document import build_document

RANDOM_URL_PATH = "/api.{anything}"
"""How the document spells `routes.RANDOM_URL_PREFIX` (a prefix, not a key of ROUTES)."""


def routed_operations() -> set[tuple[str, str]]:
    pairs = {(path, method.lower()) for path, methods in routes.ROUTES.items() for method in methods}
    return pairs | {(RANDOM_URL_PATH, method.lower()) for method in routes.events.JS_METHODS}


def documented_operations(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(path, method) for path, item in document["paths"].items() for method in item}


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, item in document["paths"].items() for method, op in item.items()]


def test_the_document_is_valid_openapi() -> None:
    validate(build_document())


def test_every_route_is_documented_and_every_documented_operation_is_routed() -> None:
    routed, documented = routed_operations(), documented_operations(build_document())
    assert routed - documented == set(), "routes missing from the OpenAPI document"
    assert documented - routed == set(), "documented operations that no route serves"


def test_the_random_url_is_served_by_the_js_handler() -> None:
    found = routes.find(RANDOM_URL_PATH.replace("{anything}", "x7"))
    assert found is not None and found[1] is routes.events.JS_METHODS


@pytest.mark.parametrize(("path", "method", "op"), operations(build_document()))
def test_operations_declare_their_answers(path: str, method: str, op: dict[str, Any]) -> None:
    answers = op["responses"]
    assert any(code.startswith("2") for code in answers), "no success answer"
    assert "default" not in answers, "a catch-all answer would hide undocumented statuses"
    for code, answer in answers.items():
        if int(code) >= 400:
            schema = answer["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/Error"}, f"{code} is not the error shape"
    if op["security"] and {} not in op["security"]:
        assert "401" in answers, "a token is required: 401 is an answer"


def test_operation_ids_are_unique() -> None:
    ids = [op["operationId"] for _, _, op in operations(build_document())]
    assert len(ids) == len(set(ids))
