"""The EventNative HTTP API through real HTTP on one started `eventspark serve` (shared by the module)."""

from __future__ import annotations

import base64
import re
import signal
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.collector.conftest import TESTDATA, Server, fixture_json, start_server
from tests.vectors import with_hashed_id

ADMIN = "admin-secret"
MAX_EVENT_SIZE = 64 * 1024
FORWARDED = {"X-Forwarded-For": "95.82.232.185", "User-Agent": "Go-http-client/1.1"}
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
CONFIG: dict[str, Any] = {
    "server": {"name": "node-a", "admin_token": ADMIN, "max_event_size": MAX_EVENT_SIZE},
    "api_keys": [
        {"id": "c2s", "client_secret": "c2stoken", "server_secret": "s2stoken"},
        {
            "id": "web",
            "client_secret": "js-web",
            "server_secret": "s2s-web",
            "origins": ["*example.com", "app.*", "*partner*", "https://exact.org"],
        },
        {"id": "lonely", "client_secret": "js-lonely", "server_secret": "s2s-lonely"},
        "same-secret",
    ],
    "log": {"rotation_min": 60},
    "destinations": {
        "dw": {"type": "duckdb", "only_tokens": ["c2s", "web", "same-secret"]},
        # A stream destination whose warehouse is down: its worker keeps every event queued.
        "live": {
            "type": "postgres",
            "mode": "stream",
            "only_tokens": ["web"],
            "datasource": {"host": "127.0.0.1", "port": 1, "db": "down"},
        },
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("api"), CONFIG)
    yield running
    running.stop(signal.SIGTERM)


class ApiClient(httpx.Client):
    """An HTTP client that also reads what the server appended to its incoming logs."""

    def __init__(self, server: Server) -> None:
        super().__init__(base_url=server.url, timeout=10)
        self.server = server

    def events(self) -> list[dict[str, Any]]:
        """Events appended to the incoming logs since the test started."""
        return self.server.new_events()


@pytest.fixture
def http(server: Server) -> Iterator[ApiClient]:
    with ApiClient(server) as client:
        server.mark()
        yield client


def fixture_bytes(name: str) -> bytes:
    return (TESTDATA / name).read_bytes()


def post(http: httpx.Client, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return http.post(path, content=content, **kwargs)


def error(response: httpx.Response) -> tuple[int, str]:
    body = response.json()
    assert set(body) == {"message", "error"}
    return response.status_code, body["message"]


def without_generated(event: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    """The event less `_timestamp` and the ids the expected output shows as generated ('mockeduuid')."""
    event = dict(event)
    assert TIMESTAMP.match(event.pop("_timestamp"))
    for key in ("eventn_ctx_event_id",):
        if expected.get(key) == "mockeduuid":
            assert uuid.UUID(event.pop(key))
    return event


def expected_without_generated(expected: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in with_hashed_id(expected).items() if k != "_timestamp" and v != "mockeduuid"}


# --- ping, routing --------------------------------------------------------------------------------


def test_ping(http: ApiClient) -> None:
    response = http.get("/ping")
    assert (response.status_code, response.text) == (200, "pong")


def test_unknown_path_and_wrong_method(http: ApiClient) -> None:
    assert error(http.get("/api/v2/nothing")) == (404, "Not found")
    response = http.get("/api/v1/event?token=c2stoken")
    assert error(response) == (405, "Method not allowed")
    assert response.headers["allow"] == "POST"


# --- enrichment against the EventNative vectors ---------------------------------------------------


@pytest.mark.parametrize(
    ("path", "token", "given", "expected"),
    [
        ("/api/v1/event", "c2stoken", "event_input_1.0.json", "fact_output_1.0.json"),
        ("/api/v1/event", "c2stoken", "event_input_2.0.json", "fact_output_2.0.json"),
        ("/api/v1/s2s/event", "s2stoken", "api_event_input_1.0.json", "api_fact_output_1.0.json"),
        ("/api/v1/s2s/event", "s2stoken", "api_event_input_2.0.json", "api_fact_output_2.0.json"),
        ("/api/v1/event", "c2stoken", "mobile_event_input.json", "mobile_fact_output.json"),
    ],
)
def test_one_event_is_enriched_as_eventnative(
    http: httpx.Client, path: str, token: str, given: str, expected: str
) -> None:
    response = post(http, f"{path}?token={token}", fixture_bytes(given), headers=FORWARDED)
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ok"}
    want = fixture_json(expected)
    [event] = http.events()
    assert without_generated(event, want) == expected_without_generated(want)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("mobile_events_array_input.json", "mobile_facts_array_output.json"),
        ("mobile_events_template_input.json", "mobile_facts_template_output.json"),
    ],
)
def test_array_and_template_bodies_give_one_line_per_event(http: ApiClient, given: str, expected: str) -> None:
    response = post(http, "/api/v1/event?token=c2stoken", fixture_bytes(given), headers=FORWARDED)
    assert response.status_code == 200, response.text
    events = http.events()
    wanted = fixture_json(expected)
    assert len(events) == len(wanted) == 2
    for event, want in zip(events, wanted, strict=True):
        assert without_generated(event, want) == expected_without_generated(want)


def test_source_ip_prefers_x_real_ip_then_forwarded_then_peer(http: ApiClient) -> None:
    post(http, "/api/v1/event?token=c2stoken", {"n": 1}, headers={"X-Real-IP": "1.1.1.1", **FORWARDED})
    post(http, "/api/v1/event?token=c2stoken", {"n": 2}, headers={"X-Forwarded-For": "2.2.2.2, 10.0.0.1"})
    post(http, "/api/v1/event?token=c2stoken", {"n": 3})
    assert [e["source_ip"] for e in http.events()] == ["1.1.1.1", "2.2.2.2", "127.0.0.1"]


def test_js_event_gets_user_agent_and_s2s_gets_src_api(http: ApiClient) -> None:
    post(http, "/api/v1/event?token=c2stoken", {"eventn_ctx": {"event_id": "e1"}}, headers={"User-Agent": "UA/1"})
    post(http, "/api/v1/s2s/event?token=s2stoken", {"eventn_ctx": {"event_id": "e2"}}, headers={"User-Agent": "UA/2"})
    js, s2s = http.events()
    assert js["eventn_ctx"] == {"event_id": "e1", "user_agent": "UA/1"}
    assert js["api_key"] == "c2stoken" and "src" not in js
    assert s2s["eventn_ctx"] == {"event_id": "e2"}
    assert (s2s["api_key"], s2s["src"]) == ("s2stoken", "api")


# --- auth -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "headers", "status", "message"),
    [
        ("/api/v1/event", {}, 401, "The token is not found"),
        ("/api/v1/event?token=nope", {}, 401, "The token is not found"),
        ("/api/v1/event?token=s2s-web", {}, 401, "The token is not found"),
        ("/api/v1/event?token=js-web", {}, 200, None),
        ("/api/v1/event", {"X-Auth-Token": "js-web"}, 200, None),
        ("/api/v1/event?p_anything=js-web", {}, 200, None),
        ("/api/v1/event?token=js-web", {"X-Auth-Token": "nope"}, 200, None),
        ("/api/v1/event?token=nope", {"X-Auth-Token": "js-web"}, 401, "The token is not found"),
        ("/api/v1/event?p_a=nope", {"X-Auth-Token": "js-web"}, 200, None),
        ("/api/v1/event?other=1&p_b=js-web&p_c=nope", {}, 200, None),
        ("/api.d8f7a6s?p_q1w2=js-web", {}, 200, None),
        ("/api.d8f7a6s/x/y?p_q1w2=js-web", {}, 200, None),
        ("/api.d8f7a6s?p_q1w2=nope", {}, 401, "The token is not found"),
        ("/api/v1/event?token=same-secret", {}, 200, None),
        ("/api/v1/s2s/event?token=s2s-web", {}, 200, None),
        ("/api/v1/s2s/event", {"X-Auth-Token": "s2s-web"}, 200, None),
        ("/api/v1/s2s/event?token=same-secret", {}, 200, None),
        ("/api/v1/s2s/event?token=js-web", {}, 401, "The token isn't a server token. Please use s2s integration token"),
        ("/api/v1/s2s/event?token=nope", {}, 401, "The token is not found"),
        ("/api/v1/s2s/event", {}, 401, "The token is not found"),
    ],
)
def test_token_matrix(http: ApiClient, path: str, headers: dict[str, str], status: int, message: str | None) -> None:
    response = post(http, path, {"event_type": "auth"}, headers=headers)
    if message is None:
        assert response.status_code == status == 200, response.text
        assert len(http.events()) == 1
    else:
        assert error(response) == (status, message)
        assert http.events() == []


