"""Issue 17, item 7, step by step: what EventNative 1.41 did that eventspark now does too."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from eventspark.batch.job import BatchJob, JobResult
from eventspark.config import load_config
from eventspark.coordination import build_coordination
from eventspark.logs.incoming import LogName, parse_log_name
from eventspark.steps.context import enrich_context, ensure_event_id, hashed_anonymous_id, line_event_id
from eventspark.steps.lookup import _parsed_agent

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
AGENT = "agent/1.0"


def enrich(event: dict[str, Any], *, server_side: bool = False) -> dict[str, Any]:
    return enrich_context(
        event, token="tok", source_ip="1.2.3.4", user_agent=AGENT, server_side=server_side, now=NOW, new_id=lambda: "id"
    )


# --- ContextEnrichment ---------------------------------------------------------------------------


@pytest.mark.parametrize("server_side", [False, True])
def test_client_timestamp_and_ip_are_kept(server_side: bool) -> None:
    event = enrich({"_timestamp": "2020-01-01T00:00:00Z", "source_ip": "9.9.9.9"}, server_side=server_side)
    assert (event["_timestamp"], event["source_ip"], event["api_key"]) == ("2020-01-01T00:00:00Z", "9.9.9.9", "tok")


def test_absent_or_null_timestamp_and_ip_are_filled() -> None:
    for body in ({}, {"_timestamp": None, "source_ip": None}):
        event = enrich(dict(body))
        assert (event["_timestamp"], event["source_ip"]) == ("2026-01-02T03:04:05.000000Z", "1.2.3.4")


def test_a_non_string_timestamp_is_kept_for_the_load_to_judge() -> None:
    # kept as EventNative did; typing then fails the event with the reason (tests/steps/test_typing)
    assert enrich({"_timestamp": 1700000000})["_timestamp"] == 1700000000
    # a subtree would flatten away (no `_timestamp` column at all): its JSON text fails at load
    assert enrich({"_timestamp": {"a": [1]}})["_timestamp"] == '{"a":[1]}'
    assert enrich({"_timestamp": []})["_timestamp"] == "[]"


def test_js_src_is_kept_and_s2s_src_only_filled() -> None:
    assert enrich({"src": "jitsu"})["src"] == "jitsu"
    assert "src" not in enrich({})
    assert enrich({"src": "importer"}, server_side=True)["src"] == "importer"
    assert enrich({}, server_side=True)["src"] == "api"


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


@pytest.mark.parametrize("server_side", [False, True])
def test_hashed_anonymous_id_goes_into_the_existing_user_object(server_side: bool) -> None:
    nested = enrich({"eventn_ctx": {"user": {"anonymous_id": "a"}}, "user": {}}, server_side=server_side)
    assert nested["eventn_ctx"]["user"]["hashed_anonymous_id"] == md5("1.2.3.4" + AGENT)
    assert nested["user"] == {}
    flat = enrich({"user": {"anonymous_id": "a"}}, server_side=server_side)
    assert flat["user"]["hashed_anonymous_id"] == md5("1.2.3.4" + AGENT)
    fallback = enrich({"eventn_ctx": {"user": "x"}, "user": {}}, server_side=server_side)
    assert fallback["user"]["hashed_anonymous_id"] == md5("1.2.3.4" + AGENT)


def test_no_user_object_no_hashed_id() -> None:
    for body in ({}, {"user": "someone"}, {"eventn_ctx": {}}):
        event = enrich(body)
        assert "hashed_anonymous_id" not in str(event)


def test_hashed_id_uses_the_kept_address_and_an_empty_agent() -> None:
    event = enrich_context(
        {"source_ip": "5.6.7.8", "user": {}}, token="t", source_ip="1.2.3.4", user_agent=None, server_side=False
    )
    assert event["user"]["hashed_anonymous_id"] == md5("5.6.7.8")


def test_hashed_anonymous_id_cache_never_serves_a_stale_digest() -> None:
    pairs = [("1.1.1.1", "a"), ("1.1.1.1", "a"), ("1.1.1.1a", ""), ("2.2.2.2", "\udc80")]
    assert [hashed_anonymous_id(ip, ua) for ip, ua in pairs[:3]] == [md5("1.1.1.1a")] * 3
    assert hashed_anonymous_id(*pairs[3]) == hashlib.md5("2.2.2.2\udc80".encode("utf-8", "surrogatepass")).hexdigest()


# --- an event id at load -------------------------------------------------------------------------


def test_a_line_without_id_gets_a_deterministic_one() -> None:
    line = b'{"event_type":"x"}'
    event: dict[str, Any] = {"event_type": "x"}
    ensure_event_id(event, line + b"\n")  # the line ending does not count
    given = uuid.UUID(event["eventn_ctx_event_id"])
    assert (given.version, given.variant) == (8, uuid.RFC_4122)
    assert given.bytes[:6] == hashlib.sha256(line).digest()[:6]  # derived from the line's SHA-256
    assert line_event_id(line) == str(given)
    assert line_event_id(b'{"event_type":"y"}') != str(given)


def test_ids_already_there_are_kept_and_the_nested_place_is_used() -> None:
    nested: dict[str, Any] = {"eventn_ctx": {"event_id": "mine"}}
    ensure_event_id(nested, b"x")
    assert nested == {"eventn_ctx": {"event_id": "mine"}}
    empty: dict[str, Any] = {"eventn_ctx": {"event_id": ""}}
    ensure_event_id(empty, b"x")
    assert empty["eventn_ctx"]["event_id"] == line_event_id(b"x")
    flat: dict[str, Any] = {"eventn_ctx_event_id": "kept"}
    ensure_event_id(flat, b"x")
    assert flat == {"eventn_ctx_event_id": "kept"}
    sdk: dict[str, Any] = {"event_id": 7}
    ensure_event_id(sdk, b"x")
    assert sdk == {"eventn_ctx_event_id": "7"}


# --- rotated log names ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "microsecond"),
    [
        ("incoming.tok=web-2021-05-11T10-20-30.123.log", 123000),
        ("incoming.tok=web-2021-05-11T10-20-30.1234.log", 123400),
        ("incoming.tok=web-2021-05-11T10-20-30.log", 0),
    ],
)
def test_eventnative_rotated_names(name: str, microsecond: int) -> None:
    at = datetime(2021, 5, 11, 10, 20, 30, microsecond, tzinfo=UTC)
    assert parse_log_name(name) == LogName("web", None, at)


# --- parsed_ua device ------------------------------------------------------------------------------


def test_device_brand_and_model_are_kept_when_the_family_is_other() -> None:
    ua = SimpleNamespace(family="Other", major=None, minor=None, patch=None)
    device = SimpleNamespace(family="Other", brand="Generic", model="Smartphone")
    assert _parsed_agent(ua, None, device) == {"device_brand": "Generic", "device_model": "Smartphone"}


# --- logs nobody takes ----------------------------------------------------------------------------


def test_logs_of_tokens_without_batch_destination_are_held(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        f"""
api_keys:
  - {{id: web, server_secret: s1}}
  - {{id: live, server_secret: s2}}
log: {{path: {tmp_path / "events"}}}
destinations:
  b: {{type: postgres, mode: batch, only_tokens: [web], datasource: {{host: h, db: d}}}}
  s: {{type: postgres, mode: stream, only_tokens: [live], datasource: {{host: h, db: d}}}}
"""
    )
    loaded = load_config(config)
    job = BatchJob(loaded, build_coordination(None, "parity"))
    names = [f"incoming.tok={token}-2021-05-11T10-20-30.000.log" for token in ("web", "live", "gone")]
    result = JobResult()
    routable = job._hold_unroutable([tmp_path / name for name in names], result)
    assert [p.name for p in routable] == names[:1]
    assert result.held == {
        names[1]: "token 'live' has no batch destination",
        names[2]: "token 'gone' is not in api_keys",
    }
    assert [p.name for p in result.kept] == names[1:]
