"""The Facebook Conversions API service, with EventNative's field handling.

Each event (after the mapping step, which makes it a Conversions API event) becomes one element
of the request's `data` array: `action_source` defaults to `website`; `event_time` is the Unix
second of `_timestamp` (now when missing or unreadable), and `_timestamp` is removed;
`event_name` is required (a string) and `page`, `pageview`, `app_page` become `PageView`,
`conversion` `Purchase`, `signup` `CompleteRegistration`; in `user_data`, `em ph ge db ln fn ct st
zp country` are normalised (trimmed, lower-case; `ph` digits only; `ct` without spaces) and
replaced by their SHA-256 (hex), each element of a list alike, unless already a SHA-256 (64 hex
digits) (EventNative hashed without normalising, and `em` only when it held an `@`); `event_id`
defaults to the event's id, so that Facebook drops an event sent again;
`test_event_code` moves from the event to the request. Events with different test codes go in
different requests; up to 100 events per request (Facebook takes 1,000).
"""

from __future__ import annotations

import copy
import hashlib
import re
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson

from eventspark.destinations.facebook.configuration import FacebookConfig, FacebookDestination
from eventspark.destinations.http.config import base_url
from eventspark.destinations.http.service import HttpRequest, Probe, Refused, Service, chunks
from eventspark.destinations.http.sink import HttpSink
from eventspark.logs.failed import event_id_of
from eventspark.steps.gotemplate.gofmt import go_value

PUBLIC_URL = "https://graph.facebook.com"
BATCH = 100
EVENT_NAMES = {
    "page": "PageView",
    "pageview": "PageView",
    "app_page": "PageView",
    "conversion": "Purchase",
    "signup": "CompleteRegistration",
}
HASHED = ("em", "ph", "ge", "db", "ln", "fn", "ct", "st", "zp", "country")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def build(dest_id: str, dest: FacebookDestination, events_dir: Path) -> HttpSink:
    return HttpSink(dest_id, Facebook(dest.facebook), dest.facebook)


class Facebook(Service):
    name = "Facebook"
    batch_size = BATCH

    def __init__(self, config: FacebookConfig) -> None:
        self.token = config.access_token.get_secret_value()
        query = urlencode({"access_token": self.token, "locale": "en_EN"})
        self.url = f"{base_url(config, PUBLIC_URL)}/{config.api_version}/{config.pixel_id}/events?{query}"

    def secrets(self) -> Iterable[str]:
        return (self.token,)

    def probe(self) -> Probe:
        """EventNative's test: an empty `data` list, which the Graph API refuses after checking
        the token (error 190) and the pixel (803, or 100 GraphMethodException)."""
        request = HttpRequest("POST", self.url, (), b'{"data":[]}', {"Content-Type": "application/json"})
        return Probe(self.url, request, _probe_verdict)

    def payload(self, event: dict[str, Any]) -> tuple[str, bytes]:
        """(test_event_code, the `data` element as JSON)."""
        item = copy.deepcopy(event)
        item.setdefault("action_source", "website")
        item["event_time"] = _event_time(item.pop("_timestamp", None))
        name = item.get("event_name")
        if name is None:
            raise Refused("the event has no event_name (map one with data_layout.mappings)")
        if not isinstance(name, str):
            raise Refused(f"event_name must be a string, not {type(name).__name__}")
        item["event_name"] = EVENT_NAMES.get(name, name)
        if item.get("event_id") in (None, ""):  # Facebook deduplicates on event_id (and event_name)
            event_id = event_id_of(event)
            if event_id:
                item["event_id"] = event_id
        user = item.get("user_data")
        if isinstance(user, dict):
            for key in HASHED:
                if user.get(key) is not None:
                    value = user[key]
                    user[key] = [_hashed(key, v) for v in value] if isinstance(value, list) else _hashed(key, value)
        code = item.pop("test_event_code", None)
        try:
            data = orjson.dumps(item, option=orjson.OPT_SORT_KEYS)
        except TypeError as exc:  # orjson.JSONEncodeError: nested too deep, a key not a string...
            raise Refused(f"the event cannot be sent as JSON: {exc}") from None
        return ("" if code is None else go_value(code)), data

    def requests(self, payloads: Sequence[tuple[int, Any]]) -> Iterable[HttpRequest]:
        groups: dict[str, list[tuple[int, bytes]]] = {}
        for position, (code, data) in payloads:
            groups.setdefault(code, []).append((position, data))
        for code, items in groups.items():
            tail = b"]" + (b',"test_event_code":' + orjson.dumps(code) if code else b"") + b"}"
            for group in chunks(items, self.batch_size):
                body = b'{"data":[' + b",".join(data for _, data in group) + tail
                positions = tuple(position for position, _ in group)
                yield HttpRequest("POST", self.url, positions, body, {"Content-Type": "application/json"})


def _event_time(value: Any) -> int:
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
            return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp())
        except ValueError:
            pass
    return int(time.time())


def _hashed(key: str, value: Any) -> Any:
    """A `user_data` value as the Conversions API wants it: normalised (trimmed, lower-case;
    phone: digits only; city: no spaces), then SHA-256 (hex); a value that already is a SHA-256
    (64 hex digits) is left as it is."""
    text = go_value(value).strip().lower()
    if _SHA256.fullmatch(text):
        return text
    if key == "ph":
        text = "".join(c for c in text if c.isdigit())
    elif key == "ct":
        text = "".join(text.split())
    return _sha256(text)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _probe_verdict(status: int, body: str) -> str | None:
    try:
        error = orjson.loads(body).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        error = None
    if not isinstance(error, dict):  # not the Graph API's error document
        return None if 200 <= status <= 299 else f"HTTP {status}"
    code, kind, message = error.get("code"), error.get("type"), error.get("message", "")
    if code == 190:
        return f"the access token is not valid: {message}"
    if code == 803 or (code == 100 and kind == "GraphMethodException"):
        return f"the pixel id is not valid: {message}"
    if status >= 500 or status == 429:  # an outage or a rate limit proves nothing
        return f"HTTP {status}: {message}"
    return None  # any other refusal is about the empty event list: token and pixel are fine
