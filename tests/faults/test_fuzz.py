"""Fuzzing a running `eventspark serve` from its own OpenAPI document with schemathesis.

One server for the module: a stream and a batch Postgres destination (127.0.0.1:5432, db `test`,
a schema of their own) and Redis coordination (127.0.0.1:6379, a key prefix of its own). Every
operation of the document gets generated requests (valid ones, and ones that break the schema)
with valid credentials; each answer must not be a 5xx and must match the document: status code,
content type and body schema. Then hostile bodies go to every POST endpoint.

A failure prints schemathesis's reproducer (a curl command). Part of the fault suite: every
request is counted, and the last test checks that the server is alive with no traceback in its
log, and records the figure (requests, 5xx, crashes).
"""

from __future__ import annotations

import base64
import gzip
import os
import random
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from eventspark.collector.api.openapi_document import ADMIN, CLIENT, SERVER, build_document
from eventspark.logs.failed import event_error_line
from tests.collector.conftest import Server, start_server
from tests.conftest import PG_DB, PG_HOST, PG_PORT, PG_USER, pg_conninfo

RUN = uuid.uuid4().hex[:10]
CLIENT_SECRET, SERVER_SECRET, ADMIN_TOKEN = f"fuzz-js-{RUN}", f"fuzz-s2s-{RUN}", f"fuzz-admin-{RUN}"
SCHEMA_NAME = f"fuzz_{RUN}"
KEY_PREFIX = f"eventspark-fuzz-{RUN}:"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
DOCUMENT = build_document()
API = schemathesis.openapi.from_dict(DOCUMENT)
# The bulk endpoint reads any body that is not multipart as NDJSON text.
schemathesis.serializer.alias("application/x-ndjson", "text/plain")

EXAMPLES = int(os.environ.get("EVENTSPARK_FUZZ_EXAMPLES", "30"))
"""Examples per operation and mode; a longer hunt: `EVENTSPARK_FUZZ_EXAMPLES=300`."""
FEW_EXAMPLES = {"POST /api/v1/batch/run": 3, "POST /api/v1/replay": 10, "POST /api/v1/destinations/test": 10}
"""Operations that start a Spark pass or connect to a warehouse: a few examples are enough."""
NO_SUCCESS_EXPECTED = {
    "GET /api/v1/batch/run": "request ids are random: a generated one is unknown (404)",
    "POST /api/v1/destinations/test": "a generated config names no reachable warehouse (tests/tools test good ones)",
    **{
        f"{method} {prefix}{{file}}": "a generated file name is not there (404); tests/static serves real ones"
        for method in ("GET", "HEAD")
        for prefix in ("/s/", "/t/")
    },
}
"""Valid requests of every other operation must get a 2xx at least once: else the fuzzing never
checked that operation's success answer against its schema."""


COUNTS = {"requests": 0, "5xx": 0}
"""Requests sent by this module's tests and their 5xx answers, for the figure."""


def count(status: int) -> None:
    COUNTS["requests"] += 1
    COUNTS["5xx"] += status >= 500


def labels() -> list[str]:
    return [f"{method.upper()} {path}" for path, item in DOCUMENT["paths"].items() for method in item]


def credentials(label: str) -> tuple[dict[str, str], dict[str, str]]:
    """(query, headers) that authenticate for an operation: the secret in every place its
    security schemes name (schemathesis fills them with generated values otherwise)."""
    method, path = label.split(" ", 1)
    schemes = {name for option in DOCUMENT["paths"][path][method.lower()]["security"] for name in option}
    if schemes & {name for option in ADMIN for name in option}:
        return {"token": ADMIN_TOKEN}, {"X-Admin-Token": ADMIN_TOKEN}
    if schemes & {name for option in CLIENT for name in option}:
        return {"token": CLIENT_SECRET}, {"X-Auth-Token": CLIENT_SECRET}
    if schemes & {name for option in SERVER for name in option}:
        return {"token": SERVER_SECRET}, {"X-Auth-Token": SERVER_SECRET}
    return {}, {}


