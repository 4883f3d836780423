"""JSON logs with request and job ids (`eventspark.logconfig`), in process and from `serve`."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from typer.testing import CliRunner

from eventspark import cli
from eventspark.collector import routes
from eventspark.collector.app import CollectorApp
from eventspark.collector.http import Request, Response
from eventspark.config.models import Config
from eventspark.logconfig import JOB_ID, JsonFormatter, configure, job
from tests.batch.helpers import duckdb_destination, make_config
from tests.collector.conftest import start_server

log = logging.getLogger("eventspark.tests.logconfig")


@pytest.fixture
def json_logs() -> Iterator[Any]:
    """JSON logging into a buffer; the root logger restored afterwards. Yields a function
    returning the JSON lines written so far."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    buffer = io.StringIO()
    configure("json", "info", stream=buffer)

    def lines() -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in buffer.getvalue().splitlines() if line]

    yield lines
    root.handlers[:], root.level = handlers, level


def test_a_json_line_has_time_level_logger_message(json_logs: Any) -> None:
    log.warning("hello %s", "world")
    (line,) = json_logs()
    assert line["level"] == "warning" and line["logger"] == log.name and line["message"] == "hello world"
    assert line["time"].endswith("Z") and len(line["time"]) == len("2026-11-24T14:42:32.123Z")
    assert "request_id" not in line and "job_id" not in line


def test_lines_inside_a_job_carry_its_id_and_exceptions_their_traceback(json_logs: Any) -> None:
    with job("pass") as job_id:
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
    log.info("after")
    inside, after = json_logs()
    assert job_id.startswith("pass-") and inside["job_id"] == job_id
    assert "ValueError: boom" in inside["exception"]
    assert "job_id" not in after and JOB_ID.get() is None


def test_every_line_is_json_even_for_lone_surrogates_and_bad_log_calls(json_logs: Any) -> None:
    log.warning("value %s", "a\ud800b é \x00")
    try:
        raise ValueError("\udcff boom")
    except ValueError:
        log.exception("failed on %s", "ü")
    surrogate, failed = json_logs()  # each a JSON object: none went missing
    assert surrogate["message"] == "value a\\ud800b é \x00"
    assert failed["message"] == "failed on ü" and "ValueError: \\udcff boom" in failed["exception"]
    # Straight to the formatter: pytest's own capture handler raises on a bad call before ours runs.
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "count %d", ("not a number",), None)
    bad_call = orjson.loads(JsonFormatter().format(record))
    assert "'count %d' % ('not a number',)" in bad_call["message"] and "TypeError" in bad_call["message"]


def test_text_stays_the_default() -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    buffer = io.StringIO()
    try:
        configure(stream=buffer)
        log.info("plain")
        assert buffer.getvalue().strip().endswith("INFO eventspark.tests.logconfig: plain")
    finally:
        root.handlers[:], root.level = handlers, level


@pytest.mark.parametrize("command", [["check"], ["status"], ["dry-run", "-d", "dd", "--file", "event.json"]])
def test_commands_log_as_the_config_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    make_config(
        tmp_path, {"dd": duckdb_destination(template="t")}, server={"log": {"format": "json", "level": "error"}}
    )
    (tmp_path / "event.json").write_bytes(b'{"a": 1}')
    monkeypatch.chdir(tmp_path)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        done = CliRunner().invoke(cli.app, [*command, "-c", str(tmp_path / "eventspark.yaml")])
        assert done.exit_code == 0, done.output
        assert [type(h.formatter) for h in root.handlers] == [JsonFormatter] and root.level == logging.ERROR
    finally:
        root.handlers[:], root.level = handlers, level


# --- request ids, in process: a route that logs and fails ------------------------------------------


async def _failing(app: Any, request: Request) -> Response:
    log.info("handling")
    await asyncio.to_thread(log.info, "on a thread")
    raise RuntimeError("handler bug")


def _call(app: CollectorApp, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict[bytes, bytes]]:
    scope = {"type": "http", "method": "GET", "path": "/test/fail", "query_string": b"", "headers": headers}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], dict(sent[0]["headers"])


@pytest.mark.parametrize(
    ("incoming", "kept"), [(b"abc-123.x", True), (b"bad id\r\n", False), (b"x" * 65, False), (None, False)]
)
def test_request_lines_carry_the_request_id_that_the_answer_echoes(
    json_logs: Any, monkeypatch: pytest.MonkeyPatch, incoming: bytes | None, kept: bool
) -> None:
    monkeypatch.setitem(routes.ROUTES, "/test/fail", {"GET": _failing})
    app = CollectorApp(Config())
    status, headers = _call(app, [(b"x-request-id", incoming)] if incoming else [])
    lines = json_logs()
    assert status == 500
    ids = {line.get("request_id") for line in lines}
    assert ids == {headers[b"x-request-id"].decode()}, lines
    assert (headers[b"x-request-id"] == incoming) == kept
    assert [line["message"] for line in lines] == ["handling", "on a thread", "unexpected error on GET /test/fail"]
    assert "RuntimeError: handler bug" in lines[-1]["exception"]


def test_a_quiet_request_gets_no_request_id_header(json_logs: Any) -> None:
    status, headers = _call(CollectorApp(Config()), [])
    assert status == 404 and b"x-request-id" not in headers
    assert json_logs() == []


# --- over real processes -------------------------------------------------------------------------


def test_serve_logs_json_lines(tmp_path: Path) -> None:
    server = start_server(tmp_path, {"server": {"log": {"format": "json"}}, "destinations": {}})
    try:
        assert httpx.get(f"{server.url}/ping").status_code == 200
    finally:
        assert server.stop() == 0
    ours = [orjson.loads(line) for line in server.text().splitlines() if line.startswith('{"time"')]
    assert any(line["logger"].startswith("eventspark.") for line in ours), server.text()
    assert {"collector stopped; rotated 0 incoming log(s)"} <= {line["message"] for line in ours}
    for line in server.text().splitlines():  # uvicorn's lines go through the same handler
        if "uvicorn" in line or "eventspark." in line:
            assert line.startswith('{"time"'), line
