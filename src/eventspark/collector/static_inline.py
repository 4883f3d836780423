"""`/t/inline.js`: EventNative's inline snippet, rendered from its query.

EventNative read `inline.js` from `server.static_files_dir` and replaced the word `eventnConfig` in it
with the JSON of the query's settings, then appended one `eventN.track('<event>');` per `event`
parameter (unescaped: a script injection). eventspark does the same with a template from
`static_files_dir` when there is one, and otherwise with `BUILT_IN_TEMPLATE` below, a loader for the
SDK's `lib.js` (the SDK package has no inline.js). Every value from the query ends up inside a JSON
string literal, with `<`, `>`, `&` and the JS line separators escaped: nothing from the query can
close the string or the `<script>` element it is written into.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from eventspark.collector.http import HTTPError

CONFIG_PLACEHOLDER = b"eventnConfig"
"""The word of the template that the settings' JSON replaces (EventNative's placeholder)."""

BOOLEAN_SETTINGS = ("segment_hook", "ga_hook", "randomize_url")
"""EventNative's boolean query settings, always in the JSON (false when absent)."""
STRING_SETTINGS = ("cookie_domain",)
"""EventNative's other optional setting: in the JSON only when given."""
SDK_SETTINGS = (
    "cookie_name",
    "cookie_policy",
    "ip_policy",
    "privacy_policy",
    "id_method",
    "log_level",
    "use_beacon_api",
    "capture_3rd_party_cookies",
)
"""Further `lib.js` options (data attributes of its script tag) passed on as given."""
MAX_VALUE_CHARS = 512
MAX_EVENTS = 16
TRUE_WORDS = frozenset(("1", "t", "T", "TRUE", "true", "True"))
FALSE_WORDS = frozenset(("", "0", "f", "F", "FALSE", "false", "False"))
"""What Go's `strconv.ParseBool` (EventNative's query binding) accepts; anything else is a 400."""

# The loader used when no inline.js template is configured: defines `jitsu()` as a queue, loads
# `<tracking_host>/s/lib.js` with the settings as its data attributes (how lib.js reads its options)
# and queues the query's events; lib.js replays the queue once loaded. With no `event` parameter,
# lib.js sends its usual page view.
BUILT_IN_TEMPLATE = b"""(function (cfg, events) {
  try {
    var w = window;
    w.jitsuQ = w.jitsuQ || [];
    w.jitsu = w.jitsu || function () { w.jitsuQ.push(arguments); };
    for (var i = 0; i < events.length; i++) { w.jitsu("track", events[i]); }
    var host = String(cfg.tracking_host || "").replace(/\\/+$/, "");
    if (!/^https?:\\/\\//.test(host)) { host = location.protocol + "//" + host; }
    var script = document.createElement("script");
    script.async = true;
    script.src = host + "/s/lib.js";
    for (var name in cfg) {
      if (Object.prototype.hasOwnProperty.call(cfg, name) && cfg[name] !== null) {
        script.setAttribute("data-" + name.replace(/_/g, "-"), String(cfg[name]));
      }
    }
    script.setAttribute("data-tracking-host", host);
    if (events.length) { script.setAttribute("data-init-only", "true"); }
    var first = document.getElementsByTagName("script")[0];
    if (first && first.parentNode) { first.parentNode.insertBefore(script, first); }
    else { (document.head || document.documentElement).appendChild(script); }
  } catch (e) {
    if (w.console) { w.console.log("eventspark inline.js failed", e); }
  }
})(eventnConfig, eventnEvents);
"""
_BUILT_IN_HEAD, _, _BUILT_IN_TAIL = BUILT_IN_TEMPLATE.partition(b"eventnConfig, eventnEvents")


@dataclass(frozen=True, slots=True)
class InlineQuery:
    """The settings and events of one `/t/inline.js` request."""

    settings: dict[str, str | bool]
    events: list[str]


def parse_inline_query(query: list[tuple[str, str]], default_host: str) -> InlineQuery:
    """The settings as EventNative bound them (key required; 400 otherwise), bounded."""
    values: dict[str, str] = {}
    events: list[str] = []
    for name, value in query:
        if len(value) > MAX_VALUE_CHARS:
            raise HTTPError(400, f"query parameter {name[:64]!r} is longer than {MAX_VALUE_CHARS} characters")
        if name == "event":
            events.append(value)
        else:
            values.setdefault(name, value)
    if len(events) > MAX_EVENTS:
        raise HTTPError(400, f"at most {MAX_EVENTS} event parameters")
    if not values.get("key"):
        raise HTTPError(400, "Mandatory key parameter is missing", "/t/inline.js needs ?key=<client secret>")
    settings: dict[str, str | bool] = {"key": values["key"]}
    for name in BOOLEAN_SETTINGS:
        settings[name] = _boolean(name, values.get(name, ""))
    settings["tracking_host"] = values.get("tracking_host") or default_host
    for name in (*STRING_SETTINGS, *SDK_SETTINGS):
        if values.get(name):
            settings[name] = values[name]
    return InlineQuery(settings, events)


def _boolean(name: str, value: str) -> bool:
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise HTTPError(400, f"query parameter {name!r} must be true or false")


def script_json(value: object) -> bytes:
    """JSON that is safe anywhere in a script, also inside an HTML `<script>` element."""
    text = orjson.dumps(value, option=orjson.OPT_INDENT_2)
    for raw, escaped in _ESCAPES:
        text = text.replace(raw, escaped)
    return text


_ESCAPES = (
    (b"<", b"\\u003c"),
    (b">", b"\\u003e"),
    (b"&", b"\\u0026"),
    ("\u2028".encode(), b"\\u2028"),
    ("\u2029".encode(), b"\\u2029"),
)


def render_inline(template: bytes | None, query: InlineQuery) -> bytes:
    """The script: a `static_files_dir` template as EventNative rendered it, or the built-in one."""
    config = script_json(query.settings)
    if template is None:
        return _BUILT_IN_HEAD + config + b", " + script_json(query.events) + _BUILT_IN_TAIL
    before, found, after = template.partition(CONFIG_PLACEHOLDER)
    if not found:
        raise HTTPError(500, "inline.js has no eventnConfig placeholder", "see docs/tracking-script.md")
    calls = b"".join(b"eventN.track(" + script_json(event) + b"); " for event in query.events)
    return before + config + after + calls
