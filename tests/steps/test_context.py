import json
import os
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from eventspark.steps.context import (
    client_ip,
    enrich_context,
    format_timestamp,
    merge_template,
    new_event_id,
    utc_timestamp,
)
from tests.shared_data import eventnative_data
from tests.vectors import with_hashed_id

VECTORS = eventnative_data()
NOW = datetime(2020, 6, 16, 23, 0, 0, tzinfo=UTC)
JS = {"token": "c2stoken", "server_side": False}
S2S = {"token": "s2stoken", "server_side": True}


def load(name: str) -> Any:
    return json.loads((VECTORS / name).read_text())


def enrich(event: dict[str, Any], endpoint: dict[str, Any]) -> dict[str, Any]:
    """The enrichment the README of the vectors describes (fixed clock and id)."""
    return enrich_context(
        event,
        source_ip="95.82.232.185",
        user_agent="Go-http-client/1.1",
        now=NOW,
        new_id=lambda: "mockeduuid",
        **endpoint,
    )


@pytest.mark.parametrize(
    ("source", "expected", "endpoint"),
    [
        ("event_input_1.0.json", "fact_output_1.0.json", JS),
        ("event_input_2.0.json", "fact_output_2.0.json", JS),
        ("api_event_input_1.0.json", "api_fact_output_1.0.json", S2S),
        ("api_event_input_2.0.json", "api_fact_output_2.0.json", S2S),
        ("mobile_event_input.json", "mobile_fact_output.json", JS),
    ],
)
def test_eventnative_vectors(source: str, expected: str, endpoint: dict[str, Any]) -> None:
    assert enrich(load(source), endpoint) == with_hashed_id(load(expected))


def test_eventnative_array_vector() -> None:
    enriched = [enrich(event, JS) for event in load("mobile_events_array_input.json")]
    assert enriched == [with_hashed_id(event) for event in load("mobile_facts_array_output.json")]


def test_eventnative_template_vector() -> None:
    body = load("mobile_events_template_input.json")
    enriched = [enrich(merge_template(body["template"], event), JS) for event in body["events"]]
    assert enriched == [with_hashed_id(event) for event in load("mobile_facts_template_output.json")]


def test_format_timestamp() -> None:
    assert format_timestamp(NOW) == "2020-06-16T23:00:00.000000Z"
    moscow = timezone(timedelta(hours=3))
    assert format_timestamp(datetime(2021, 1, 1, 2, 30, 5, 42, tzinfo=moscow)) == "2020-12-31T23:30:05.000042Z"
    assert format_timestamp(datetime(2021, 1, 1, 2, 30, 5)) == "2021-01-01T02:30:05.000000Z"


def test_format_timestamp_formats_each_datetime_afresh() -> None:
    # format_timestamp remembers the last datetime (a request's events share one): never stale
    later = NOW + timedelta(microseconds=1)
    texts = [format_timestamp(moment) for moment in (NOW, NOW, later, NOW, later.replace(tzinfo=None))]
    first, second = "2020-06-16T23:00:00.000000Z", "2020-06-16T23:00:00.000001Z"
    assert texts == [first, first, second, first, second]


