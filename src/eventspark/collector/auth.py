"""Tokens, admin token and CORS, as EventNative answered them.

A secret is looked up in a dict keyed by the secret itself: CPython compares string contents
only when the randomised (SipHash) hashes are equal, so the lookup time says nothing about how
much of a guess is right. The match is then confirmed with `hmac.compare_digest`. The JS SDK's
query string, `token=<client secret>`, is looked up whole in the same way (`by_plain_query`),
where the dict's equality test is the confirmation.
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from eventspark.collector.http import Headers, HTTPError, Request
from eventspark.config.models import ApiKey

TOKEN_NOT_FOUND = "The token is not found"
NOT_SERVER_TOKEN = "The token isn't a server token. Please use s2s integration token"
_AMP, _PERCENT, _PLUS = b"&%+"

PREFLIGHT_HEADERS: Headers = [
    (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
    (
        b"access-control-allow-headers",
        b"Origin, X-Requested-With, Content-Type, Accept, Authorization, X-Auth-Token, X-Admin-Token",
    ),
    (b"access-control-max-age", b"86400"),
    (b"access-control-allow-credentials", b"true"),
]


# --- origins --------------------------------------------------------------------------------------


def strip_scheme(origin: str) -> str:
    _, sep, rest = origin.partition("://")
    return rest if sep else origin


class OriginRules:
    """A token's `origins`: `*x` ends with x, `x*` starts with x, `*x*` contains x, else equal.

    Schemes are stripped from patterns and origins before matching; no pattern allows all.
    """

    __slots__ = ("_contains", "_exact", "_prefixes", "_suffixes", "allow_all")

    def __init__(self, patterns: Iterable[str]) -> None:
        self._exact: set[str] = set()
        self._prefixes: list[str] = []
        self._suffixes: list[str] = []
        self._contains: list[str] = []
        for pattern in patterns:
            self._add(strip_scheme(pattern.strip()))
        self.allow_all = not (self._exact or self._prefixes or self._suffixes or self._contains)

    def _add(self, pattern: str) -> None:
        if len(pattern) >= 2 and pattern.startswith("*") and pattern.endswith("*"):
            self._contains.append(pattern[1:-1])
        elif pattern.startswith("*"):
            self._suffixes.append(pattern[1:])
        elif pattern.endswith("*"):
            self._prefixes.append(pattern[:-1])
        elif pattern:
            self._exact.add(pattern)

    def allows(self, origin: str) -> bool:
        if self.allow_all:
            return True
        host = strip_scheme(origin)
        return (
            host in self._exact
            or any(host.endswith(s) for s in self._suffixes)
            or any(host.startswith(p) for p in self._prefixes)
            or any(c in host for c in self._contains)
        )


def cors_headers(request: Request, rules: OriginRules | None) -> Headers:
    """`Access-Control-Allow-Origin` echoing the Origin when `rules` allow it; [] otherwise."""
    origin = request.headers.get(b"origin")
    return [] if origin is None else origin_headers(origin, rules)


def origin_headers(origin: bytes, rules: OriginRules | None) -> Headers:
    """`cors_headers` for a request's Origin header value."""
    if rules is None or not (rules.allow_all or rules.allows(origin.decode("latin-1"))):
        return []
    # Only the header the reference requires: event answers are not cached (no `Vary`), and the
    # preflight already allows credentials; every header costs on the hot path.
    return [(b"access-control-allow-origin", origin)]


# --- tokens ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Token:
    """A configured token as the collector uses it."""

    id: str
    client_secret: str
    server_secret: str
    origins: OriginRules


