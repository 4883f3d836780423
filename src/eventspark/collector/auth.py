"""Tokens, admin token and CORS, as EventNative answered them.

Secrets are found through their SHA-256 digest (a dict lookup that reveals nothing about the
secret's characters) and then confirmed with `hmac.compare_digest`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from eventspark.collector.http import Headers, HTTPError, Request
from eventspark.config.models import ApiKey

TOKEN_NOT_FOUND = "The token is not found"
NOT_SERVER_TOKEN = "The token isn't a server token. Please use s2s integration token"

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
    if origin is None or rules is None or not rules.allows(origin.decode("latin-1")):
        return []
    return [
        (b"access-control-allow-origin", origin),
        (b"access-control-allow-credentials", b"true"),
        (b"vary", b"Origin"),
    ]


# --- tokens ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Token:
    """A configured token as the collector uses it."""

    id: str
    client_secret: str
    server_secret: str
    origins: OriginRules


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


class TokenTable:
    """Finds tokens by client or server secret."""

    def __init__(self, keys: Sequence[ApiKey]) -> None:
        self.tokens = [Token(k.id, k.client_secret, k.server_secret, OriginRules(k.origins)) for k in keys]
        self.by_id = {t.id: t for t in self.tokens}
        self._client = {_digest(t.client_secret): t for t in self.tokens if t.client_secret}
        self._server = {_digest(t.server_secret): t for t in self.tokens if t.server_secret}

    def _find(self, table: dict[bytes, Token], secret: str, server: bool) -> Token | None:
        token = table.get(_digest(secret))
        if token is None:
            return None
        expected = token.server_secret if server else token.client_secret
        return token if hmac.compare_digest(expected.encode(), secret.encode()) else None

    def client(self, secret: str) -> Token | None:
        return self._find(self._client, secret, server=False)

    def server(self, secret: str) -> Token | None:
        return self._find(self._server, secret, server=True)

    def require_client(self, secret: str | None) -> tuple[Token, str]:
        """(token, secret) for a JS endpoint; 401 for a missing, unknown or server-only secret."""
        token = self.client(secret) if secret else None
        if token is None or secret is None:
            raise HTTPError(401, TOKEN_NOT_FOUND, _token_error(secret))
        return token, secret

    def require_server(self, secret: str | None) -> tuple[Token, str]:
        """(token, secret) for a server-to-server endpoint; 401 for a client secret or an unknown one."""
        token = self.server(secret) if secret else None
        if token is not None and secret is not None:
            return token, secret
        if secret and self.client(secret) is not None:
            raise HTTPError(401, NOT_SERVER_TOKEN, "the secret is a client (JS) secret")
        raise HTTPError(401, TOKEN_NOT_FOUND, _token_error(secret))


def _token_error(secret: str | None) -> str:
    if not secret:
        return "no token in the 'token' query parameter, the X-Auth-Token header or a 'p_*' query parameter"
    return "no configured token has this secret"


def request_token(request: Request) -> str | None:
    """EventNative's lookup order: query `token`, header `X-Auth-Token`, first `p_*` query parameter."""
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
    return None


# --- admin ----------------------------------------------------------------------------------------


def check_admin(request: Request, admin_token: str | None) -> None:
    """401 unless the query `token` or the `X-Admin-Token` header is the configured admin token."""
    if not admin_token:
        raise HTTPError(401, "Admin token is not configured", "set server.admin_token to use admin endpoints")
    given = request.query_param("token") or request.header(b"x-admin-token") or ""
    if not hmac.compare_digest(given.encode(), admin_token.encode()):
        raise HTTPError(401, "Admin token does not match", "pass it as ?token= or the X-Admin-Token header")
