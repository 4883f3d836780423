"""The webhook destination and the HTTP family's shared behaviour, against a real local server."""

from __future__ import annotations

import base64
import email.utils
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventspark.destinations.base import PartlyDelivered
from eventspark.destinations.http.config import HttpBlock
from eventspark.destinations.http.sender import _retry_after
from eventspark.destinations.http.service import HttpRequest, Service
from eventspark.destinations.http.sink import HttpSink
from tests.http.helpers import FAST, destination, send, sink, vector
from tests.http.recorder import Recorder

TOKEN = "tok-9f8e7d6c5b4a"
SECRET_HEADER = "Bearer sk-live-0123456789abcdef"


def test_default_request_is_the_event_as_json(recorder: Recorder) -> None:
    event = vector("fact_output_1.0.json")
    adapter = sink("webhook", {"url": f"{recorder.url}/hook"})
    assert send(adapter, event) == [None]
    [got] = recorder.requests
    assert (got.method, got.path, got.query) == ("POST", "/hook", [])
    assert got.headers["content-type"] == "application/json"
    assert got.body == orjson.dumps(event, option=orjson.OPT_SORT_KEYS)
    assert orjson.loads(got.body) == event


def test_url_body_and_headers_are_templates(recorder: Recorder) -> None:
    event = vector("fact_output_2.0.json")
    adapter = sink(
        "webhook",
        {
            "url": recorder.url + "/e/{{.event_type}}?uid={{.user.anonymous_id}}&token=" + TOKEN,
            "method": "put",
            "body": '{"type": "{{.event_type}}", "at": "{{._timestamp.Format "2006-01-02"}}"}',
            "headers": {"Authorization": SECRET_HEADER, "X-Source": "{{.src}}", "Content-Type": "text/x-json"},
        },
    )
    assert send(adapter, event) == [None]
    [got] = recorder.requests
    assert got.method == "PUT"
    assert got.path == "/e/pageview"
    assert got.query == [("uid", "jg5r4o6j02"), ("token", TOKEN)]
    assert got.headers["authorization"] == SECRET_HEADER
    assert got.headers["x-source"] == "jitsu"
    assert got.headers["content-type"] == "text/x-json"
    assert got.body == b'{"type": "pageview", "at": "2020-06-16"}'


def test_json_function_embeds_values_as_go_marshals_them(recorder: Recorder) -> None:
    event = vector("fact_output_1.0.json")
    event["title"] = 'say "hi" <b>'
    adapter = sink("webhook", {"url": recorder.url, "body": '{"ctx": {{json .eventn_ctx}}, "t": {{.title | json}}}'})
    assert send(adapter, event) == [None]
    body = recorder.requests[0].body
    assert body == b'{"ctx": {"event_id":"123","user_agent":"Go-http-client/1.1"}, "t": "say \\"hi\\" \\u003cb\\u003e"}'
    assert orjson.loads(body)["t"] == event["title"]


def test_get_has_no_body_and_endpoint_overrides_the_host(recorder: Recorder) -> None:
    adapter = sink(
        "webhook", {"url": "https://hooks.example.com/in?e={{.event_type}}", "method": "GET", "endpoint": recorder.url}
    )
    assert send(adapter, {"event_type": "signup"}) == [None]
    [got] = recorder.requests
    assert (got.method, got.path, got.query, got.body) == ("GET", "/in", [("e", "signup")], b"")
    assert "content-type" not in got.headers


