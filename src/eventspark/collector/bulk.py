"""`POST /api/v1/events/bulk`: a multipart upload (or a plain body) of newline-delimited JSON events.

Processed synchronously and atomically: every line is parsed and checked before anything is
written, so a bad line rejects the whole upload (400 naming the line) and a retry cannot
duplicate events.
"""

from __future__ import annotations

from typing import Any

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from eventspark.collector.body import parse_failed, parse_json
from eventspark.collector.http import HTTPError

BULK_SIZE_FACTOR = 64
"""A bulk upload may be this many times `server.max_event_size`."""


def bulk_limit(max_event_size: int) -> int:
    return BULK_SIZE_FACTOR * max_event_size


def bulk_events(body: bytes, content_type: str | None, max_event_size: int) -> list[dict[str, Any]]:
    """The events of an upload: the multipart file part (or the whole body), one object per line."""
    mime, params = parse_options_header(content_type)
    if mime == b"multipart/form-data":
        boundary = params.get(b"boundary")
        if not boundary:
            raise parse_failed("multipart body without a boundary in Content-Type")
        body = _file_part(body, boundary)
    return parse_ndjson(body, max_event_size)


def parse_ndjson(payload: bytes, max_event_size: int) -> list[dict[str, Any]]:
    events = []
    for number, raw in enumerate(payload.split(b"\n"), 1):
        line = raw.strip()
        if not line:
            continue
        if len(line) > max_event_size:
            raise parse_failed(f"line {number}: larger than {max_event_size} bytes (server.max_event_size)")
        try:
            value = parse_json(line)
        except HTTPError as exc:
            raise parse_failed(f"line {number}: {exc.error}") from None
        if not isinstance(value, dict):
            raise parse_failed(f"line {number}: expected a JSON object, got {type(value).__name__}")
        events.append(value)
    return events


class _Parts:
    """Collects the parts of a multipart body: their Content-Disposition and data."""

    def __init__(self) -> None:
        self.parts: list[tuple[dict[bytes, bytes], list[bytes]]] = []
        self.ended = False
        self._field = b""
        self._value = b""

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_part_begin": lambda: self.parts.append(({}, [])),
            "on_header_field": lambda d, s, e: setattr(self, "_field", self._field + d[s:e]),
            "on_header_value": lambda d, s, e: setattr(self, "_value", self._value + d[s:e]),
            "on_header_end": self._header_end,
            "on_part_data": lambda d, s, e: self.parts[-1][1].append(d[s:e]),
            "on_end": lambda: setattr(self, "ended", True),
        }

    def _header_end(self) -> None:
        if self._field.lower() == b"content-disposition":
            self.parts[-1][0].update(parse_options_header(self._value)[1])
        self._field = self._value = b""


def _file_part(body: bytes, boundary: bytes) -> bytes:
    parts = _Parts()
    try:
        parser = MultipartParser(boundary, parts.callbacks())  # type: ignore[arg-type]
        parser.write(body)
        parser.finalize()
    except FormParserError as exc:
        raise parse_failed(f"multipart: {exc}") from None
    if not parts.ended or not parts.parts:
        raise parse_failed("multipart: the body ends before its closing boundary")
    # The uploaded file: a part with a filename, else the part named `file`, else the first part.
    chosen = next((p for p in parts.parts if b"filename" in p[0]), None)
    chosen = chosen or next((p for p in parts.parts if p[0].get(b"name") == b"file"), parts.parts[0])
    return b"".join(chosen[1])
