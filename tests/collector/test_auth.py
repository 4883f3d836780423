"""Token lookup, origin patterns and the admin check."""

from __future__ import annotations

from typing import Any

import pytest

from eventspark.collector.auth import (
    OriginRules,
    TokenTable,
    check_admin,
    cors_headers,
    plain_query_token,
    request_token,
)
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
        (b"p_k=pp", {b"api_key": b"ak"}, "pp"),
        (b"", {b"api_key": b"ak", b"authorization": b"Basic dXNlcjo="}, "ak"),
        (b"", {b"authorization": b"Basic dXNlcjo="}, "user"),  # base64("user:")
        (b"", {b"authorization": b"Bearer dXNlcjo="}, None),
    ],
)
def test_token_lookup_order(query: bytes, headers: dict[bytes, bytes], expected: str | None) -> None:
    assert request_token(request(query, headers)) == expected


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (b"token=abc", "abc"),
        (b"token=", None),
        (b"", None),
        (b"token=a%2Bb", None),
        (b"token=a+b", None),
        (b"token=abc&x=1", None),
        (b"x=1&token=abc", None),
        (b"tokens=abc", None),
    ],
)
def test_plain_query_token_only_for_a_query_with_nothing_to_decode(query: bytes, expected: str | None) -> None:
    # Anything else goes through `request_token`, which finds the same secret for the plain form.
    assert plain_query_token(query) == expected
    if expected is not None:
        assert request_token(request(query)) == expected


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


def test_plain_queries_find_what_the_general_lookup_finds() -> None:
    secrets = ["js", "a&b", "a%b", "a+b", "café", "日本", "s p"]
    table = TokenTable([ApiKey(id=f"k{n}", client_secret=s, server_secret=f"s{n}") for n, s in enumerate(secrets)])
    queries = [b"token=" + s.encode() for s in secrets] + [b"token=caf\xe9", b"token=s0", b"token=", b"x=1&token=js"]
    for query in queries:
        plain = plain_query_token(query)
        expected = table.require_client(plain) if plain is not None and table.client(plain) else None
        assert table.by_plain_query.get(query) == expected, query
    # Query strings are read as latin-1: "café" arrives as b"caf\xe9" when not percent-encoded.
    assert sorted(table.by_plain_query) == [b"token=caf\xe9", b"token=js", b"token=s p"]


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
