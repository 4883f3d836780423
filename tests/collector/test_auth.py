"""Token lookup, origin patterns and the admin check."""

from __future__ import annotations

from typing import Any

import pytest

from eventspark.collector.auth import OriginRules, TokenTable, check_admin, cors_headers, request_token
from eventspark.collector.http import HTTPError, Request
from eventspark.config.models import ApiKey


def request(query: bytes = b"", headers: dict[bytes, bytes] | None = None) -> Request:
    scope: dict[str, Any] = {
        "method": "POST",
        "path": "/api/v1/event",
        "query_string": query,
        "headers": list((headers or {}).items()),
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    return Request(scope, receive)


@pytest.mark.parametrize(
    ("query", "headers", "expected"),
    [
        (b"", {}, None),
        (b"token=abc", {}, "abc"),
        (b"token=", {}, None),
        (b"token=a%2Bb%20c", {}, "a+b c"),
        (b"x=1&token=abc", {b"x-auth-token": b"hdr"}, "abc"),
        (b"p_k=pp", {b"x-auth-token": b"hdr"}, "hdr"),
        (b"a=1&p_k=pp&p_j=qq", {}, "pp"),
        (b"token=&p_k=pp", {}, "pp"),
        (b"tokens=no&ptoken=no", {}, None),
    ],
)
def test_token_lookup_order(query: bytes, headers: dict[bytes, bytes], expected: str | None) -> None:
    assert request_token(request(query, headers)) == expected


@pytest.mark.parametrize(
    ("patterns", "origin", "allowed"),
    [
        ([], "https://anything", True),
        (["*example.com"], "https://a.example.com", True),
        (["*example.com"], "https://example.com.evil", False),
        (["app.*"], "http://app.example.com", True),
        (["app.*"], "http://myapp.example.com", False),
        (["*shop*"], "https://my-shop-site.io", True),
        (["*shop*"], "https://store.io", False),
        (["https://exact.org"], "http://exact.org", True),
        (["exact.org"], "https://exact.org:8443", False),
        (["*"], "https://whatever", True),
        (["a.com", "*b.com"], "https://x.b.com", True),
    ],
)
def test_origin_patterns(patterns: list[str], origin: str, allowed: bool) -> None:
    assert OriginRules(patterns).allows(origin) is allowed


def test_cors_header_only_for_an_allowed_origin() -> None:
    rules = OriginRules(["*example.com"])
    allowed = request(headers={b"origin": b"https://www.example.com"})
    assert cors_headers(allowed, rules) == [(b"access-control-allow-origin", b"https://www.example.com")]
    assert cors_headers(request(headers={b"origin": b"https://evil.io"}), rules) == []
    assert cors_headers(request(), rules) == []


def test_token_table_separates_client_and_server_secrets() -> None:
    table = TokenTable([ApiKey(id="a", client_secret="c", server_secret="s"), ApiKey.model_validate("both")])
    assert table.client("c").id == "a"  # type: ignore[union-attr]
    assert table.client("s") is None
    assert table.server("s").id == "a"  # type: ignore[union-attr]
    assert table.server("c") is None
    assert table.client("both") is table.server("both") is not None
    assert table.require_client("c")[1] == "c"
    with pytest.raises(HTTPError, match="The token is not found"):
        table.require_client("s")
    with pytest.raises(HTTPError, match="isn't a server token"):
        table.require_server("c")
    with pytest.raises(HTTPError) as missing:
        table.require_server(None)
    assert missing.value.status == 401 and "X-Auth-Token" in missing.value.error


def test_admin_check() -> None:
    check_admin(request(b"token=adm"), "adm")
    check_admin(request(headers={b"x-admin-token": b"adm"}), "adm")
    for given, configured, message in [
        (request(b"token=adm"), None, "Admin token is not configured"),
        (request(b"token=adm"), "", "Admin token is not configured"),
        (request(b"token=ad"), "adm", "Admin token does not match"),
        (request(), "adm", "Admin token does not match"),
    ]:
        with pytest.raises(HTTPError, match=message) as raised:
            check_admin(given, configured)
        assert raised.value.status == 401