@pytest.mark.parametrize("path", ["/api/v1/event?token=js-lonely", "/api/v1/s2s/event?token=s2s-lonely"])
def test_token_without_destination_is_422(http: ApiClient, path: str) -> None:
    response = post(http, path, {"a": 1})
    status, message = error(response)
    assert status == 422 and "lonely" in message and "destination" in message
    assert http.events() == []


def test_stream_destination_gets_the_event_in_its_queue(http: ApiClient, server: Server) -> None:
    post(http, "/api/v1/event?token=js-web", {"stream": 1})
    post(http, "/api/v1/event?token=c2stoken", {"stream": 2})  # c2s is not a token of `live`
    queued = [e["stream"] for e in server.queued_events("live") if "stream" in e]
    assert queued == [1]
    assert sorted(e["stream"] for e in http.events()) == [1, 2]  # both go to the batch destination


# --- CORS -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "origin", "allowed"),
    [
        ("js-web", "https://www.example.com", True),
        ("js-web", "https://example.com", True),
        ("js-web", "http://app.other.io", True),
        ("js-web", "https://my-partner-site.net", True),
        ("js-web", "http://exact.org", True),
        ("js-web", "https://exact.org.evil.com", False),
        ("js-web", "https://example.com.evil.net", False),
        ("js-web", "https://evil.com", False),
        ("c2stoken", "https://anything.test", True),
    ],
)
def test_cors_echoes_allowed_origins_and_still_accepts_others(
    http: httpx.Client, token: str, origin: str, allowed: bool
) -> None:
    response = post(http, f"/api/v1/event?token={token}", {"cors": origin}, headers={"Origin": origin})
    assert response.status_code == 200
    assert response.headers.get("access-control-allow-origin") == (origin if allowed else None)
    assert [e["cors"] for e in http.events()] == [origin]


