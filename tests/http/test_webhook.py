"""The webhook destination and the HTTP family's shared behaviour, against a real local server."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from eventspark.destinations.base import PartlyDelivered
from tests.http.helpers import destination, send, sink, vector
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
    recorder.answer(400, f'{{"error": "bad field", "echo": "{TOKEN}"}}', times=1)
    adapter = sink("webhook", {"url": recorder.url + "/h?token=" + TOKEN, "headers": {"Authorization": SECRET_HEADER}})
    # concurrency 1: the first request gets the 400
    adapter.block.concurrency = 1
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
    assert got.raw_query == "q=a%20b"


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
    recorder.answer(503, times=3)  # the first event's three attempts (concurrency 1)
    adapter = sink("webhook", {"url": recorder.url + "/h", "concurrency": 1})
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
    assert len(recorder.requests) == 2


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
    assert third - first >= 0.45


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