def test_a_refused_event_fails_alone_with_the_answer_as_reason(
    recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    recorder.answer_when(b'"n":1', 400, f'{{"error": "bad field", "echo": "{TOKEN}"}}')
    adapter = sink("webhook", {"url": recorder.url + "/h?token=" + TOKEN, "headers": {"Authorization": SECRET_HEADER}})
    outcomes = send(adapter, {"n": 1}, {"n": 2}, {"n": 3})
    assert outcomes[1:] == [None, None]
    assert outcomes[0] is not None
    assert "HTTP 400" in outcomes[0] and "bad field" in outcomes[0]
    assert TOKEN not in outcomes[0] and "***" in outcomes[0]
    assert len(recorder.requests) == 3  # a 400 is not retried
    assert TOKEN not in caplog.text and "sk-live" not in caplog.text


def test_event_values_in_the_url_are_percent_encoded(recorder: Recorder) -> None:
    adapter = sink("webhook", {"url": recorder.url + "/e/{{.event_type}}?q={{.q}}"})
    assert send(adapter, {"event_type": "покупка done", "q": "a%20b"}) == [None]
    [got] = recorder.requests
    assert got.path == "/e/%D0%BF%D0%BE%D0%BA%D1%83%D0%BF%D0%BA%D0%B0%20done"
    assert got.raw_query == "q=a%2520b"  # the value is the text "a%20b": its % is encoded too
    assert got.query == [("q", "a%20b")]


def test_redirects_are_not_followed_and_unsendable_headers_fail_alone(recorder: Recorder) -> None:
    recorder.answer(302, Location="http://elsewhere.example/steal")
    adapter = sink("webhook", {"url": recorder.url + "/h", "headers": {"X-Name": "{{.name}}"}, "concurrency": 1})
    outcomes = send(adapter, {"name": "a"}, {"name": "ok"}, {"name": "日本"})
    assert outcomes[0] is not None and "HTTP 302" in outcomes[0]
    assert outcomes[1] is None
    assert outcomes[2] is not None and "cannot send the request" in outcomes[2]
    assert [r.headers["x-name"] for r in recorder.requests] == ["a", "ok"]


def test_a_template_error_fails_only_its_event(recorder: Recorder) -> None:
    adapter = sink("webhook", {"url": recorder.url + '/{{._timestamp.Format "2006"}}'})
    outcomes = send(adapter, {"_timestamp": "2021-01-01T00:00:00Z"}, {"no": "timestamp"})
    assert outcomes[0] is None
    assert outcomes[1] is not None and outcomes[1].startswith("webhook: template:")
    assert [r.path for r in recorder.requests] == ["/2021"]


def test_429_waits_for_retry_after_then_delivers(recorder: Recorder) -> None:
    recorder.answer(429, "slow down", Retry_After="1")
    adapter = sink("webhook", {"url": recorder.url + "/h", "retry_max_sec": 2})
    started = time.monotonic()
    assert send(adapter, {"n": 1}) == [None]
    assert time.monotonic() - started >= 0.95
    assert len(recorder.requests) == 2
    assert recorder.requests[0].body == recorder.requests[1].body


def test_5xx_is_retried_with_backoff_then_left_to_the_worker(recorder: Recorder) -> None:
    recorder.answer(500, "boom", times=10)
    adapter = sink("webhook", {"url": recorder.url + "/h", "retries": 2})
    with pytest.raises(PartlyDelivered) as caught:
        send(adapter, {"n": 1})
    assert caught.value.decided == {}
    assert "HTTP 500" in str(caught.value)
    assert len(recorder.requests) == 3  # the first attempt and 2 retries


def test_a_long_retry_after_is_left_to_the_worker(recorder: Recorder) -> None:
    recorder.answer(429, Retry_After="30")
    adapter = sink("webhook", {"url": recorder.url + "/h", "retry_max_sec": 1})
    with pytest.raises(PartlyDelivered) as caught:
        send(adapter, {"n": 1})
    assert caught.value.retry_after == 30
    assert len(recorder.requests) == 1


def test_some_delivered_some_transient(recorder: Recorder) -> None:
    recorder.answer_when(b'"n":1', 503)
    adapter = sink("webhook", {"url": recorder.url + "/h"})
    with pytest.raises(PartlyDelivered) as caught:
        send(adapter, {"n": 1}, {"n": 2})
    assert caught.value.decided == {1: None}


def test_a_hanging_server_times_out(recorder: Recorder) -> None:
    recorder.hang(times=10)
    adapter = sink("webhook", {"url": recorder.url + "/h", "timeout_sec": 0.3, "retries": 1})
    started = time.monotonic()
    with pytest.raises(PartlyDelivered) as caught:
        send(adapter, {"n": 1})
    assert "timed out" in str(caught.value)
    assert time.monotonic() - started < 5
    assert len(recorder.wait_for(2, timeout=5)) == 2  # the retry may be recorded after the sink gave up on it


def test_connection_refused_is_transient() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    adapter = sink("webhook", {"url": f"http://127.0.0.1:{port}/h?token={TOKEN}", "retries": 1})
    with pytest.raises(PartlyDelivered) as caught:
        send(adapter, {"n": 1})
    assert "connection refused" in str(caught.value)
    assert TOKEN not in str(caught.value)


def test_concurrency_is_bounded(recorder: Recorder) -> None:
    recorder.hang(times=3)
    adapter = sink("webhook", {"url": recorder.url + "/h", "concurrency": 2, "timeout_sec": 0.5, "retries": 0})
    with pytest.raises(PartlyDelivered):
        send(adapter, {"n": 1}, {"n": 2}, {"n": 3})
    # two hung at once; the third starts only when one of them timed out
    assert len(recorder.requests) == 3
    first, second, third = recorder.arrivals
    assert second - first < 0.3
    assert third - first >= 0.3  # at once it would be milliseconds; arrivals are recorded, not sent, times


def test_secrets_never_in_repr_or_config_errors() -> None:
    dest = destination(
        {
            "type": "webhook",
            "webhook": {"url": f"http://h/x?token={TOKEN}", "headers": {"Authorization": SECRET_HEADER}},
        }
    )
    assert TOKEN not in repr(dest) and "sk-live" not in repr(dest)
    with pytest.raises(ValueError) as caught:
        destination({"type": "webhook", "webhook": {"url": "http://h/{{.a", "headers": {"A": SECRET_HEADER}}})
    assert "url template" in str(caught.value)


def test_config_errors_from_the_cli_never_show_secrets(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "destinations:\n  hook: {type: webhook, mode: stream, webhook: "
        f'{{url: "http://h/x?token={TOKEN}{{{{.a", headers: {{Authorization: "{SECRET_HEADER}{{{{"}}}}}}\n'
    )
    result = subprocess.run(
        [str(Path(sys.executable).parent / "eventspark"), "check", "-c", str(config)], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "destinations.hook.webhook.url: Value error, url template: line 1, column" in result.stderr
    assert "destinations.hook.webhook.headers: Value error, header Authorization template" in result.stderr
    assert TOKEN not in result.stderr + result.stdout and "sk-live" not in result.stderr + result.stdout


def test_config_refuses_batch_mode_and_bad_templates() -> None:
    with pytest.raises(ValueError, match="does not support mode 'batch'"):
        destination({"type": "webhook", "mode": "batch", "webhook": {"url": "http://h/"}})
    with pytest.raises(ValueError, match="body template"):
        destination({"type": "webhook", "webhook": {"url": "http://h/", "body": "{{if}}"}})
    with pytest.raises(ValueError, match="method"):
        destination({"type": "webhook", "webhook": {"url": "http://h/", "method": "TRACE"}})
    with pytest.raises(ValueError, match="endpoint"):
        destination({"type": "webhook", "webhook": {"url": "http://h/", "endpoint": "ftp://x"}})


# --- the review's findings: URL safety, deadlines, stopping, robustness ---------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1{{.path}}",  # a value ":PORT/x" would pick the port
        "https://api.example.com{{.p}}",  # a value ".attacker.net/" would pick the host
        "http://{{.host}}/x",
        "{{.scheme}}://h/x",
        "http://h:{{.port}}/x",
    ],
)
def test_the_url_host_and_port_must_be_written_out(url: str) -> None:
    with pytest.raises(ValueError, match=r"scheme, host and port must be written out|must start with http"):
        destination({"type": "webhook", "webhook": {"url": url}})


