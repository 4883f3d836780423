"""`/t/inline.js` rendering: EventNative's query settings, the two templates, escaping of the query."""

from __future__ import annotations

import re

import orjson
import pytest
import quickjs

from eventspark.collector.http import HTTPError
from eventspark.collector.static_inline import (
    MAX_EVENTS,
    MAX_VALUE_CHARS,
    parse_inline_query,
    render_inline,
    script_json,
)

OLD_TEMPLATE = b"(function(cfg) { window.eventnLoaded = cfg; })(eventnConfig || {});\n"
"""The shape of EventNative's own inline.js: the word eventnConfig is replaced by the settings."""


def settings_in(script: bytes) -> dict[str, object]:
    """The settings JSON the built-in template was rendered with."""
    found = re.search(rb"\}\)\((\{.*?\}), \[", script, re.S)
    assert found is not None, script
    return orjson.loads(found.group(1))


def test_settings_as_eventnative_bound_them() -> None:
    query = parse_inline_query(
        [("key", "K1"), ("segment_hook", "true"), ("ga_hook", "0"), ("cookie_domain", ".example.com")],
        "collector.example.com",
    )
    assert query.settings == {
        "key": "K1",
        "segment_hook": True,
        "ga_hook": False,
        "randomize_url": False,
        "tracking_host": "collector.example.com",
        "cookie_domain": ".example.com",
    }
    assert query.events == []


def test_tracking_host_from_the_query_wins_and_events_keep_their_order() -> None:
    query = parse_inline_query(
        [("key", "K"), ("tracking_host", "https://t.example.com"), ("event", "pageview"), ("event", "signup")],
        "ignored",
    )
    assert query.settings["tracking_host"] == "https://t.example.com"
    assert query.events == ["pageview", "signup"]


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ([], "Mandatory key parameter is missing"),
        ([("key", "")], "Mandatory key parameter is missing"),
        ([("key", "K"), ("ga_hook", "maybe")], "must be true or false"),
        ([("key", "K" * (MAX_VALUE_CHARS + 1))], "longer than"),
        ([("key", "K"), *[("event", "e")] * (MAX_EVENTS + 1)], "at most"),
    ],
)
def test_bad_queries_are_400(pairs: list[tuple[str, str]], message: str) -> None:
    with pytest.raises(HTTPError) as caught:
        parse_inline_query(pairs, "host")
    assert caught.value.status == 400
    assert message in caught.value.message


def test_the_built_in_loader_carries_the_settings_and_events() -> None:
    query = parse_inline_query([("key", "K"), ("event", "pageview")], "h:1")
    script = render_inline(None, query)
    assert settings_in(script)["key"] == "K"
    page = run_page(script)
    assert page.eval("created.src") == "https://h:1/s/lib.js"  # no scheme: the page's
    assert page.eval("created.attributes['data-tracking-host']") == "https://h:1"
    assert page.eval("created.attributes['data-init-only']") == "true"  # only the query's events
    assert page.eval("window.jitsuQ.length") == 1


def test_without_events_the_loader_lets_lib_js_send_its_page_view() -> None:
    query = parse_inline_query([("key", "K"), ("tracking_host", "http://t.example.com/")], "ignored")
    page = run_page(render_inline(None, query))
    assert page.eval("created.src") == "http://t.example.com/s/lib.js"
    assert page.eval("created.attributes['data-init-only'] === undefined") is True
    assert page.eval("window.jitsuQ.length") == 0


HOSTILE = [
    "</script><script>alert(1)</script>",
    "'); alert(1); ('",
    '"); alert(1); ("',
    "\u2028alert(1)\u2029",
    "\\'; alert(1); //",
    "<!--",
    "eventnConfig",
]

# A page's globals for running a rendered script in QuickJS: `alert` records that injected code ran,
# the one script element the loader creates records its attributes.
PAGE_STUB = """
var alerted = false; function alert() { alerted = true; }
var created = {attributes: {}, setAttribute: function (n, v) { this.attributes[n] = v; }};
var document = {
  createElement: function () { return created; },
  getElementsByTagName: function () { return [{parentNode: {insertBefore: function () {}}}]; }
};
var location = {protocol: "https:"};
var tracked = [];
var eventN = {track: function (name) { tracked.push(name); }};
var window = {console: null, eventN: eventN};
"""


def run_page(script: bytes) -> quickjs.Context:
    context = quickjs.Context()
    context.eval(PAGE_STUB)
    context.eval(script.decode())
    return context


@pytest.mark.parametrize("value", HOSTILE)
def test_query_values_cannot_leave_their_string(value: str) -> None:
    query = parse_inline_query([("key", value), ("cookie_domain", value), ("event", value)], value)
    built_in = render_inline(None, query)
    page = run_page(built_in)
    assert page.eval("alerted") is False
    attributes = orjson.loads(page.eval("JSON.stringify(created.attributes)"))
    assert attributes["data-key"] == value and attributes["data-cookie-domain"] == value
    queued = orjson.loads(page.eval("JSON.stringify(Array.prototype.slice.call(window.jitsuQ[0]))"))
    assert queued == ["track", value]

    old = run_page(render_inline(OLD_TEMPLATE, query))
    assert old.eval("alerted") is False
    assert old.eval("window.eventnLoaded.key") == value
    assert orjson.loads(old.eval("JSON.stringify(tracked)")) == [value]

    for script in (built_in, render_inline(OLD_TEMPLATE, query)):  # also safe inside an HTML <script>
        assert b"</" not in script and b"<!--" not in script


def test_an_eventnative_template_gets_the_settings_and_the_track_calls() -> None:
    query = parse_inline_query([("key", "K"), ("event", "pageview"), ("event", "it's")], "h")
    script = render_inline(OLD_TEMPLATE, query)
    config = orjson.loads(script.split(b"(function(cfg) { window.eventnLoaded = cfg; })(")[1].split(b" || {}")[0])
    assert config["key"] == "K"
    assert script.endswith(b'eventN.track("pageview"); eventN.track("it\'s"); ')


def test_a_template_without_placeholder_is_a_clear_error() -> None:
    with pytest.raises(HTTPError) as caught:
        render_inline(b"console.log(1)", parse_inline_query([("key", "K")], "h"))
    assert "eventnConfig" in caught.value.message


def test_script_json_escapes_html_significant_characters() -> None:
    assert script_json("<&>") == b'"\\u003c\\u0026\\u003e"'