def seed_failed_file(events_dir: Path) -> str:
    """A failed file of the stream destination (as the pipeline writes it), so that replays and the
    fallback listing answer with content, not only 404s and empty lists."""
    path = events_dir / "failed" / "failed.dst=pg_stream.log"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        event = {"eventn_ctx": {"event_id": uuid.uuid4().hex}, "field": "x"}
        path.write_bytes(event_error_line(event, "column field: does not fit"))
    return path.name


def prepare(case: schemathesis.Case, label: str, mode: GenerationMode, events_dir: Path) -> None:
    """Valid credentials; and, for valid requests, inputs a random string rarely gets right."""
    query, headers = credentials(label)
    case.query = {**(case.query or {}), **query}
    case.headers = {**(case.headers or {}), **headers}
    wait = case.query.get("wait")
    if isinstance(wait, int | float) and not isinstance(wait, bool) and wait > 1:
        # Seconds to wait for a batch pass (up to 600): at most 1 s, then a documented 202.
        case.query["wait"] = 1
    if mode is not GenerationMode.POSITIVE:
        return
    if label == "GET /api/v1/p.gif":  # base64 JSON: the generated string inside an event
        case.query["data"] = base64.b64encode(orjson.dumps({"data": case.query.get("data")})).decode()
    if label == "POST /api/v1/events/dry-run" and len(str(case.query.get("destination_id"))) % 2:
        case.query["destination_id"] = "pg_stream"
    if label == "POST /api/v1/replay" and isinstance(case.body, dict) and len(str(case.body)) % 2:
        # A file that exists (a replay moves it away: written again), into its own destination.
        case.body = {**case.body, "file_name": seed_failed_file(events_dir), "force": True}
        case.body.pop("destination_id", None)
        case.body.pop("file_format", None)


def server_config() -> dict[str, Any]:
    datasource = {"host": PG_HOST, "port": PG_PORT, "db": PG_DB, "schema": SCHEMA_NAME, "username": PG_USER}
    return {
        "server": {"admin_token": ADMIN_TOKEN, "metrics": {"prometheus": {"enabled": True}}},
        "api_keys": [{"id": "fuzz", "client_secret": CLIENT_SECRET, "server_secret": SERVER_SECRET}],
        "log": {"uploader_period_sec": 3600, "rotation_min": 60},
        "destinations": {
            "pg_stream": {
                "type": "postgres",
                "mode": "stream",
                "datasource": datasource,
                "data_layout": {"table_name_template": "fuzz_stream"},
            },
            "pg_batch": {
                "type": "postgres",
                "mode": "batch",
                "datasource": datasource,
                "data_layout": {"table_name_template": "fuzz_batch"},
            },
        },
        "coordination": {"redis": {"host": "127.0.0.1", "port": 6379}, "key_prefix": KEY_PREFIX},
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("fuzz"), server_config())
    seed_failed_file(running.events_dir)
    try:
        yield running
    finally:
        try:
            running.stop()
        except subprocess.TimeoutExpired:  # still cleaned up: nothing of the run is left behind
            running.stop(signal.SIGKILL)
        finally:
            clean_up()