def test_cors_headers_on_errors_after_authentication(http: ApiClient) -> None:
    origin = "https://www.example.com"
    response = post(http, "/api/v1/event?token=js-web", b"{bad", headers={"Origin": origin})
    assert response.status_code == 400
    assert response.headers["access-control-allow-origin"] == origin
    response = post(http, "/api/v1/event?token=nope", {}, headers={"Origin": origin})
    assert response.status_code == 401 and "access-control-allow-origin" not in response.headers


def test_no_cors_on_server_endpoints(http: ApiClient) -> None:
    response = post(http, "/api/v1/s2s/event?token=s2s-web", {}, headers={"Origin": "https://www.example.com"})
    assert response.status_code == 200 and "access-control-allow-origin" not in response.headers


@pytest.mark.parametrize(
    ("path", "origin", "echo"),
    [
        ("/api/v1/event?token=js-web", "https://www.example.com", True),
        ("/api/v1/event?token=js-web", "https://evil.com", False),
        ("/api/v1/event", "https://evil.com", True),  # no token to check yet: the POST is checked
        ("/api.x1?p_y=js-web", "https://www.example.com", True),
        ("/api/v1/s2s/event?token=s2s-web", "https://www.example.com", False),
    ],
)
def test_preflight(http: ApiClient, path: str, origin: str, echo: bool) -> None:
    response = http.options(path, headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
    assert response.status_code == 200
    assert response.headers["access-control-max-age"] == "86400"
    assert response.headers["access-control-allow-credentials"] == "true"
    assert "POST" in response.headers["access-control-allow-methods"]
    assert "x-auth-token" in response.headers["access-control-allow-headers"].lower()
    assert response.headers.get("access-control-allow-origin") == (origin if echo else None)
    assert http.events() == []


# --- bad input ------------------------------------------------------------------------------------


def test_malformed_fixture_is_400_with_parser_message(http: ApiClient) -> None:
    response = post(http, "/api/v1/event?token=c2stoken", fixture_bytes("malformed_input.json"))
    status, message = error(response)
    assert (status, message) == (400, "Failed to parse body")
    assert "line 1 column 2" in response.json()["error"]
    assert http.events() == []


def nested(depth: int) -> bytes:
    return b'{"a":' * (depth - 1) + b"{}" + b"}" * (depth - 1)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"", 400),
        (b"   ", 400),
        (b"42", 400),
        (b'"text"', 400),
        (b"null", 400),
        (b"[1, 2]", 400),
        (b'[{"a": 1}, "x"]', 400),
        (b'{"template": {"a": 1}, "events": [1]}', 400),
        (b'{"a": "\xff"}', 400),
        (b'{"a": NaN}', 400),
        (b'{"a": 1e999}', 400),
        (b'{"a": 1}{"b": 2}', 400),
        (nested(65), 400),
        (nested(64), 200),
        (b"[" + b",".join([b"1"] * 10_001) + b"]", 400),
        (b'{"a": [' + b",".join([b"1"] * 9_999) + b"]}", 200),
        (b'{"a": "' + b"x" * MAX_EVENT_SIZE + b'"}', 413),
        (b"[]", 200),
    ],
)
def test_bad_input_never_reaches_the_log(http: ApiClient, body: bytes, status: int) -> None:
    response = post(http, "/api/v1/event?token=c2stoken", body)
    assert response.status_code == status, response.text
    events = http.events()
    if status == 200:
        assert len(events) == (0 if body == b"[]" else 1)
    else:
        assert events == []
        assert response.json()["message"] in ("Failed to parse body", "Request body is too large")


