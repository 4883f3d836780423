"""EventNative's input vector `event_input_2.0.json`, enriched by the collector's own context
enrichment (`steps.context.enrich_context`, with the vectors' fixed clock, address and id: it
then equals `fact_output_2.0.json`), through a stream worker with the mappings the docs pages
show, to the exact request each service gets: the docs' examples are these requests."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from eventspark.steps.context import enrich_context
from tests.http.helpers import FAST, vector
from tests.http.recorder import Received, Recorder
from tests.stream.helpers import Harness, make_config
from tests.vectors import VECTOR_IP, VECTOR_USER_AGENT, with_hashed_id


def move(src: str, dst: str) -> dict[str, str]:
    return {"src": src, "dst": dst, "action": "move"}


VECTOR_NOW = datetime(2020, 6, 16, 23, 0, 0, tzinfo=UTC)


def collected(name: str = "event_input_2.0.json") -> dict[str, Any]:
    """An input vector as the collector's JS endpoint enriches it (the vectors' README values)."""
    return enrich_context(
        vector(name),
        token="c2stoken",
        source_ip=VECTOR_IP,
        user_agent=VECTOR_USER_AGENT,
        server_side=False,
        now=VECTOR_NOW,
        new_id=lambda: "mockeduuid",
    )


def test_the_input_is_enriched_as_eventnative() -> None:
    assert collected() == with_hashed_id(vector("fact_output_2.0.json"))  # the vector plus what 1.41 adds


def deliver(tmp_path: Path, recorder: Recorder, type_: str, block: dict[str, Any], fields: list[Any]) -> Received:
    layout = {"mappings": {"keep_unmapped": False, "fields": fields}} if fields else {}
    dest = {"type": type_, "mode": "stream", type_: {**FAST, "endpoint": recorder.url, **block}, "data_layout": layout}
    harness = Harness.build(make_config(tmp_path, {"d": dest}), "d")
    try:
        harness.append(collected())
        harness.drain()
        assert harness.failed() == []
    finally:
        harness.close()
    [got] = recorder.requests
    return got


AMPLITUDE_MAPPING = [
    move("/event_type", "/event_type"),
    move("/user/anonymous_id", "/device_id"),
    move("/eventn_ctx_event_id", "/insert_id"),
    move("/source_ip", "/ip"),
    move("/url", "/event_properties/url"),
]


def test_amplitude(tmp_path: Path, recorder: Recorder) -> None:
    got = deliver(tmp_path, recorder, "amplitude", {"api_key": "KEY"}, AMPLITUDE_MAPPING)
    assert (got.method, got.path, got.query) == ("POST", "/2/httpapi", [])
    assert got.headers["content-type"] == "application/json"
    assert got.body == (
        b'{"api_key":"KEY","events":[{"device_id":"jg5r4o6j02",'
        b'"event_properties":{"url":"http://localhost:61006/test-case/embed.html?gclid=1"},'
        b'"event_type":"pageview","insert_id":"mockeduuid","ip":"95.82.232.185"}]}'
    )


FACEBOOK_MAPPING = [
    move("/_timestamp", "/_timestamp"),
    move("/event_type", "/event_name"),
    move("/url", "/event_source_url"),
    move("/source_ip", "/user_data/client_ip_address"),
    move("/user_agent", "/user_data/client_user_agent"),
    move("/user/anonymous_id", "/user_data/external_id"),
    move("/doc_host", "/user_data/ct"),
]


def test_facebook(tmp_path: Path, recorder: Recorder) -> None:
    got = deliver(tmp_path, recorder, "facebook", {"pixel_id": "1234567890", "access_token": "TOKEN"}, FACEBOOK_MAPPING)
    assert (got.method, got.path) == ("POST", "/v11.0/1234567890/events")
    assert got.raw_query == "access_token=TOKEN&locale=en_EN"
    assert got.body == (
        b'{"data":[{"action_source":"website","event_name":"PageView",'
        b'"event_source_url":"http://localhost:61006/test-case/embed.html?gclid=1","event_time":1592348400,'
        b'"user_data":{"client_ip_address":"95.82.232.185","client_user_agent":"Go-http-client/1.1",'
        b'"ct":"49960de5880e8c687434170f6476605b8fe4aeb9a28632c7995cf3ba831d9763","external_id":"jg5r4o6j02"}}]}'
    )  # ct: sha256("localhost")


UA_MAPPING = [
    move("/event_type", "/t"),
    move("/user/anonymous_id", "/cid"),
    move("/source_ip", "/uip"),
    move("/user_agent", "/ua"),
    move("/url", "/dl"),
    move("/doc_path", "/dp"),
    move("/screen_resolution", "/sr"),
    move("/user_language", "/ul"),
]


def test_universal_analytics(tmp_path: Path, recorder: Recorder) -> None:
    got = deliver(tmp_path, recorder, "google_analytics", {"tracking_id": "UA-12345-1"}, UA_MAPPING)
    assert (got.method, got.path, got.body) == ("GET", "/collect", b"")
    assert got.raw_query == (
        "cid=jg5r4o6j02&dl=http%3A%2F%2Flocalhost%3A61006%2Ftest-case%2Fembed.html%3Fgclid%3D1"
        "&dp=%2Ftest-case%2Fembed.html&sr=1280x720&t=pageview&tid=UA-12345-1"
        "&ua=Go-http-client%2F1.1&uip=95.82.232.185&ul=en-US&v=1"
    )


def test_ga4_without_mappings(tmp_path: Path, recorder: Recorder) -> None:
    # timestamp_micros left out: the vector's 2020 time is older than GA4's 72 hours
    got = deliver(tmp_path, recorder, "google_analytics", {"measurement_id": "G-ABC123", "api_secret": "SECRET"}, [])
    assert (got.method, got.path, got.raw_query) == ("POST", "/mp/collect", "measurement_id=G-ABC123&api_secret=SECRET")
    assert got.body == (
        b'{"client_id":"jg5r4o6j02","events":[{"name":"page_view",'
        b'"params":{"page_location":"http://localhost:61006/test-case/embed.html?gclid=1"}}]}'
    )


def test_webhook_default_body(tmp_path: Path, recorder: Recorder) -> None:
    got = deliver(tmp_path, recorder, "webhook", {"url": "https://hooks.example.com/in"}, [])
    assert (got.method, got.path) == ("POST", "/in")
    sent = orjson.loads(got.body)
    assert got.body == orjson.dumps(sent, option=orjson.OPT_SORT_KEYS)  # compact, keys sorted
    source = with_hashed_id(vector("fact_output_2.0.json"))
    # the event after the lookup enrichment EventNative applies by default (user agent, location)
    assert {k: v for k, v in sent.items() if k in source} == source
    assert set(sent) - set(source) == {"parsed_ua", "location"}
