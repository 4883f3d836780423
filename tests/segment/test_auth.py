"""Reading Segment's write key from HTTP basic auth (`eventspark.collector.auth.basic_auth_user`)."""

from __future__ import annotations

import base64

import pytest

from eventspark.collector.auth import basic_auth_user
from eventspark.collector.http import Request


def request_with(authorization: bytes | None) -> Request:
    headers = [] if authorization is None else [(b"authorization", authorization)]
    scope = {"type": "http", "method": "POST", "path": "/api/v1/segment", "headers": headers, "query_string": b""}

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b""}

    return Request(scope, receive)


def basic(credentials: bytes) -> bytes:
    return b"Basic " + base64.b64encode(credentials)


@pytest.mark.parametrize(
    ("authorization", "user"),
    [
        (basic(b"WK123:"), "WK123"),  # what Segment libraries send
        (basic(b"WK123:secret"), "WK123"),  # the password is ignored
        (basic(b"WK123"), "WK123"),  # no colon at all
        (b"basic " + base64.b64encode(b"key:"), "key"),  # the scheme is case-insensitive
        (basic("clé:".encode()), "clé"),
        (basic(b":password"), None),  # no user
        (basic(b"\xff\xfe:"), None),  # not UTF-8
        (b"Basic not*base64", None),
        (b"Bearer token", None),
        (b"Basic", None),
        (basic(b"k" * 5000 + b":"), None),  # bounded work on untrusted headers
        (None, None),
    ],
)
def test_basic_auth_user(authorization: bytes | None, user: str | None) -> None:
    assert basic_auth_user(request_with(authorization)) == user
