"""The Amplitude service: `POST <endpoint>/2/httpapi` with `{"api_key": ..., "events": [...]}`,
each event as it is after the mapping step (as EventNative sent it: the mappings make it an
Amplitude event, with `event_type` and `user_id` or `device_id`). `insert_id` defaults to the
event's id (`eventn_ctx.event_id` or `eventn_ctx_event_id`, when the mapped event still has it), so
that Amplitude drops an event sent again after a stop or a retry. A 400 naming the bad events
fails those only (the others are sent again); a 400 "Invalid API key" fails the request's events
without splitting."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from eventspark.destinations.amplitude.configuration import AmplitudeConfig, AmplitudeDestination
from eventspark.destinations.http.service import HttpRequest, Probe, Refused, Service, Verdict, chunks
from eventspark.destinations.http.sink import HttpSink
from eventspark.logs.failed import event_id_of

PUBLIC_URL = "https://api.amplitude.com/2/httpapi"
API_PATH = "/2/httpapi"
BATCH = 100
"""Events per request (Amplitude takes up to 2,000 and 1 MB; it counts limits per device too)."""


def build(dest_id: str, dest: AmplitudeDestination, events_dir: Path) -> HttpSink:
    return HttpSink(dest_id, Amplitude(dest.amplitude), dest.amplitude)


class Amplitude(Service):
    name = "Amplitude"
    batch_size = BATCH

    def __init__(self, config: AmplitudeConfig) -> None:
        self.api_key = config.api_key.get_secret_value()
        endpoint = config.endpoint
        if endpoint is None:
            self.url = PUBLIC_URL
        elif urlsplit(endpoint).path in ("", "/"):
            self.url = endpoint + API_PATH
        else:  # EventNative's spelling: the whole URL
            self.url = endpoint

    def secrets(self) -> Iterable[str]:
        return (self.api_key,)

    def probe(self) -> Probe:
        """A connection only: Amplitude checks a key only on a request that records an event."""
        return Probe(self.url)

    def payload(self, event: dict[str, Any]) -> bytes:
        if not isinstance(event.get("event_type"), str) or not event["event_type"]:
            raise Refused("the event has no event_type (map one with data_layout.mappings)")
        if event.get("user_id") in (None, "") and event.get("device_id") in (None, ""):
            raise Refused("the event has neither user_id nor device_id (map one with data_layout.mappings)")
        if event.get("insert_id") in (None, ""):  # Amplitude drops a resent event with the same insert_id
            event_id = event_id_of(event)
            if event_id:
                event = {**event, "insert_id": event_id}
        try:
            return orjson.dumps(event, option=orjson.OPT_SORT_KEYS)  # as Go marshals a map
        except TypeError as exc:  # orjson.JSONEncodeError: nested too deep, a key not a string...
            raise Refused(f"the event cannot be sent as JSON: {exc}") from None

    def refusal(self, status: int, body: str, count: int) -> Verdict | None:
        """Amplitude's 400 names the bad events (`events_with_invalid_fields`,
        `events_with_missing_fields`: field → indices in the request); "Invalid API key" refuses
        the request itself."""
        if status != 400:
            return None
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(answer, dict):
            return None
        error = answer.get("error")
        if (isinstance(error, str) and "api key" in error.lower()) or answer.get("missing_field") == "api_key":
            return Verdict(whole=True)
        bad: dict[int, list[str]] = {}
        for key, what in (("events_with_invalid_fields", "invalid"), ("events_with_missing_fields", "missing")):
            fields = answer.get(key)
            if not isinstance(fields, dict):
                continue
            for field, indices in fields.items():
                for index in indices if isinstance(indices, list) else ():
                    if type(index) is int and 0 <= index < count:
                        bad.setdefault(index, []).append(f"{what} field {field}")
        return Verdict(bad={index: ", ".join(why) for index, why in bad.items()}) if bad else None

    def requests(self, payloads: Sequence[tuple[int, Any]]) -> Iterable[HttpRequest]:
        head = b'{"api_key":' + orjson.dumps(self.api_key) + b',"events":['
        for group in chunks(payloads, self.batch_size):
            body = head + b",".join(encoded for _, encoded in group) + b"]}"
            positions = tuple(position for position, _ in group)
            yield HttpRequest("POST", self.url, positions, body, {"Content-Type": "application/json"})