def test_a_url_port_out_of_range_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="port is not valid"):
        destination({"type": "webhook", "webhook": {"url": "http://127.0.0.1:99999/x"}})
    with pytest.raises(ValueError, match="port is not valid"):
        destination({"type": "webhook", "webhook": {"url": "http://h/", "endpoint": "http://h:70000"}})


def test_event_values_cannot_change_the_path_query_or_host(recorder: Recorder) -> None:
    other = Recorder().start()  # another port on the same host: must receive nothing
    try:
        port = other.url.rsplit(":", 1)[1]
        adapter = sink("webhook", {"url": recorder.url + "/e/{{.a}}?q={{.b}}&token=" + TOKEN})
        event = {"a": f":{port}/stolen/../x?y#z", "b": "1&admin=true#f@evil.example:80/"}
        assert send(adapter, event) == [None]
        [got] = recorder.requests
        assert got.path == f"/e/%3A{port}%2Fstolen%2F..%2Fx%3Fy%23z"
        assert got.query == [("q", event["b"]), ("token", TOKEN)]
        assert other.requests == []
    finally:
        other.stop()


def test_user_and_password_in_the_url_become_basic_auth(recorder: Recorder) -> None:
    host = recorder.url.removeprefix("http://")
    recorder.answer(400, "user hook-user, password p@ss:word-1234")
    adapter = sink("webhook", {"url": f"http://hook-user:p%40ss%3Aword-1234@{host}/h"})
    [reason] = send(adapter, {"n": 1})
    [got] = recorder.requests
    assert got.path == "/h"
    assert got.headers["authorization"] == "Basic " + base64.b64encode(b"hook-user:p@ss:word-1234").decode()
    assert reason is not None and "p@ss:word-1234" not in reason and "HTTP 400" in reason