def test_chunked_body_over_the_limit_is_413(http: ApiClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"a": "'
        for _ in range(MAX_EVENT_SIZE // 1024 + 1):
            yield b"x" * 1024
        yield b'"}'

    response = http.post("/api/v1/event?token=c2stoken", content=chunks())
    assert error(response) == (413, "Request body is too large")
    assert http.events() == []


def test_any_content_type_is_accepted_when_the_body_parses(http: ApiClient) -> None:
    response = post(http, "/api/v1/event?token=c2stoken", {"ct": 1}, headers={"Content-Type": "text/plain"})
    assert response.status_code == 200
    assert [e["ct"] for e in http.events()] == [1]


# --- bulk -----------------------------------------------------------------------------------------


def test_bulk_multipart_ndjson(http: ApiClient) -> None:
    ndjson = b'{"n": 1}\n\n{"n": 2, "eventn_ctx": {"event_id": "x"}}\r\n{"n": 3}'
    response = http.post("/api/v1/events/bulk?token=s2stoken", files={"file": ("events.ndjson", ndjson)})
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ok", "accepted": 3}
    events = http.events()
    assert [e["n"] for e in events] == [1, 2, 3]
    assert all(e["src"] == "api" and e["api_key"] == "s2stoken" for e in events)


def test_bulk_plain_ndjson_body(http: ApiClient) -> None:
    response = http.post("/api/v1/events/bulk", content=b'{"n": 1}\n{"n": 2}\n', headers={"X-Auth-Token": "s2stoken"})
    assert response.json() == {"status": "ok", "accepted": 2}
    assert len(http.events()) == 2


def test_bulk_with_a_bad_line_writes_nothing(http: ApiClient) -> None:
    response = http.post("/api/v1/events/bulk?token=s2stoken", files={"file": ("e.ndjson", b'{"n": 1}\n{oops}\n')})
    status, message = error(response)
    assert (status, message) == (400, "Failed to parse body")
    assert response.json()["error"].startswith("line 2:")
    assert http.events() == []


def test_bulk_needs_a_server_secret(http: ApiClient) -> None:
    response = http.post("/api/v1/events/bulk?token=c2stoken", files={"file": ("e.ndjson", b'{"n": 1}\n')})
    assert error(response) == (401, "The token isn't a server token. Please use s2s integration token")


# --- pixel ----------------------------------------------------------------------------------------


def b64(data: dict[str, Any], urlsafe: bool = False) -> str:
    raw = orjson.dumps(data)
    return (base64.urlsafe_b64encode(raw).rstrip(b"=") if urlsafe else base64.b64encode(raw)).decode()


def test_pixel_returns_a_gif_and_stores_the_event(http: ApiClient) -> None:
    response = http.get("/api/v1/p.gif", params={"token": "c2stoken", "data": b64({"px": 1})}, headers=FORWARDED)
    assert response.status_code == 200
    assert response.headers["content-type"] == "image/gif"
    assert response.content.startswith(b"GIF89a") and response.content.endswith(b";")
    assert len(response.content) == 43
    [event] = http.events()
    assert (event["px"], event["user_agent"], event["api_key"]) == (1, "Go-http-client/1.1", "c2stoken")


def test_pixel_token_inside_the_data_and_url_safe_base64(http: ApiClient) -> None:
    data = b64({"api_key": "c2stoken", "px": "?>>"}, urlsafe=True)
    response = http.get("/api/v1/p.gif", params={"data": data})
    assert response.status_code == 200
    assert [e["px"] for e in http.events()] == ["?>>"]


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"token": "c2stoken"}, 400),
        ({"token": "c2stoken", "data": "!!!not base64"}, 400),
        ({"token": "c2stoken", "data": base64.b64encode(b"{bad").decode()}, 400),
        ({"data": b64({"px": 1})}, 401),
        ({"token": "s2stoken", "data": b64({"px": 1})}, 401),
    ],
)
def test_pixel_errors(http: ApiClient, params: dict[str, str], status: int) -> None:
    assert http.get("/api/v1/p.gif", params=params).status_code == status
    assert http.events() == []


