"""HTTP destinations driven by the stream worker (queue → chain → requests → ack), and end to end
through `eventspark serve`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from eventspark.stream.queue import queue_dir
from eventspark.stream.worker import StreamSettings
from tests.collector import conftest as collector_fixtures
from tests.http.helpers import FAST
from tests.http.recorder import Recorder
from tests.stream.helpers import Harness, event, make_config
from tests.stream.warehouses import S2S_PATH, queued_bytes, serve_config

run_server = collector_fixtures.run_server

TOKEN = "hook-secret-5e6f7a8b9c"
SKIP_TEMPLATE = '{{if eq .event_type "heartbeat"}}{{else}}events{{end}}'


def webhook(recorder: Recorder, **block: Any) -> dict[str, Any]:
    return {
        "type": "webhook",
        "mode": "stream",
        "webhook": {**FAST, "url": f"{recorder.url}/hook?token={TOKEN}", **block},
        "data_layout": {
            "table_name_template": SKIP_TEMPLATE,
            "mappings": {"keep_unmapped": True, "fields": [{"src": "/n", "dst": "/number", "action": "move"}]},
        },
    }


def test_worker_sends_mapped_events_and_records_failures(tmp_path: Path, recorder: Recorder) -> None:
    loaded = make_config(tmp_path, {"hook": webhook(recorder, concurrency=1)})
    harness = Harness.build(loaded, "hook")
    try:
        recorder.answer(400, f"no thanks {TOKEN}")  # the first request
        harness.append(event(1), event(2, event_type="heartbeat"), event(3, nested={"a": {"b": 1}}))
        harness.drain()
        bodies = [orjson.loads(r.body) for r in recorder.requests]
        assert [b["number"] for b in bodies] == [1, 3]  # mapped; the heartbeat skipped by the template
        assert bodies[1]["nested"] == {"a": {"b": 1}}  # an object, not flattened
        assert "n" not in bodies[1]
        failed = harness.failed()
        assert len(failed) == 1
        assert failed[0]["event"]["n"] == 1  # the event as queued
        assert "HTTP 400" in failed[0]["error"] and TOKEN not in failed[0]["error"]
        assert failed[0]["event_id"] == "e000001"
        assert [a["n"] for a in harness.archived()] == [3]
        assert queued_bytes(queue_dir(harness.events_dir, "hook")) == 0
        assert (harness.worker.delivered, harness.worker.failed, harness.worker.skipped) == (1, 1, 1)
    finally:
        harness.close()


def test_worker_retries_only_the_undelivered(tmp_path: Path, recorder: Recorder) -> None:
    loaded = make_config(tmp_path, {"hook": webhook(recorder, concurrency=1, retries=1)})
    harness = Harness.build(loaded, "hook")
    try:
        recorder.answer(503, times=2)  # event 1's two attempts; event 2 is delivered
        harness.append(event(1), event(2))
        harness.drain()
        numbers = [orjson.loads(r.body)["number"] for r in recorder.requests]
        assert numbers == [1, 1, 2, 1]  # the worker sends event 1 again, not event 2
        assert harness.failed() == []
        assert sorted(a["n"] for a in harness.archived()) == [1, 2]
        assert queued_bytes(queue_dir(harness.events_dir, "hook")) == 0
    finally:
        harness.close()


def test_stopping_cuts_retry_waits_short_and_keeps_the_events(tmp_path: Path, recorder: Recorder) -> None:
    recorder.answer(503, times=1000)
    loaded = make_config(tmp_path, {"hook": webhook(recorder, retries=5, retry_min_sec=3, retry_max_sec=3)})
    harness = Harness.build(loaded, "hook")
    harness.worker.close()  # the harness opened it: run it on its own thread instead
    try:
        harness.append(event(1))
        harness.worker.start()
        recorder.wait_for(1)
        started = time.monotonic()
        harness.worker.stop(timeout=10)
        assert time.monotonic() - started < 2  # not 5 retries × 3 s
        assert harness.failed() == [] and harness.archived() == []
        assert queued_bytes(queue_dir(harness.events_dir, "hook")) > 0  # still queued
    finally:
        harness.writer.close()


def test_serve_delivers_posted_events_to_the_webhook(run_server: Any, recorder: Recorder) -> None:
    recorder.answer(429, Retry_After="1")  # the first request: the worker waits and sends again
    server = run_server(serve_config({"hook": webhook(recorder, headers={"Authorization": f"Bearer {TOKEN}"})}))
    with httpx.Client(base_url=server.url, timeout=5) as client:
        for n in range(5):
            assert (
                client.post(
                    S2S_PATH, json={"event_type": "pageview", "n": n, "eventn_ctx": {"event_id": f"e{n}"}}
                ).status_code
                == 200
            )
        assert client.post(S2S_PATH, json={"event_type": "heartbeat", "n": 99}).status_code == 200
    # Six requests: the 429'd one is sent again a second later, possibly after the other four
    # (the worker sends concurrently), so every number can arrive before the sixth request.
    recorder.wait_for(6)
    numbers = sorted({orjson.loads(r.body)["number"] for r in recorder.requests if r.body})
    assert numbers == [0, 1, 2, 3, 4]
    got = recorder.requests[-1]
    assert got.method == "POST" and got.path == "/hook" and got.query == [("token", TOKEN)]
    assert got.headers["authorization"] == f"Bearer {TOKEN}"
    body = orjson.loads(got.body)
    assert body["src"] == "api" and "source_ip" in body  # enriched by the collector
    time.sleep(0.5)
    assert len(recorder.requests) == 6  # one 429, answered again; the heartbeat never sent
    assert not (server.events_dir / "failed").exists() or not any((server.events_dir / "failed").iterdir())
    assert TOKEN not in server.text()
    assert "Traceback" not in server.text()


SERVICES = {
    "amplitude": (
        {"api_key": TOKEN},
        [
            {"src": "/event_type", "dst": "/event_type", "action": "move"},
            {"src": "/eventn_ctx/event_id", "dst": "/device_id", "action": "move"},
        ],
        lambda r: [e["device_id"] for e in orjson.loads(r.body)["events"]],
    ),
    "facebook": (
        {"pixel_id": "42", "access_token": TOKEN},
        [
            {"src": "/event_type", "dst": "/event_name", "action": "move"},
            {"src": "/eventn_ctx/event_id", "dst": "/event_id", "action": "move"},
        ],
        lambda r: [e["event_id"] for e in orjson.loads(r.body)["data"]],
    ),
    "google_analytics": (
        {"measurement_id": "G-1", "api_secret": TOKEN},
        [
            {"src": "/event_type", "dst": "/event_name", "action": "move"},
            {"src": "/eventn_ctx/event_id", "dst": "/client_id", "action": "move"},
        ],
        lambda r: [orjson.loads(r.body)["client_id"]] * len(orjson.loads(r.body)["events"]),
    ),
}


@pytest.mark.parametrize("type_", sorted(SERVICES))
def test_serve_delivers_to_each_service(run_server: Any, recorder: Recorder, type_: str) -> None:
    block, fields, ids_of = SERVICES[type_]
    dest = {
        "type": type_,
        "mode": "stream",
        type_: {**FAST, "endpoint": recorder.url, **block},
        "data_layout": {"mappings": {"keep_unmapped": False, "fields": fields}},
    }
    server = run_server(serve_config({"svc": dest}))
    with httpx.Client(base_url=server.url, timeout=5) as client:
        for n in range(3):
            assert (
                client.post(S2S_PATH, json={"event_type": "signup", "eventn_ctx": {"event_id": f"e{n}"}}).status_code
                == 200
            )
    deadline = time.monotonic() + 30
    while sorted(i for r in recorder.requests for i in ids_of(r)) != ["e0", "e1", "e2"]:
        assert time.monotonic() < deadline, [r.body for r in recorder.requests]
        time.sleep(0.1)
    assert TOKEN not in server.text() and "Traceback" not in server.text()


def test_worker_honours_a_retry_after_longer_than_its_retry_max(tmp_path: Path, recorder: Recorder) -> None:
    # The worker's own back-off is capped at 0.2 s here (60 s by default); the service asks for 3 s.
    settings = StreamSettings(batch_wait_ms=20, retry_min_sec=0.1, retry_max_sec=0.2, poll_ms=5)
    recorder.answer(429, "slow down", Retry_After="3")
    loaded = make_config(tmp_path, {"hook": webhook(recorder, retries=0)})
    harness = Harness.build(loaded, "hook", settings)
    try:
        harness.append(event(1))
        harness.drain()
        assert len(recorder.requests) == 2
        assert recorder.arrivals[1] - recorder.arrivals[0] >= 2.9
        assert [a["n"] for a in harness.archived()] == [1] and harness.failed() == []
    finally:
        harness.close()
