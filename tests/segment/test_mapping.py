"""Segment messages → EventNative events (`eventspark.collector.segment`), as EventNative 1.41 mapped them.

The expected events were derived by hand from EventNative's mapping rules (its defaults
`compatibility.segment.endpoint` / `segment_compat.endpoint`) and its FieldMapper semantics:
moves by reference, removals after the last rule.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from eventspark.collector.segment import COMPAT_RULES, PLAIN_RULES, map_message, map_messages

LIBRARY = {"name": "analytics-python", "version": "2.4.0"}


def message(kind: str, **fields: Any) -> dict[str, Any]:
    """A message as analytics-python 2.4.0 sends it."""
    return {
        "type": kind,
        "messageId": f"m-{kind}",
        "timestamp": "2026-11-24T10:00:00.000+00:00",
        "integrations": {},
        "context": {"library": dict(LIBRARY)},
        **fields,
    }


def plain(msg: dict[str, Any]) -> dict[str, Any]:
    return map_messages([copy.deepcopy(msg)], compat=False)[0]


def compat(msg: dict[str, Any]) -> dict[str, Any]:
    return map_messages([copy.deepcopy(msg)], compat=True)[0]


COMMON = {
    "timestamp": "2026-11-24T10:00:00.000+00:00",
    "integrations": {},
    "library": LIBRARY,
    "src": "segment_api",
}


def test_track() -> None:
    msg = message("track", userId="u1", anonymousId="a1", event="Signed Up", properties={"plan": "pro", "n": 2})
    assert plain(msg) == {
        **COMMON,
        "event": "Signed Up",
        "event_type": "track",
        "ids": {"ajs_anonymous_id": "a1", "ajs_user_id": "u1"},
        "user": {"anonymous_id": "a1", "internal_id": "u1", "id": "u1"},
        "plan": "pro",
        "n": 2,
        "eventn_ctx_event_id": "m-track",
    }


def test_track_compat_nests_under_eventn_ctx_without_user_id() -> None:
    msg = message("track", userId="u1", anonymousId="a1", event="Signed Up", properties={"plan": "pro"})
    assert compat(msg) == {
        **COMMON,
        "event": "Signed Up",
        "event_type": "track",
        "eventn_ctx": {
            "ids": {"ajs_anonymous_id": "a1", "ajs_user_id": "u1"},
            "user": {"anonymous_id": "a1", "internal_id": "u1"},
            "event_id": "m-track",
        },
        "plan": "pro",
    }


def test_identify_traits_become_the_user() -> None:
    msg = message("identify", userId="u1", traits={"email": "a@b.c", "name": "Ann"})
    event = plain(msg)
    assert event["user"] == {"email": "a@b.c", "name": "Ann", "internal_id": "u1", "id": "u1"}
    assert "traits" not in event and event["event_type"] == "identify"
    assert compat(msg)["eventn_ctx"]["user"] == {"email": "a@b.c", "name": "Ann", "internal_id": "u1"}


def test_context_traits_win_over_top_level_traits() -> None:
    msg = message("track", traits={"a": 1})
    msg["context"]["traits"] = {"b": 2}
    assert plain(msg)["user"] == {"b": 2}


def test_page_of_analytics_js() -> None:
    context = {
        "page": {
            "title": "Home",
            "url": "https://x.io/a?q=1",
            "path": "/a",
            "referrer": "https://g.com",
            "search": "?q=1",
        },
        "userAgent": "Mozilla/5.0",
        "locale": "en-US",
        "ip": "1.2.3.4",
        "timezone": "UTC",
        "screen": {"width": 1920, "height": 1080, "density": 2},
        "campaign": {"name": "spring", "source": "news"},
        "referrer": {"type": "x", "url": "https://r.io"},
        "library": LIBRARY,
    }
    msg = message("page", anonymousId="a1", name="Home", properties={"title": "Home", "path": "/a"}, context=context)
    event = plain(msg)
    assert event == {
        **COMMON,
        "name": "Home",
        "title": "Home",
        "path": "/a",
        "event_type": "page",
        "page_title": "Home",
        # moved by reference, then `title` removed from it; `referrer` stays (EventNative's order)
        "doc": {"url": "https://x.io/a?q=1", "path": "/a", "referrer": "https://g.com", "search": "?q=1"},
        "referer": "https://r.io",
        "referrer": {"type": "x"},
        "user_agent": "Mozilla/5.0",
        "ids": {"ajs_anonymous_id": "a1"},
        "user": {"anonymous_id": "a1"},
        "utm": {"name": "spring", "source": "news", "campaign": "spring"},
        "user_language": "en-US",
        "source_ip": "1.2.3.4",
        "local_tz_offset": 0.0,
        "screen_resolution": "1920x1080",
        "eventn_ctx_event_id": "m-page",
    }


def test_page_compat() -> None:
    context = {"page": {"title": "Home", "url": "https://x.io/"}, "userAgent": "UA", "location": {"city": "Oslo"}}
    event = compat(message("page", context=context))
    assert event["eventn_ctx"] == {
        "page_title": "Home",
        "doc": {"url": "https://x.io/"},
        "user_agent": "UA",
        "location": {"city": "Oslo"},
        "event_id": "m-page",
    }
    assert "location" not in event and "page" not in event and "userAgent" not in event


def test_screen_with_mobile_context() -> None:
    context = {
        "os": {"name": "iOS", "version": "17.1"},
        "device": {"manufacturer": "Apple", "model": "iPhone15,2", "id": "d1", "type": "ios", "advertisingId": "ad"},
        "app": {"name": "Shop", "version": "3.2"},
        "network": {"wifi": True},
    }
    event = plain(message("screen", userId="u1", name="Cart", properties={"items": 3}, context=context))
    assert event["parsed_ua"] == {
        "os_family": "iOS",
        "os_version": "17.1",
        "device_brand": "Apple",
        "device_model": "iPhone15,2",
        "device_id": "d1",
        "device_type": "ios",
        "device_advertising_id": "ad",
    }
    assert event["app"] == {"name": "Shop", "version": "3.2"} and event["network"] == {"wifi": True}
    assert event["name"] == "Cart" and event["items"] == 3 and event["event_type"] == "screen"
    assert not {"os", "device", "context"} & event.keys()


def test_group_and_alias_keep_segment_names() -> None:
    group = plain(message("group", userId="u1", groupId="g1", traits={"plan": "team"}))
    assert group["groupId"] == "g1" and group["user"] == {"plan": "team", "internal_id": "u1", "id": "u1"}
    alias = plain(message("alias", userId="u2", previousId="a9"))
    assert alias["previousId"] == "a9" and alias["user"]["id"] == "u2" and alias["event_type"] == "alias"


def test_message_id_becomes_the_event_id_nested_or_flat() -> None:
    assert plain(message("track"))["eventn_ctx_event_id"] == "m-track"
    assert compat(message("track", userId="u"))["eventn_ctx"]["event_id"] == "m-track"
    # compat without anything under eventn_ctx: the flat field, as EventNative's multiple path set it
    assert compat(message("track"))["eventn_ctx_event_id"] == "m-track"
    assert plain(message("track", messageId=42))["eventn_ctx_event_id"] == "42"
    odd = plain(message("track", messageId={"x": 1}))
    assert odd["messageId"] == {"x": 1} and "eventn_ctx_event_id" not in odd


def test_timezone_and_screen_edge_cases() -> None:
    for zone in ("Not/AZone", "../../etc/passwd", "", "x" * 1000, 5, None, "America"):
        event = plain(message("track", context={"timezone": zone}))
        assert "timezone" not in event and "local_tz_offset" not in event, zone
    event = plain(message("track", context={"screen": {"width": 10}}))
    assert "screen" not in event and "screen_resolution" not in event
    assert (
        plain(message("track", context={"screen": {"width": 1.5, "height": True}}))["screen_resolution"] == "1.5xtrue"
    )


def test_src_is_always_segment_api() -> None:
    assert plain(message("track", properties={"src": "mine"}))["src"] == "segment_api"


@pytest.mark.parametrize(
    ("fields", "kept"),
    [
        ({"properties": "not an object"}, {"properties": "not an object"}),
        ({"context": ["not", "an", "object"]}, {"context": ["not", "an", "object"]}),
        ({"traits": "x", "userId": "u1"}, {"user": "x", "ids": {"ajs_user_id": "u1"}}),
        ({"context": {"traits": 5}, "anonymousId": "a"}, {"user": 5, "ids": {"ajs_anonymous_id": "a"}}),
    ],
)
def test_odd_shapes_lose_nothing(fields: dict[str, Any], kept: dict[str, Any]) -> None:
    """Where EventNative failed the whole request, the rule is skipped and the value stays."""
    event = plain(message("track", **fields))
    assert {key: event.get(key) for key in kept} == kept


def test_a_property_named_context_replaces_the_context_as_in_eventnative() -> None:
    first, second = message("track", properties={"context": {"x": 1}}), message("track")
    events = map_messages([first, second], compat=False)
    assert events[0]["x"] == 1 and "library" not in events[0] and "context" not in events[0]
    assert events[1]["library"] == LIBRARY and "x" not in events[1]


def test_rules_are_eventnative_s_in_its_order() -> None:
    assert len(PLAIN_RULES) == 38 and len(COMPAT_RULES) == 38
    assert PLAIN_RULES[-2:] == [(("properties",), ()), (("context",), ())]
    assert (("userId",), ("user", "id")) in PLAIN_RULES
    assert (("userId",), ("eventn_ctx", "user", "id")) not in COMPAT_RULES
    assert (("location",), None) in COMPAT_RULES and (("location",), None) not in PLAIN_RULES


def test_map_message_changes_the_message_in_place() -> None:
    msg = message("track")
    assert map_message(msg, PLAIN_RULES) is msg