# --- admin ----------------------------------------------------------------------------------------


def test_cluster_lists_this_node(http: ApiClient) -> None:
    assert http.get(f"/api/v1/cluster?token={ADMIN}").json() == {"instances": [{"name": "node-a"}]}
    assert http.get("/api/v1/cluster", headers={"X-Admin-Token": ADMIN}).status_code == 200


@pytest.mark.parametrize("path", ["/api/v1/cluster", "/prometheus"])
@pytest.mark.parametrize("token", [None, "wrong", "c2stoken"])
def test_admin_endpoints_need_the_admin_token(http: ApiClient, path: str, token: str | None) -> None:
    response = http.get(path, params={"token": token} if token else None)
    assert error(response) == (401, "Admin token does not match")


def test_prometheus_counts_accepted_and_rejected(http: ApiClient) -> None:
    def scrape() -> str:
        response = http.get("/prometheus", headers={"X-Admin-Token": ADMIN})
        assert response.status_code == 200
        return response.text

    def value(text: str, sample: str) -> float:
        match = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
        return float(match.group(1)) if match else 0.0

    accepted = 'eventspark_events_accepted_total{token="web"}'
    rejected = 'eventspark_requests_rejected_total{status="401",token="unknown"}'
    before = scrape()
    post(http, "/api/v1/event?token=js-web", [{"a": 1}, {"a": 2}])
    post(http, "/api/v1/event?token=nope", {"a": 1})
    after = scrape()
    assert value(after, accepted) - value(before, accepted) == 2
    assert value(after, rejected) - value(before, rejected) == 1
    assert 'eventspark_request_duration_seconds_count{endpoint="/api/v1/event"}' in after
    assert 'eventspark_destination_queue_events{destination="dw",mode="batch"}' in after
    assert 'eventspark_destination_queue_events{destination="live",mode="stream"}' in after


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/events/cache?destination_ids=dw"),
        ("GET", "/api/v1/fallback?destination_ids=dw"),
        ("POST", "/api/v1/replay"),
        ("POST", "/api/v1/destinations/test"),
        ("POST", "/api/v1/templates/evaluate"),
        ("POST", "/api/v1/batch/run"),
    ],
)
def test_operator_endpoints_need_the_admin_token(http: ApiClient, method: str, path: str) -> None:
    assert error(http.request(method, path))[0] == 401
    assert error(http.request(method, path, headers={"X-Admin-Token": "not-the-admin"}))[0] == 401


def test_dry_run_needs_a_server_secret(http: ApiClient) -> None:
    path = "/api/v1/events/dry-run?destination_id=dw"
    assert error(post(http, path + "&token=c2stoken", {}))[0] == 401