def test_short_secrets_are_redacted_but_not_the_status(recorder: Recorder) -> None:
    recorder.answer(401, "bad key k3y")
    adapter = sink("amplitude", {"api_key": "k3y", "endpoint": recorder.url})
    [reason] = send(adapter, {"event_type": "x", "device_id": "d"})
    assert reason is not None and "HTTP 401" in reason and "k3y" not in reason


def test_unknown_block_keys_never_show_in_a_repr() -> None:
    dest = destination({"type": "google_analytics", "google_analytics": {"tracking_id": "UA-1-1", "api_secert": TOKEN}})
    assert TOKEN not in repr(dest) and TOKEN not in str(dest)


def trickling_server() -> tuple[socket.socket, threading.Event]:
    """A server that answers one header byte every 0.1 s, for ever: each socket read succeeds."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            while not done.wait(0.1):
                try:
                    connection.sendall(b"a")
                except OSError:
                    return

    threading.Thread(target=serve, daemon=True).start()
    return listener, done


def test_timeout_bounds_the_whole_attempt_even_when_the_answer_trickles() -> None:
    listener, done = trickling_server()
    try:
        port = listener.getsockname()[1]
        adapter = sink("webhook", {"url": f"http://127.0.0.1:{port}/h", "timeout_sec": 0.5, "retries": 0})
        started = time.monotonic()
        with pytest.raises(PartlyDelivered) as caught:
            send(adapter, {"n": 1})
        assert time.monotonic() - started < 2
        assert "timed out" in str(caught.value)
    finally:
        done.set()
        listener.close()


def test_stopping_ends_a_send_whose_requests_wait_behind_a_hanging_one(recorder: Recorder) -> None:
    recorder.hang(times=100)
    adapter = sink("webhook", {"url": recorder.url + "/h", "concurrency": 1, "timeout_sec": 0.5, "retries": 0})
    raised: list[BaseException] = []

    def run() -> None:
        try:
            adapter.send([{"n": n} for n in range(12)])
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    recorder.wait_for(1)
    started = time.monotonic()
    adapter.interrupt()
    thread.join(10)
    try:
        assert time.monotonic() - started < 1.5  # the request in flight ends with its deadline; no more start
        assert len(recorder.requests) == 1
        [exc] = raised
        assert isinstance(exc, PartlyDelivered) and exc.decided == {}
    finally:
        adapter.close()


class _Broken(Service):
    """A service with a bug for some events: the sink fails those, never the whole send."""

    name = "broken"
    batch_size = 1

    def __init__(self, url: str) -> None:
        self.url = url

    def payload(self, event: dict[str, Any]) -> Any:
        if event.get("bug") == "payload":
            raise RuntimeError("payload bug")
        return event

    def requests(self, payloads: Sequence[tuple[int, Any]]) -> Iterable[HttpRequest]:
        for position, event in payloads:
            if event.get("bug") == "requests":
                raise KeyError("requests bug")
            url = "http://[::1" if event.get("bug") == "url" else self.url
            yield HttpRequest("POST", url, (position,), b"{}")


def test_a_bug_for_one_event_fails_that_event_only(recorder: Recorder) -> None:
    block = HttpBlock(**FAST)
    adapter = HttpSink("dst", _Broken(recorder.url + "/h"), block)
    try:
        outcomes = adapter.send([{"bug": "payload"}, {"ok": 1}, {"bug": "requests"}, {"bug": "url"}])
    finally:
        adapter.close()
    assert outcomes[1] is None
    assert outcomes[0] is not None and "payload bug" in outcomes[0]
    assert outcomes[2] is not None and "requests bug" in outcomes[2]
    assert outcomes[3] is not None and "cannot send the request" in outcomes[3]
    assert len(recorder.requests) == 1


@pytest.mark.parametrize("type_", ["amplitude", "facebook", "google_analytics", "webhook"])
def test_an_event_too_deep_for_json_fails_alone(recorder: Recorder, type_: str) -> None:
    deep: dict[str, Any] = {}
    level = deep
    for _ in range(300):
        level["a"] = {}
        level = level["a"]
    blocks: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "amplitude": ({"api_key": TOKEN}, {"event_type": "x", "device_id": "d"}),
        "facebook": ({"pixel_id": "1", "access_token": TOKEN}, {"event_name": "x"}),
        "google_analytics": ({"measurement_id": "G-1", "api_secret": TOKEN}, {"client_id": "c", "event_name": "x"}),
        "webhook": ({"url": recorder.url + "/h"}, {}),
    }
    block, good = blocks[type_]
    bad = {**good, "deep": deep} if type_ != "google_analytics" else {**good, "params": {"deep": deep}}
    adapter = sink(type_, {**block, "endpoint": recorder.url} if type_ != "webhook" else block)
    outcomes = send(adapter, bad, good)
    assert outcomes[0] is not None and "JSON" in outcomes[0]
    assert outcomes[1] is None


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("30", 30.0),
        ("1e9", 3600.0),
        ("99999999999999999999999", 3600.0),
        ("nan", 0.0),
        ("inf", 0.0),
        ("-3", 0.0),
        ("soon", 0.0),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
        ("Wed, 21 Oct 2099 07:28:00 GMT", 3600.0),
    ],
)
def test_retry_after_values(header: str, expected: float) -> None:
    assert _retry_after(header) == expected


def test_retry_after_as_an_http_date(recorder: Recorder) -> None:
    soon = time.time() + 30
    assert 28 <= _retry_after(email.utils.formatdate(soon, usegmt=True)) <= 30
    minus_zero = email.utils.formatdate(soon).rsplit(" ", 1)[0] + " -0000"  # "-0000": UTC as well
    assert 28 <= _retry_after(minus_zero) <= 30
    due = time.time() + 2.5
    recorder.answer(429, Retry_After=email.utils.formatdate(due, usegmt=True))
    adapter = sink("webhook", {"url": recorder.url + "/h", "retry_max_sec": 4})
    assert send(adapter, {"n": 1}) == [None]
    # Waited for the date (1 s resolution: the second it names began up to 1 s before `due`).
    assert time.time() >= int(due) and recorder.arrivals[1] - recorder.arrivals[0] >= 0.4