class TokenTable:
    """Finds tokens by client or server secret."""

    def __init__(self, keys: Sequence[ApiKey]) -> None:
        self.tokens = [Token(k.id, k.client_secret, k.server_secret, OriginRules(k.origins)) for k in keys]
        self.by_id = {t.id: t for t in self.tokens}
        self._client = _by_secret((t.client_secret, t) for t in self.tokens)
        self._server = _by_secret((t.server_secret, t) for t in self.tokens)
        self.by_plain_query = _by_plain_query(self._client)
        """(token, secret) by the raw query string `token=<client secret>` (see `plain_query_token`)."""

    @staticmethod
    def _find(table: dict[str, tuple[bytes, Token]], secret: str) -> Token | None:
        found = table.get(secret)
        if found is None:
            return None
        expected, token = found
        return token if hmac.compare_digest(expected, secret.encode()) else None

    def client(self, secret: str) -> Token | None:
        return self._find(self._client, secret)

    def server(self, secret: str) -> Token | None:
        return self._find(self._server, secret)

    def require_client(self, secret: str | None) -> tuple[Token, str]:
        """(token, secret) for a JS endpoint; 401 for a missing, unknown or server-only secret."""
        found = self._client.get(secret) if secret else None
        if found is None or secret is None or not hmac.compare_digest(found[0], secret.encode()):
            raise HTTPError(401, TOKEN_NOT_FOUND, _token_error(secret))
        return found[1], secret

    def require_server(self, secret: str | None) -> tuple[Token, str]:
        """(token, secret) for a server-to-server endpoint; 401 for a client secret or an unknown one."""
        token = self.server(secret) if secret else None
        if token is not None and secret is not None:
            return token, secret
        if secret and self.client(secret) is not None:
            raise HTTPError(401, NOT_SERVER_TOKEN, "the secret is a client (JS) secret")
        raise HTTPError(401, TOKEN_NOT_FOUND, _token_error(secret))


def _by_secret(pairs: Iterable[tuple[str, Token]]) -> dict[str, tuple[bytes, Token]]:
    return {secret: (secret.encode(), token) for secret, token in pairs if secret}


def _by_plain_query(client: dict[str, tuple[bytes, Token]]) -> dict[bytes, tuple[Token, str]]:
    table = {}
    for secret, (_, token) in client.items():
        try:
            query = b"token=" + secret.encode("latin-1")
        except UnicodeEncodeError:  # such a secret can only come percent-encoded
            continue
        if plain_query_token(query) == secret:  # else only `request_token` can read it
            table[query] = (token, secret)
    return table


def _token_error(secret: str | None) -> str:
    if not secret:
        return "no token in the 'token' query parameter, the X-Auth-Token header or a 'p_*' query parameter"
    return "no configured token has this secret"


def plain_query_token(raw: bytes) -> str | None:
    """The secret of the JS SDK's query string, `token=<secret>` alone with nothing to decode; else None.

    Such a query needs no parsing, and `request_token` would find the same secret first.
    """
    # An int `in` bytes is a memchr; a bytes `in` bytes goes through the buffer protocol, ten times slower.
    if raw.startswith(b"token=") and len(raw) > 6 and _AMP not in raw and _PERCENT not in raw and _PLUS not in raw:
        return raw[6:].decode("latin-1")
    return None


def request_token(request: Request) -> str | None:
    """EventNative's lookup order: query `token`, header `X-Auth-Token`, first `p_*` query parameter,
    header `api_key`, HTTP basic auth user (Segment's libraries send the write key there)."""
    plain = plain_query_token(request.scope["query_string"])
    if plain is not None:
        return plain
    query = request.query
    for key, value in query:
        if key == "token" and value:
            return value
    header = request.headers.get(b"x-auth-token")
    if header:
        return header.decode("utf-8", "replace")
    for key, value in query:
        if key.startswith("p_") and value:
            return value
    api_key = request.headers.get(b"api_key")
    if api_key:
        return api_key.decode("utf-8", "replace")
    return basic_auth_user(request)


MAX_AUTHORIZATION_LENGTH = 4096


def basic_auth_user(request: Request) -> str | None:
    """The user of `Authorization: Basic base64(user:password)` (Segment's write key); else None.

    EventNative read it after the other places `request_token` looks; the password is ignored.
    """
    value = request.headers.get(b"authorization")
    if not value or len(value) > MAX_AUTHORIZATION_LENGTH:
        return None
    scheme, _, encoded = value.strip().partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):  # binascii.Error is a ValueError
        return None
    return decoded.partition(":")[0] or None


# --- admin ----------------------------------------------------------------------------------------


def check_admin(request: Request, admin_token: str | None) -> None:
    """401 unless the query `token` or the `X-Admin-Token` header is the configured admin token."""
    if not admin_token:
        raise HTTPError(401, "Admin token is not configured", "set server.admin_token to use admin endpoints")
    given = request.query_param("token") or request.header(b"x-admin-token") or ""
    if not hmac.compare_digest(given.encode(), admin_token.encode()):
        raise HTTPError(401, "Admin token does not match", "pass it as ?token= or the X-Admin-Token header")
