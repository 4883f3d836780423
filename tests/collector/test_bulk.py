"""Bulk uploads: multipart parts, NDJSON lines."""

from __future__ import annotations

import pytest

from eventspark.collector.bulk import bulk_events, parse_ndjson
from eventspark.collector.http import HTTPError

BOUNDARY = "b0undary"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


def multipart(*parts: tuple[str, bytes]) -> bytes:
    body = b""
    for disposition, data in parts:
        body += f"--{BOUNDARY}\r\nContent-Disposition: form-data; {disposition}\r\n\r\n".encode() + data + b"\r\n"
    return body + f"--{BOUNDARY}--\r\n".encode()


def test_the_file_part_is_chosen() -> None:
    body = multipart(('name="note"', b'{"no": 1}'), ('name="upload"; filename="e.ndjson"', b'{"n": 1}\n{"n": 2}'))
    assert bulk_events(body, CONTENT_TYPE, 1024) == [{"n": 1}, {"n": 2}]


def test_a_part_named_file_then_the_first_part() -> None:
    named = multipart(('name="x"', b'{"x": 1}'), ('name="file"', b'{"f": 1}'))
    assert bulk_events(named, CONTENT_TYPE, 1024) == [{"f": 1}]
    assert bulk_events(multipart(('name="x"', b'{"x": 1}')), CONTENT_TYPE, 1024) == [{"x": 1}]


@pytest.mark.parametrize(
    ("body", "content_type", "error"),
    [
        (multipart(('name="file"', b'{"n": 1}'))[:-12], CONTENT_TYPE, "ends before"),
        (b"--x\r\n", "multipart/form-data", "without a boundary"),
        (multipart(('name="file"', b'{"n": 1}\n[1]')), CONTENT_TYPE, "line 2: expected a JSON object"),
        (b'{"a": 1}\n{"b": "' + b"x" * 2000 + b'"}', "application/x-ndjson", "line 2: larger than"),
    ],
)
def test_bad_uploads(body: bytes, content_type: str, error: str) -> None:
    with pytest.raises(HTTPError, match="Failed to parse body") as raised:
        bulk_events(body, content_type, 1024)
    assert error in raised.value.error


def test_ndjson_skips_blank_lines_and_carriage_returns() -> None:
    assert parse_ndjson(b'\r\n{"a": 1}\r\n\r\n  \n{"b": 2}', 1024) == [{"a": 1}, {"b": 2}]
