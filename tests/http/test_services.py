"""Amplitude, Facebook Conversions API and Google Analytics (Universal Analytics and GA4): the
exact requests for EventNative's test vectors (after the mapping step, as EventNative sent them),
batching, and refusals, against a real local server."""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl

import orjson
import pytest

from eventspark.destinations.base import PartlyDelivered
from tests.http.helpers import destination, send, sink, vector
from tests.http.recorder import Recorder

API_KEY = "amp-key-1234567890"
ACCESS_TOKEN = "EAAB-fb-token-abcdef123456"
API_SECRET = "ga4-secret-zyxwv98765"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --- Amplitude -------------------------------------------------------------------------------------


def amplitude_event(n: int) -> dict[str, Any]:
    """fact_output_2.0.json as an EventNative mapping made it an Amplitude event."""
    source = vector("fact_output_2.0.json")
    return {
        "event_type": source["event_type"],
        "device_id": source["user"]["anonymous_id"],
        "insert_id": f"{source['eventn_ctx_event_id']}-{n}",
        "ip": source["source_ip"],
        "event_properties": {"url": source["url"], "click_id": source["click_id"]},
    }


def test_amplitude_batches_events_with_the_api_key(recorder: Recorder) -> None:
    adapter = sink("amplitude", {"api_key": API_KEY, "endpoint": recorder.url})
    events = [amplitude_event(n) for n in range(150)]
    assert send(adapter, *events) == [None] * 150
    assert [(r.method, r.path) for r in recorder.requests] == [("POST", "/2/httpapi")] * 2
    bodies = [orjson.loads(r.body) for r in recorder.requests]
    assert all(b["api_key"] == API_KEY for b in bodies)
    assert sorted(len(b["events"]) for b in bodies) == [50, 100]
    sent = sorted((e for b in bodies for e in b["events"]), key=lambda e: int(e["insert_id"].rsplit("-", 1)[1]))
    assert sent == events
    first = next(r for r in recorder.requests if len(orjson.loads(r.body)["events"]) == 100)
    assert first.body.startswith(b'{"api_key":"' + API_KEY.encode() + b'","events":[{"device_id":"jg5r4o6j02",')
    assert first.headers["content-type"] == "application/json"


def test_amplitude_full_url_endpoint_as_eventnative(recorder: Recorder) -> None:
    adapter = sink("amplitude", {"api_key": API_KEY, "endpoint": f"{recorder.url}/eu/2/httpapi"})
    assert send(adapter, amplitude_event(1)) == [None]
    assert recorder.requests[0].path == "/eu/2/httpapi"