def test_utc_timestamp_formats_like_format_timestamp_across_seconds() -> None:
    # The date and time are cached per second: a new second, later or earlier, must replace them.
    second = 1_718_578_799 * 10**9  # 2024-06-16T22:59:59Z
    moments = [second + 999_999_999, second + 10**9, second + 10**9 + 1_999, second + 5_000, second - 1, 0]
    texts = [utc_timestamp(ns) for ns in moments]
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert texts == [format_timestamp(epoch + timedelta(microseconds=ns // 1000)) for ns in moments]
    assert texts[:2] == ["2024-06-16T22:59:59.999999Z", "2024-06-16T23:00:00.000000Z"]
    assert texts[-1] == "1970-01-01T00:00:00.000000Z"


def test_utc_timestamp_is_now() -> None:
    before = datetime.now(UTC)
    stamp = datetime.strptime(utc_timestamp(), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    assert before <= stamp <= datetime.now(UTC)


def test_a_given_timestamp_wins_over_now() -> None:
    event = enrich_context({}, token="t", source_ip="", user_agent=None, server_side=True, now=NOW, timestamp="x")
    assert event["_timestamp"] == "x"


def test_new_event_ids_are_unique_version_4_uuids() -> None:
    ids = [new_event_id() for _ in range(300)]  # several batches of random bytes
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_process_never_hands_out_its_parents_ids() -> None:
    new_event_id()  # the parent now holds ids made in advance
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.write(write, new_event_id().encode())
        finally:
            os._exit(0)
    os.close(write)
    child_id = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert uuid.UUID(child_id).version == 4
    assert child_id != new_event_id()


@pytest.mark.parametrize(
    ("headers", "peer", "expected"),
    [
        ({"x-real-ip": "1.1.1.1", "x-forwarded-for": "2.2.2.2"}, "3.3.3.3", "1.1.1.1"),
        ({"x-forwarded-for": "2.2.2.2, 10.0.0.1"}, "3.3.3.3", "2.2.2.2"),
        ({"X-Forwarded-For": " 2.2.2.2 ,10.0.0.1"}, None, "2.2.2.2"),
        ({"X-Real-IP": "1.1.1.1"}, None, "1.1.1.1"),
        ({"x-real-ip": "", "x-forwarded-for": ""}, "3.3.3.3", "3.3.3.3"),
        ({"x-forwarded-for": ", "}, "::1", "::1"),
        ({}, None, ""),
    ],
)
def test_client_ip(headers: dict[str, str], peer: str | None, expected: str) -> None:
    assert client_ip(headers, peer) == expected


def test_defaults_generate_uuid_and_current_time() -> None:
    before = datetime.now(UTC)
    event = enrich_context({}, token="t", source_ip="", user_agent=None, server_side=True)
    after = datetime.now(UTC)
    generated = uuid.UUID(event["eventn_ctx_event_id"])
    assert (generated.version, generated.variant) == (4, uuid.RFC_4122)
    assert str(generated) == event["eventn_ctx_event_id"]
    stamp = datetime.strptime(event["_timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    assert before <= stamp <= after


def test_ids_are_unique_per_event() -> None:
    ids = {
        enrich_context({}, token="t", source_ip="", user_agent=None, server_side=True)["eventn_ctx_event_id"]
        for _ in range(100)
    }
    assert len(ids) == 100


def test_s2s_sets_src_api_and_keeps_body_user_agent() -> None:
    # issue 17: EventNative 1.41 sets src "api" only when the body has none (or null)
    event = enrich({"user_agent": "mine", "api_key": "forged"}, S2S)
    assert (event["src"], event["user_agent"], event["api_key"]) == ("api", "mine", "s2stoken")
    assert enrich({"src": None}, S2S)["src"] == "api"
    assert enrich({"src": "jitsu"}, S2S)["src"] == "jitsu"


@pytest.mark.parametrize("header", [None, ""])
def test_js_without_user_agent_header_keeps_body_value(header: str | None) -> None:
    flat = enrich_context({"user_agent": "sdk"}, token="t", source_ip="", user_agent=header, server_side=False)
    nested = enrich_context(
        {"eventn_ctx": {"user_agent": "sdk"}}, token="t", source_ip="", user_agent=header, server_side=False
    )
    assert flat["user_agent"] == "sdk"
    assert nested["eventn_ctx"]["user_agent"] == "sdk"


def test_js_header_user_agent_goes_where_the_format_keeps_it() -> None:
    flat = enrich({"user_agent": "sdk"}, JS)
    nested = enrich({"eventn_ctx": {}}, JS)
    assert flat["user_agent"] == "Go-http-client/1.1"
    assert nested["eventn_ctx"]["user_agent"] == "Go-http-client/1.1"
    assert "user_agent" not in nested


@pytest.mark.parametrize(
    ("ctx", "expected"),
    [
        ({}, "mockeduuid"),
        ({"event_id": ""}, "mockeduuid"),
        ({"event_id": None}, "mockeduuid"),
        ({"event_id": {"x": 1}}, "mockeduuid"),
        ({"event_id": 42}, "42"),
        ({"event_id": "abc"}, "abc"),
    ],
)
def test_nested_event_id(ctx: dict[str, Any], expected: str) -> None:
    event = enrich({"eventn_ctx": ctx}, JS)
    assert event["eventn_ctx"]["event_id"] == expected
    assert "eventn_ctx_event_id" not in event


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"event_id": "sdk-id"}, {"eventn_ctx_event_id": "sdk-id"}),
        ({"event_id": 7}, {"eventn_ctx_event_id": "7"}),
        ({"event_id": True}, {"eventn_ctx_event_id": "mockeduuid"}),
        (
            {"eventn_ctx_event_id": "kept", "event_id": "other"},
            {"eventn_ctx_event_id": "kept", "event_id": "other"},
        ),
        ({"eventn_ctx_event_id": "", "event_id": "sdk-id"}, {"eventn_ctx_event_id": "sdk-id"}),
        (
            {"eventn_ctx": "not an object", "event_id": "x"},
            {"eventn_ctx": "not an object", "eventn_ctx_event_id": "x"},
        ),
    ],
)
def test_flat_event_id(body: dict[str, Any], expected: dict[str, Any]) -> None:
    event = enrich(body, S2S)
    for key in ("_timestamp", "api_key", "source_ip", "src"):
        del event[key]
    assert event == expected


def test_enrichment_mutates_in_place() -> None:
    event: dict[str, Any] = {"a": 1}
    assert enrich(event, JS) is event


def test_merge_template_event_wins_shallowly() -> None:
    template = {"a": 1, "user": {"id": "t", "email": "t@x"}, "list": [1]}
    event = merge_template(template, {"a": 2, "user": {"id": "e"}})
    assert event == {"a": 2, "user": {"id": "e"}, "list": [1]}


def test_merge_template_copies_containers_per_event() -> None:
    template = {"eventn_ctx": {"tags": ["x"], "inner": {"k": 1}}, "n": 5}
    first = merge_template(template, {})
    second = merge_template(template, {})
    first["eventn_ctx"]["tags"].append("y")
    first["eventn_ctx"]["inner"]["k"] = 2
    enrich(first, JS)
    assert second == {"eventn_ctx": {"tags": ["x"], "inner": {"k": 1}}, "n": 5}
    assert template == {"eventn_ctx": {"tags": ["x"], "inner": {"k": 1}}, "n": 5}


def test_merge_template_survives_hostile_depth() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(5000):
        node["d"] = [{}]
        node = node["d"][0]
    node["leaf"] = 1
    merged = merge_template({"deep": deep}, {})
    walk = merged["deep"]
    original = deep
    for _ in range(5000):
        assert walk is not original
        walk, original = walk["d"][0], original["d"][0]
    assert walk == {"leaf": 1}


def test_hashed_anonymous_id_cache_is_bounded_and_exact() -> None:
    import hashlib

    from eventspark.steps import context

    def expected(ip: str, agent: str) -> str:
        return hashlib.md5((ip + agent).encode("utf-8", "surrogatepass")).hexdigest()

    pairs = [(f"10.0.{n // 256}.{n % 256}", "agent") for n in range(context._MAX_HASHED + 100)]
    for _ in range(2):  # the second round reads what the first one cached (or recomputes after a clear)
        assert all(context.hashed_anonymous_id(ip, agent) == expected(ip, agent) for ip, agent in pairs)
    assert len(context._hashed) <= context._MAX_HASHED
    huge = "x" * (context._MAX_HASHED_KEY + 1)
    assert context.hashed_anonymous_id("1.2.3.4", huge) == expected("1.2.3.4", huge)
    assert "1.2.3.4" + huge not in context._hashed  # a huge User-Agent is not kept
    event = {"source_ip": "10.0.0.1", "eventn_ctx": {"user": {}}}
    enrich_context(event, token="t", source_ip="9.9.9.9", user_agent="agent", server_side=False)
    assert event["eventn_ctx"]["user"]["hashed_anonymous_id"] == expected("10.0.0.1", "agent")