def clean_up() -> None:
    """Drops the run's schema and deletes its Redis keys (after the server stopped writing them)."""
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA_NAME}" CASCADE')
    client = redis.Redis(host="127.0.0.1", port=6379)
    try:
        keys = list(client.scan_iter(match=f"{KEY_PREFIX}*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def test_the_served_document_is_the_built_one(server: Server) -> None:
    response = httpx.get(f"{server.url}/api/v1/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == orjson.loads(orjson.dumps(DOCUMENT))


def generation_runs() -> list[tuple[str, GenerationMode]]:
    """Every operation with valid requests; those with inputs also with schema-breaking ones."""
    runs = []
    for label in labels():
        method, path = label.split(" ", 1)
        op = DOCUMENT["paths"][path][method.lower()]
        runs.append((label, GenerationMode.POSITIVE))
        if "parameters" in op or "requestBody" in op:
            runs.append((label, GenerationMode.NEGATIVE))
    return runs


@pytest.mark.parametrize(("label", "mode"), generation_runs())
def test_answers_match_the_document(server: Server, label: str, mode: GenerationMode) -> None:
    operation = API.find_operation_by_label(label)
    assert operation is not None
    statuses: set[int] = set()

    @settings(
        max_examples=FEW_EXAMPLES.get(label, EXAMPLES),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: schemathesis.Case) -> None:
        prepare(case, label, mode, server.events_dir)
        response = case.call(base_url=server.url, timeout=60)
        count(response.status_code)
        statuses.add(response.status_code)
        case.validate_response(response, checks=CHECKS)

    check()
    if mode is GenerationMode.POSITIVE and label not in NO_SUCCESS_EXPECTED:
        assert any(200 <= status < 300 for status in statuses), f"no success answer was checked: {statuses}"


def hostile_bodies() -> dict[str, bytes]:
    """Bodies no parser should choke on; named for the test ids."""
    noise = random.Random(16).randbytes(4096)
    return {
        "random-bytes": noise,
        "empty": b"",
        "null": b"null",
        "string": b'"event"',
        "deep-arrays": b"[" * 100_000 + b"]" * 100_000,
        "deep-objects": b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
        "unclosed": b'{"a":' * 5_000,
        "huge-int": b'{"n": ' + b"9" * 5_000 + b"}",
        "two-to-the-10000": b'{"n": ' + str(2**10_000).encode() + b', "m": -' + str(2**10_000).encode() + b"}",
        "deep-objects-100k": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        "invalid-utf8": b'{"a": "\xff\xfe\xfa", "\xc3": 1}',
        "nul-bytes": b"\x00" * 1_000,
        "huge-float": b'{"n": 1e400, "m": -1e400}',
        "nul": b'{"a": "x\\u0000y", "b\\u0000": 1, "c": "\x00"}',
        "lone-surrogate-escaped": b'{"a": "\\ud800", "b": "\\udfff x"}',
        "lone-surrogate-raw": b'{"a": "\xed\xa0\x80"}',
        "overlong-utf8": b'{"a": "\xc0\xaf"}',
        "many-keys": orjson.dumps({f"k{i}": i for i in range(20_000)}),
        "long-key": orjson.dumps({"k" * 100_000: 1}),
        "template-bomb": orjson.dumps({"template": {f"t{i}": i for i in range(5_000)}, "events": [{}] * 5_000}),
        "wrong-shapes": orjson.dumps(
            {"file_name": ["x"], "destination_id": {"a": 1}, "object": 5, "expression": None, "type": 7}
        ),
        "traversal": orjson.dumps({"file_name": "../../../../etc/passwd", "expression": "{{.a}}", "object": {}}),
        "template-abuse": orjson.dumps({"expression": "{{" * 10_000, "object": {"a": 1}}),
    }


def post_labels() -> list[str]:
    """POST operations that take a body (`POST /api/v1/batch/run` reads none: its generated
    requests above cover it, and each of its calls costs a Spark pass)."""
    return [
        label
        for label in labels()
        if label.startswith("POST ") and "requestBody" in DOCUMENT["paths"][label.split(" ", 1)[1]]["post"]
    ]


def post_operation(server: Server, label: str, extra: dict[str, str], body: bytes) -> tuple[Any, httpx.Response]:
    """POSTs `body` to the operation `label`, authenticated, and counts the answer's status."""
    operation = API.find_operation_by_label(label)
    assert operation is not None
    query, headers = credentials(label)
    path = operation.path.replace("{anything}", "fuzz")
    params = {**query, "destination_id": "pg_stream", "wait": 1}
    response = httpx.post(f"{server.url}{path}", params=params, headers={**headers, **extra}, content=body, timeout=60)
    count(response.status_code)
    return operation, response


@pytest.mark.parametrize("name", list(hostile_bodies()))
@pytest.mark.parametrize("label", post_labels())
def test_hostile_bodies_get_a_documented_answer(server: Server, label: str, name: str) -> None:
    operation, response = post_operation(server, label, {"content-type": "application/json"}, hostile_bodies()[name])
    assert response.status_code < 500, f"{label} {name}: {response.status_code} {response.text[:500]}"
    case = operation.Case(
        media_type="application/json", path_parameters={"anything": "fuzz"} if "{" in operation.path else None
    )
    case.validate_response(response, checks=CHECKS)


@pytest.mark.parametrize(
    "content_type",
    ["multipart/form-data", "multipart/form-data; boundary=", "multipart/form-data; boundary=b", "text/plain"],
)
@pytest.mark.parametrize("name", ["random-bytes", "empty", "deep-arrays", "nul", "lone-surrogate-raw", "many-keys"])
def test_hostile_uploads_get_a_documented_answer(server: Server, content_type: str, name: str) -> None:
    body = hostile_bodies()[name]
    if content_type.endswith("boundary=b"):  # a well-formed part around the hostile content
        body = b'--b\r\nContent-Disposition: form-data; name="file"; filename="x"\r\n\r\n' + body + b"\r\n--b--\r\n"
    response = httpx.post(
        f"{server.url}/api/v1/events/bulk",
        params={"token": SERVER_SECRET},
        headers={"content-type": content_type},
        content=body,
        timeout=60,
    )
    count(response.status_code)
    assert response.status_code < 500, f"{content_type} {name}: {response.status_code} {response.text[:500]}"
    operation = API.find_operation_by_label("POST /api/v1/events/bulk")
    assert operation is not None
    operation.Case(media_type="application/x-ndjson").validate_response(response, checks=CHECKS)


def encoded_bodies() -> dict[str, tuple[dict[str, str], bytes]]:
    """(headers, body) of bodies whose framing lies: gzip cut short, content types that do not fit."""
    event = orjson.dumps({"event_type": "fuzz", "n": 1})
    packed = gzip.compress(event * 100)
    return {
        "truncated-gzip": (
            {"content-type": "application/json", "content-encoding": "gzip"},
            packed[: len(packed) // 2],
        ),
        "gzip-of-garbage": (
            {"content-type": "application/json", "content-encoding": "gzip"},
            gzip.compress(b"\xff" * 64),
        ),
        "claims-gzip": ({"content-type": "application/json", "content-encoding": "gzip"}, event),
        "form-urlencoded": ({"content-type": "application/x-www-form-urlencoded"}, b"a=1&b=%ZZ"),
        "multipart-json": ({"content-type": "multipart/form-data; boundary=x"}, event),
        "image": ({"content-type": "image/png"}, b"\x89PNG\r\n\x1a\n" + bytes(64)),
        "charset-utf16": ({"content-type": "application/json; charset=utf-16"}, event.decode().encode("utf-16")),
    }


@pytest.mark.parametrize("name", list(encoded_bodies()))
@pytest.mark.parametrize("label", post_labels())
def test_lying_encodings_get_a_documented_answer(server: Server, label: str, name: str) -> None:
    extra, body = encoded_bodies()[name]
    _, response = post_operation(server, label, extra, body)
    assert response.status_code < 500, f"{label} {name}: {response.status_code} {response.text[:500]}"


def test_the_server_survived_the_fuzzing(server: Server, figure: Any) -> None:
    """Last in the module: the server still answers, and logged no traceback."""
    alive = server.process.poll() is None and httpx.get(f"{server.url}/ping", timeout=10).status_code == 200
    tracebacks = server.text().count("Traceback (most recent call last)")
    figure(f"requests {COUNTS['requests']:,}, 5xx {COUNTS['5xx']}, crashes {int(not alive)}, tracebacks {tracebacks}")
    assert alive
    assert tracebacks == 0, server.text()[-5000:]
    assert COUNTS["5xx"] == 0