def test_amplitude_400_splits_the_batch_to_fail_only_the_bad_event(
    recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    events = [amplitude_event(n) for n in range(4)]
    # any request holding event 3 is refused, with a body that does not say which event is bad
    recorder.answer_when(events[3]["insert_id"], 400, f'{{"code":400,"error":"Invalid event 3","api_key":"{API_KEY}"}}')
    adapter = sink("amplitude", {"api_key": API_KEY, "endpoint": recorder.url})
    outcomes = send(adapter, *events)
    assert outcomes[:3] == [None, None, None]
    assert outcomes[3] is not None and "Invalid event 3" in outcomes[3] and API_KEY not in outcomes[3]
    assert sorted(len(orjson.loads(r.body)["events"]) for r in recorder.requests) == [1, 1, 2, 2, 4]
    assert API_KEY not in caplog.text


def test_a_refusal_of_the_request_itself_fails_the_batch_without_splitting(recorder: Recorder) -> None:
    recorder.answer(401, '{"error":"Invalid API key"}')
    adapter = sink("amplitude", {"api_key": API_KEY, "endpoint": recorder.url})
    outcomes = send(adapter, *(amplitude_event(n) for n in range(10)))
    assert len(recorder.requests) == 1
    assert len(set(outcomes)) == 1 and outcomes[0] is not None and "HTTP 401" in outcomes[0]


def test_amplitude_refuses_events_without_type_or_user(recorder: Recorder) -> None:
    adapter = sink("amplitude", {"api_key": API_KEY, "endpoint": recorder.url})
    outcomes = send(adapter, {"device_id": "d"}, {"event_type": "x"}, amplitude_event(1))
    assert outcomes[0] is not None and "event_type" in outcomes[0]
    assert outcomes[1] is not None and "device_id" in outcomes[1]
    assert outcomes[2] is None
    assert len(orjson.loads(recorder.requests[0].body)["events"]) == 1


def test_amplitude_config_needs_the_key() -> None:
    with pytest.raises(ValueError, match="api_key"):
        destination({"type": "amplitude", "amplitude": {"api_key": ""}})
    assert API_KEY not in repr(destination({"type": "amplitude", "amplitude": {"api_key": API_KEY}}))


# --- Facebook --------------------------------------------------------------------------------------


def facebook_event(**extra: Any) -> dict[str, Any]:
    """fact_output_2.0.json as an EventNative mapping made it a Conversions API event."""
    source = vector("fact_output_2.0.json")
    return {
        "_timestamp": source["_timestamp"],
        "event_name": source["event_type"],
        "event_source_url": source["url"],
        "user_data": {
            "client_ip_address": source["source_ip"],
            "client_user_agent": source["user_agent"],
            "em": "John.Doe@example.com",
            "fn": "john",
            "zp": 12345,
        },
        **extra,
    }


def test_facebook_request_as_eventnative(recorder: Recorder) -> None:
    adapter = sink("facebook", {"pixel_id": "123456", "access_token": ACCESS_TOKEN, "endpoint": recorder.url})
    assert send(adapter, facebook_event()) == [None]
    [got] = recorder.requests
    assert (got.method, got.path) == ("POST", "/v11.0/123456/events")
    assert got.query == [("access_token", ACCESS_TOKEN), ("locale", "en_EN")]
    assert orjson.loads(got.body) == {
        "data": [
            {
                "action_source": "website",
                "event_name": "PageView",
                "event_source_url": "http://localhost:61006/test-case/embed.html?gclid=1",
                "event_time": 1592348400,  # 2020-06-16T23:00:00Z
                "user_data": {
                    "client_ip_address": "95.82.232.185",
                    "client_user_agent": "Go-http-client/1.1",
                    "em": sha("john.doe@example.com"),  # normalised first (EventNative did not)
                    "fn": sha("john"),
                    "zp": sha("12345"),
                },
            }
        ]
    }
    assert got.body.startswith(b'{"data":[{"action_source":"website","event_name":"PageView",')


def test_facebook_groups_by_test_event_code_and_refuses_events_without_name(recorder: Recorder) -> None:
    adapter = sink(
        "facebook", {"pixel_id": "42", "access_token": ACCESS_TOKEN, "endpoint": recorder.url, "api_version": "v21.0"}
    )
    events = [
        facebook_event(test_event_code="TEST1"),
        facebook_event(event_name="signup", action_source="app"),
        facebook_event(test_event_code="TEST1", event_name="conversion"),
        {"user_data": {}},
    ]
    outcomes = send(adapter, *events)
    assert outcomes[:3] == [None, None, None]
    assert outcomes[3] is not None and "event_name" in outcomes[3]
    bodies = sorted((orjson.loads(r.body) for r in recorder.requests), key=lambda b: len(b["data"]))
    assert [r.path for r in recorder.requests] == ["/v21.0/42/events"] * 2
    assert [(d["event_name"], d["action_source"]) for d in bodies[0]["data"]] == [("CompleteRegistration", "app")]
    assert "test_event_code" not in bodies[0]
    assert bodies[1]["test_event_code"] == "TEST1"
    assert [d["event_name"] for d in bodies[1]["data"]] == ["PageView", "Purchase"]
    assert all("test_event_code" not in d for d in bodies[1]["data"])


def test_facebook_error_reason_hides_the_token(recorder: Recorder) -> None:
    recorder.answer(400, f'{{"error":{{"message":"Invalid token {ACCESS_TOKEN}","code":190}}}}')
    adapter = sink("facebook", {"pixel_id": "42", "access_token": ACCESS_TOKEN, "endpoint": recorder.url})
    [reason] = send(adapter, facebook_event())
    assert reason is not None and "code" in reason and "190" in reason
    assert ACCESS_TOKEN not in reason


# --- Google Analytics ------------------------------------------------------------------------------


def ga_event(**extra: Any) -> dict[str, Any]:
    """fact_output_2.0.json as an EventNative mapping made it a Measurement Protocol hit."""
    source = vector("fact_output_2.0.json")
    return {
        "t": source["event_type"],
        "cid": source["user"]["anonymous_id"],
        "uip": source["source_ip"],
        "ua": source["user_agent"],
        "dl": source["url"],
        "dp": source["doc_path"],
        "sr": source["screen_resolution"],
        "ul": source["user_language"],
        **extra,
    }


def test_universal_analytics_hit_as_eventnative(recorder: Recorder) -> None:
    adapter = sink("google_analytics", {"tracking_id": "UA-12345-1", "endpoint": recorder.url})
    assert send(adapter, ga_event(ev=5, ni=True)) == [None]
    [got] = recorder.requests
    assert (got.method, got.path, got.body) == ("GET", "/collect", b"")
    assert got.raw_query == (
        "cid=jg5r4o6j02&dl=http%3A%2F%2Flocalhost%3A61006%2Ftest-case%2Fembed.html%3Fgclid%3D1"
        "&dp=%2Ftest-case%2Fembed.html&ev=5&ni=true&sr=1280x720&t=pageview&tid=UA-12345-1"
        "&ua=Go-http-client%2F1.1&uip=95.82.232.185&ul=en-US&v=1"
    )


def test_universal_analytics_maps_hit_types_and_batches(recorder: Recorder) -> None:
    adapter = sink("google_analytics", {"tracking_id": "UA-1-1", "endpoint": recorder.url})
    types = ["conversion", "signup", "screenview", "pageview"] * 6  # 24 hits: a batch of 20, one of 4
    assert send(adapter, *(ga_event(t=t) for t in types)) == [None] * 24
    assert sorted((r.method, r.path) for r in recorder.requests) == [("POST", "/batch")] * 2
    hits = [dict(parse_qsl(line)) for r in recorder.requests for line in r.body.decode().split("\n")]
    assert sorted(len(r.body.decode().split("\n")) for r in recorder.requests) == [4, 20]
    assert sorted(h["t"] for h in hits) == sorted(
        {"conversion": "transaction", "signup": "event"}.get(t, t) for t in types
    )
    assert all(h["tid"] == "UA-1-1" and h["v"] == "1" for h in hits)


def test_ga4_measurement_protocol(recorder: Recorder) -> None:
    adapter = sink(
        "google_analytics", {"measurement_id": "G-ABC123", "api_secret": API_SECRET, "endpoint": recorder.url}
    )
    source = vector("fact_output_2.0.json")
    other = {**source, "user": {"anonymous_id": "other", "id": "u1"}, "event_type": "signup"}
    outcomes = send(adapter, source, source, other, {**source, "event_type": "bad name!"})
    assert outcomes[:3] == [None, None, None]
    assert outcomes[3] is not None and "GA4 name" in outcomes[3]
    assert {(r.method, r.path) for r in recorder.requests} == {("POST", "/mp/collect")}
    assert recorder.requests[0].query == [("measurement_id", "G-ABC123"), ("api_secret", API_SECRET)]
    bodies = sorted((orjson.loads(r.body) for r in recorder.requests), key=lambda b: b["client_id"])
    # page_title and referer are empty in the vector: empty values are left out
    assert bodies == [
        {  # no timestamp_micros: the vector's 2020 time is older than GA4's 72 hours
            "client_id": "jg5r4o6j02",
            "events": [{"name": "page_view", "params": {"page_location": source["url"]}}] * 2,
        },
        {
            "client_id": "other",
            "user_id": "u1",
            "events": [{"name": "signup", "params": {"page_location": source["url"]}}],
        },
    ]


def test_ga4_5xx_keeps_events_for_the_worker_and_hides_the_secret(recorder: Recorder) -> None:
    recorder.answer(500, f"internal {API_SECRET}", times=10)
    adapter = sink("google_analytics", {"measurement_id": "G-1", "api_secret": API_SECRET, "endpoint": recorder.url})
    with pytest.raises(PartlyDelivered) as caught:
        send(adapter, vector("fact_output_2.0.json"))
    assert API_SECRET not in str(caught.value)


def test_google_analytics_config_needs_one_protocol() -> None:
    with pytest.raises(ValueError, match="either tracking_id"):
        destination({"type": "google_analytics", "google_analytics": {}})
    with pytest.raises(ValueError, match="either tracking_id"):
        destination(
            {"type": "google_analytics", "google_analytics": {"tracking_id": "UA-1-1", "measurement_id": "G-1"}}
        )
    with pytest.raises(ValueError, match="both measurement_id and api_secret"):
        destination({"type": "google_analytics", "google_analytics": {"measurement_id": "G-1"}})


# --- the review's findings -------------------------------------------------------------------------


def test_amplitude_400_naming_bad_events_fails_only_those(recorder: Recorder) -> None:
    events = [amplitude_event(n) for n in range(5)]
    answer = {
        "code": 400,
        "error": "Request missing required field",
        "events_with_invalid_fields": {"time": [1, 3]},
        "events_with_missing_fields": {"event_type": [3], "user_id": [99]},
    }
    recorder.answer(400, orjson.dumps(answer))
    adapter = sink("amplitude", {"api_key": API_KEY, "endpoint": recorder.url})
    outcomes = send(adapter, *events)
    assert [o is None for o in outcomes] == [True, False, True, False, True]
    assert outcomes[1] is not None and "invalid field time" in outcomes[1]
    assert outcomes[3] is not None and "invalid field time" in outcomes[3] and "missing field event_type" in outcomes[3]
    resent = orjson.loads(recorder.requests[1].body)["events"]
    assert [e["insert_id"] for e in resent] == [events[i]["insert_id"] for i in (0, 2, 4)]
    assert len(recorder.requests) == 2  # not 2n-1 requests


def test_amplitude_invalid_api_key_fails_the_request_without_splitting(recorder: Recorder) -> None:
    recorder.answer_when(b"api_key", 400, '{"code":400,"error":"Invalid API key: ' + API_KEY + '"}')
    adapter = sink("amplitude", {"api_key": API_KEY, "endpoint": recorder.url})
    outcomes = send(adapter, *(amplitude_event(n) for n in range(8)))
    assert len(recorder.requests) == 1
    assert len(set(outcomes)) == 1 and outcomes[0] is not None and "Invalid API key" in outcomes[0]
    assert API_KEY not in outcomes[0]


def test_amplitude_and_facebook_default_their_dedup_id_to_the_event_id(recorder: Recorder) -> None:
    amplitude = sink("amplitude", {"api_key": API_KEY, "endpoint": recorder.url})
    event = {"event_type": "x", "device_id": "d", "eventn_ctx_event_id": "ev-1"}
    assert send(amplitude, event, {**event, "insert_id": "mine"}, {"event_type": "x", "user_id": "u"}) == [None] * 3
    sent = orjson.loads(recorder.requests[0].body)["events"]
    assert [e.get("insert_id") for e in sent] == ["ev-1", "mine", None]
    facebook = sink("facebook", {"pixel_id": "1", "access_token": ACCESS_TOKEN, "endpoint": recorder.url})
    assert send(facebook, {"event_name": "x", "eventn_ctx": {"event_id": "ev-2"}}) == [None]
    assert orjson.loads(recorder.requests[1].body)["data"][0]["event_id"] == "ev-2"


def test_facebook_normalises_before_hashing(recorder: Recorder) -> None:
    adapter = sink("facebook", {"pixel_id": "1", "access_token": ACCESS_TOKEN, "endpoint": recorder.url})
    hashed = sha("already@example.com")
    user = {
        "em": [" John@Example.COM ", hashed.upper()],
        "ph": "+1 (555) 123-4567",
        "fn": ["A", " b "],
        "ct": "New York",
        "external_id": "e-1",
    }
    assert send(adapter, {"event_name": "x", "user_data": user}) == [None]
    got = orjson.loads(recorder.requests[0].body)["data"][0]["user_data"]
    assert got == {
        "em": [sha("john@example.com"), hashed],
        "ph": sha("15551234567"),
        "fn": [sha("a"), sha("b")],
        "ct": sha("newyork"),
        "external_id": "e-1",
    }


def test_facebook_413_splits_to_fail_only_the_large_event(recorder: Recorder) -> None:
    recorder.answer_when(b"TOO-LARGE", 413, "Request Entity Too Large")
    adapter = sink("facebook", {"pixel_id": "1", "access_token": ACCESS_TOKEN, "endpoint": recorder.url})
    events = [facebook_event(event_id=f"e{n}") for n in range(6)]
    events[4]["custom_data"] = {"blob": "TOO-LARGE"}
    outcomes = send(adapter, *events)
    assert [o is None for o in outcomes] == [True, True, True, True, False, True]
    assert outcomes[4] is not None and "HTTP 413" in outcomes[4]
    delivered = [
        d["event_id"] for r in recorder.requests if b"TOO-LARGE" not in r.body for d in orjson.loads(r.body)["data"]
    ]
    assert sorted(delivered) == ["e0", "e1", "e2", "e3", "e5"]


def test_universal_analytics_413_splits_the_batch(recorder: Recorder) -> None:
    recorder.answer_when(b"TOO-LARGE", 413)
    adapter = sink("google_analytics", {"tracking_id": "UA-1-1", "endpoint": recorder.url})
    events = [ga_event(t="event", ea=f"e{n}") for n in range(8)]
    events[2]["el"] = "TOO-LARGE"
    outcomes = send(adapter, *events)
    assert [o is None for o in outcomes] == [True, True, False, True, True, True, True, True]
    delivered = [
        dict(parse_qsl(line))["ea"]
        for r in recorder.requests
        if b"TOO-LARGE" not in r.body + r.raw_query.encode()
        for line in (r.body.decode().split("\n") if r.method == "POST" else [r.raw_query])
    ]
    assert sorted(delivered) == sorted(f"e{n}" for n in range(8) if n != 2)


def test_universal_analytics_bounds_batches_and_long_hits_and_keeps_its_tracking_id(recorder: Recorder) -> None:
    adapter = sink("google_analytics", {"tracking_id": "UA-1-1", "endpoint": recorder.url, "concurrency": 1})
    hits = [ga_event(t="event", ea="x" * 7000, tid="UA-666-1", v="2") for _ in range(5)]
    assert send(adapter, *hits) == [None] * 5
    batches = [r for r in recorder.requests if r.path == "/batch"]
    assert [len(r.body.split(b"\n")) for r in batches] == [2, 2]  # 16 KB at most per batch
    assert all(len(r.body) <= 16 * 1024 for r in batches)
    [single] = [r for r in recorder.requests if r.path == "/collect"]
    assert (single.method, single.raw_query) == ("POST", "")  # 7 KB: too long for a URL
    for line in [*(line for r in batches for line in r.body.decode().split("\n")), single.body.decode()]:
        pairs = parse_qsl(line)
        assert [v for k, v in pairs if k == "tid"] == ["UA-1-1"] and [v for k, v in pairs if k == "v"] == ["1"]
    recorder.requests.clear()
    assert send(adapter, ga_event(t="event", tid="UA-666-1")) == [None]
    [short] = recorder.requests
    assert short.method == "GET" and dict(short.query)["tid"] == "UA-1-1"


def test_ga4_refuses_names_it_would_drop_and_keeps_recent_timestamps(recorder: Recorder) -> None:
    adapter = sink("google_analytics", {"measurement_id": "G-1", "api_secret": API_SECRET, "endpoint": recorder.url})
    now = datetime.now(UTC)
    recent = now.isoformat().replace("+00:00", "Z")
    base = {"client_id": "c1", "_timestamp": recent}
    events = [
        {**base, "event_name": "purchase"},
        {**base, "event_name": "google_thing"},
        {**base, "event_name": "session_start"},
        {**base, "event_name": "x" * 41},
        {**base, "event_name": "ok", "params": {"firebase_x": 1}},
        {**base, "event_name": "ok", "params": {f"p{n}": n for n in range(26)}},
        {**base, "event_name": "ok", "params": {"bad name": 1}},
    ]
    outcomes = send(adapter, *events)
    assert outcomes[0] is None
    assert outcomes[1] is not None and "reserved" in outcomes[1]
    assert outcomes[2] is not None and "reserved" in outcomes[2]
    assert outcomes[3] is not None and "GA4 name" in outcomes[3]
    assert outcomes[4] is not None and "reserved" in outcomes[4]
    assert outcomes[5] is not None and "25 at most" in outcomes[5]
    assert outcomes[6] is not None and "GA4 name" in outcomes[6]
    [got] = recorder.requests
    body = orjson.loads(got.body)
    assert body["timestamp_micros"] == int(datetime.fromisoformat(recent).timestamp() * 1_000_000)
    assert body["events"] == [{"name": "purchase", "params": {}}]


def test_ga4_400_splits_the_batch(recorder: Recorder) -> None:
    recorder.answer_when(b"BAD", 400)
    adapter = sink("google_analytics", {"measurement_id": "G-1", "api_secret": API_SECRET, "endpoint": recorder.url})
    events = [{"client_id": "c", "event_name": "e", "params": {"n": f"n{n}"}} for n in range(4)]
    events[1]["params"]["n"] = "BAD"
    outcomes = send(adapter, *events)
    assert [o is None for o in outcomes] == [True, False, True, True]
