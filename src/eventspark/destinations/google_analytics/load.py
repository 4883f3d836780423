"""The Google Analytics services.

Universal Analytics (`tracking_id`, EventNative's protocol): each event, after the mapping step
(whose rules make its fields Measurement Protocol parameters: `t`, `cid`, `dl`...), becomes a
hit: its top-level fields as URL parameters (strings as they are, other values as Go prints
them), `tid` and `v=1` added (the event's own dropped), `t` mapped as EventNative did (`conversion` → `transaction`; a
type GA does not know → `event`), keys sorted. A lone hit is `GET <endpoint>/collect?<hit>` (the
request EventNative made), or `POST <endpoint>/collect` when longer than 2,000 bytes; several go
as `POST <endpoint>/batch`, one hit per line, up to 20 hits and 16 KB.

GA4 (`measurement_id`, `api_secret`): `POST <endpoint>/mp/collect?measurement_id=...&api_secret=...`
with `{"client_id", "user_id"?, "timestamp_micros"?, "events": [{"name", "params"}]}`, up to 25
events of the same client, user and second per request (`timestamp_micros`: the first one's
`_timestamp`, left out when older than 72 hours, which GA4 would drop silently). An event's
`client_id` is its `client_id` field, else `cid`, else the user's `anonymous_id`
(`eventn_ctx.user` or `user`); `user_id` is its `user_id`, else `uid`, else the user's `id`;
the name is `event_name`, else `event_type` (`pageview`/`page` → `page_view`), which GA4 wants
as letters, digits and `_` (40 at most), not reserved (names; prefixes `google_`, `ga_`,
`firebase_`; the same for param names, 25 at most); the params are its `params` object, else
`page_location`, `page_title` and `page_referrer` from the event's `url`, `page_title` and
`referer` (top level or in `eventn_ctx`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson

from eventspark.destinations.google_analytics.configuration import GoogleAnalyticsConfig, GoogleAnalyticsDestination
from eventspark.destinations.http.config import base_url
from eventspark.destinations.http.service import HttpRequest, Probe, Refused, Service, chunks
from eventspark.destinations.http.sink import HttpSink
from eventspark.steps.gotemplate.errors import TemplateEvalError
from eventspark.steps.gotemplate.gofmt import go_value

PUBLIC_URL = "https://www.google-analytics.com"
HIT_TYPES = {
    "pageview": "pageview",
    "screenview": "screenview",
    "event": "event",
    "conversion": "transaction",
    "transaction": "transaction",
    "item": "item",
    "social": "social",
    "exception": "exception",
    "timing": "timing",
}
DEFAULT_HIT_TYPE = "event"
MAX_HIT_BYTES = 8192
"""Universal Analytics refuses larger hits."""
MAX_BATCH_BYTES = 16 * 1024
"""Universal Analytics refuses larger /batch bodies."""
MAX_GET_QUERY_BYTES = 2000
"""A lone hit longer than this goes by POST /collect (a URL holds 8,000 bytes at most)."""
_OWN = frozenset({"tid", "v"})
GA4_RESERVED_PREFIXES = ("google_", "ga_", "firebase_")
GA4_RESERVED_NAMES = frozenset(
    {
        "ad_activeview", "ad_click", "ad_exposure", "ad_query", "ad_reward", "adunit_exposure", "app_background",
        "app_clear_data", "app_exception", "app_remove", "app_store_refund", "app_store_subscription_cancel",
        "app_store_subscription_convert", "app_store_subscription_renew", "app_update", "app_upgrade",
        "dynamic_link_app_open", "dynamic_link_app_update", "dynamic_link_first_open", "error", "first_open",
        "first_visit", "in_app_purchase", "notification_dismiss", "notification_foreground", "notification_open",
        "notification_receive", "os_update", "session_start", "session_start_with_rollout", "user_engagement",
    }
)  # fmt: skip
"""Event names GA4 reserves (Measurement Protocol reference)."""
GA4_MAX_PARAMS = 25
GA4_MAX_AGE_SEC = 72 * 3600
"""GA4 drops events whose `timestamp_micros` is older than this: such an event is sent without one
(GA4 then counts it at arrival)."""
GA4_NAMES = {"pageview": "page_view", "page": "page_view"}
_GA4_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,39}")


def build(dest_id: str, dest: GoogleAnalyticsDestination, events_dir: Path) -> HttpSink:
    config = dest.google_analytics
    service: Service = UniversalAnalytics(config) if config.tracking_id else GA4(config)
    return HttpSink(dest_id, service, config)


class UniversalAnalytics(Service):
    name = "Google Analytics"
    batch_size = 20

    def __init__(self, config: GoogleAnalyticsConfig) -> None:
        assert config.tracking_id
        self.tracking_id = config.tracking_id
        self.base = base_url(config, PUBLIC_URL)

    def probe(self) -> Probe:
        """One hit to the validation server (`/debug/collect`), which records nothing."""
        hit = urlencode({"v": "1", "tid": self.tracking_id, "cid": PROBE_CLIENT, "t": "event", "ec": "eventspark"})
        return Probe(self.base, HttpRequest("GET", f"{self.base}/debug/collect?{hit}", ()), _ua_verdict)

    def payload(self, event: dict[str, Any]) -> str:
        params = [("tid", self.tracking_id), ("v", "1")]
        try:
            for key, value in event.items():
                if key in _OWN:  # the destination's own: an event cannot send them elsewhere
                    continue
                text = value if type(value) is str else go_value(value)
                if key == "t":
                    text = HIT_TYPES.get(text, DEFAULT_HIT_TYPE)
                params.append((key, text))
        except TemplateEvalError as exc:
            raise Refused(str(exc)) from None
        hit = urlencode(sorted(params, key=lambda item: item[0]))  # Go's url.Values.Encode sorts keys
        if len(hit.encode()) > MAX_HIT_BYTES:
            raise Refused(f"the hit is longer than {MAX_HIT_BYTES} bytes")
        return hit

    def requests(self, payloads: Sequence[tuple[int, Any]]) -> Iterable[HttpRequest]:
        for group in _ua_batches(payloads):
            positions = tuple(position for position, _ in group)
            if len(group) > 1:
                body = "\n".join(hit for _, hit in group).encode()
                yield HttpRequest("POST", f"{self.base}/batch", positions, body, {"Content-Type": "text/plain"})
                continue
            hit = group[0][1]
            if len(hit) <= MAX_GET_QUERY_BYTES:  # EventNative's request
                yield HttpRequest("GET", f"{self.base}/collect?{hit}", positions)
            else:  # too long for a URL: the same hit as a body
                headers = {"Content-Type": "text/plain"}
                yield HttpRequest("POST", f"{self.base}/collect", positions, hit.encode(), headers)


def _ua_batches(payloads: Sequence[tuple[int, str]]) -> Iterator[list[tuple[int, str]]]:
    """Hits in batches of at most `UniversalAnalytics.batch_size` hits and `MAX_BATCH_BYTES`."""
    group: list[tuple[int, str]] = []
    size = 0
    for position, hit in payloads:
        added = len(hit) + (1 if group else 0)  # hits are ASCII (url-encoded)
        if group and (len(group) == UniversalAnalytics.batch_size or size + added > MAX_BATCH_BYTES):
            yield group
            group, size = [], 0
            added = len(hit)
        group.append((position, hit))
        size += added
    if group:
        yield group


class GA4(Service):
    name = "Google Analytics 4"
    batch_size = 25

    def __init__(self, config: GoogleAnalyticsConfig) -> None:
        assert config.measurement_id and config.api_secret
        self.secret = config.api_secret.get_secret_value()
        query = urlencode({"measurement_id": config.measurement_id, "api_secret": self.secret})
        self.url = f"{base_url(config, PUBLIC_URL)}/mp/collect?{query}"
        self.debug_url = f"{base_url(config, PUBLIC_URL)}/debug/mp/collect?{query}"

    def probe(self) -> Probe:
        """One event to the validation server (`/debug/mp/collect`), which records nothing."""
        body = orjson.dumps({"client_id": PROBE_CLIENT, "events": [{"name": "eventspark_probe"}]})
        request = HttpRequest("POST", self.debug_url, (), body, {"Content-Type": "application/json"})
        return Probe(self.url, request, _ga4_verdict)

    def secrets(self) -> Iterable[str]:
        return (self.secret,)

    def payload(self, event: dict[str, Any]) -> tuple[tuple[str, str | None], bytes, int | None]:
        """((client_id, user_id), the GA4 event as JSON, timestamp_micros)."""
        context = event.get("eventn_ctx") if isinstance(event.get("eventn_ctx"), dict) else event
        user = context.get("user") if isinstance(context.get("user"), dict) else {}
        client = _first(event.get("client_id"), event.get("cid"), user.get("anonymous_id"))
        if client is None:
            raise Refused("the event has no client_id (nor cid, nor user.anonymous_id)")
        user_id = _first(event.get("user_id"), event.get("uid"), user.get("id"))
        raw_name = _first(event.get("event_name"), event.get("event_type"))
        if raw_name is None:
            raise Refused("the event has no event_name nor event_type")
        name = GA4_NAMES.get(raw_name, raw_name)
        _check_ga4_name("event name", name)
        if name in GA4_RESERVED_NAMES:
            raise Refused(f"event name {name!r} is reserved by GA4")
        params = event.get("params")
        if not isinstance(params, dict):
            params = {}
            for param, key in (("page_location", "url"), ("page_title", "page_title"), ("page_referrer", "referer")):
                value = _first(event.get(key), context.get(key))
                if value is not None:
                    params[param] = value
        if len(params) > GA4_MAX_PARAMS:
            raise Refused(f"{len(params)} params: GA4 takes {GA4_MAX_PARAMS} at most")
        for param in params:
            _check_ga4_name("param name", param)
        try:
            item = orjson.dumps({"name": name, "params": params})
        except TypeError as exc:  # orjson.JSONEncodeError: nested too deep, a key not a string...
            raise Refused(f"the params cannot be sent as JSON: {exc}") from None
        micros = _micros(event.get("_timestamp"))
        if micros is not None and micros < (time.time() - GA4_MAX_AGE_SEC) * 1_000_000:
            micros = None  # GA4 would drop it silently: counted at arrival instead
        return (client, user_id), item, micros

    def requests(self, payloads: Sequence[tuple[int, Any]]) -> Iterable[HttpRequest]:
        # One request carries one client, user and timestamp: events of the same second share it.
        groups: dict[tuple[str, str | None, int | None], list[tuple[int, bytes, int | None]]] = {}
        for position, (who, item, micros) in payloads:
            second = None if micros is None else micros // 1_000_000
            groups.setdefault((*who, second), []).append((position, item, micros))
        for (client, user_id, _), items in groups.items():
            for group in chunks(items, self.batch_size):
                body: dict[str, Any] = {"client_id": client}
                if user_id is not None:
                    body["user_id"] = user_id
                if group[0][2] is not None:
                    body["timestamp_micros"] = group[0][2]
                head = orjson.dumps(body)[:-1] + b',"events":['  # the events already encoded
                encoded = head + b",".join(item for _, item, _ in group) + b"]}"
                positions = tuple(position for position, _, _ in group)
                yield HttpRequest("POST", self.url, positions, encoded, {"Content-Type": "application/json"})


def _check_ga4_name(what: str, name: str) -> None:
    if not _GA4_NAME.fullmatch(name):
        raise Refused(f"{what} {name[:60]!r} is not a GA4 name (a letter, then letters, digits, _; 40 at most)")
    if name.startswith(GA4_RESERVED_PREFIXES):
        raise Refused(f"{what} {name!r}: the prefixes {', '.join(GA4_RESERVED_PREFIXES)} are reserved by GA4")


def _first(*values: Any) -> str | None:
    for value in values:
        if value is not None and value != "":
            return value if type(value) is str else go_value(value)
    return None


def _micros(value: Any) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1_000_000)


PROBE_CLIENT = "eventspark.probe"
"""The client id of destination tests' validation requests."""


def _ua_verdict(status: int, body: str) -> str | None:
    if not 200 <= status <= 299:
        return f"HTTP {status}"
    try:
        results = orjson.loads(body)["hitParsingResult"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        results = None
    if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
        return "the validation server's answer is not the expected JSON"
    if all(result.get("valid") for result in results):
        return None
    problems = [m.get("description", "") for r in results if not r.get("valid") for m in r.get("parserMessage", [])]
    return "; ".join(problems) or "the hit is not valid"


def _ga4_verdict(status: int, body: str) -> str | None:
    if not 200 <= status <= 299:
        return f"HTTP {status}"
    try:
        messages = orjson.loads(body).get("validationMessages", [])
    except (orjson.JSONDecodeError, AttributeError):
        messages = None
    if not isinstance(messages, list):
        return "the validation server's answer is not the expected JSON"
    return "; ".join(str(m.get("description", m) if isinstance(m, dict) else m) for m in messages) or None
