"""Token → destination routing, written once for the collector, the batch job and config checks.

A destination takes the events of a token when its `only_tokens` is absent (every token) or names
the token's id, client secret or server secret.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol


class TokenLike(Protocol):
    """A configured token (`ApiKey`) or the collector's `Token`."""

    id: str
    client_secret: str
    server_secret: str


def token_names(token: TokenLike) -> set[str]:
    """The names a config may use for `token`: its id and its secrets."""
    return {token.id, token.client_secret, token.server_secret} - {""}


def takes_token(destination: Any, token: TokenLike) -> bool:
    """Whether `destination` (anything with `only_tokens`) takes the events of `token`."""
    allowed = destination.only_tokens
    return allowed is None or not token_names(token).isdisjoint(allowed)


def token_routes(
    tokens: Iterable[TokenLike], destinations: Mapping[str, Any]
) -> tuple[dict[str, str], dict[str, tuple[str, ...]], tuple[str, ...]]:
    """(token name → token id, token id → destination ids, destinations open to every token)."""
    secret_tokens: dict[str, str] = {}
    token_destinations: dict[str, tuple[str, ...]] = {}
    for token in tokens:
        for name in token_names(token):
            secret_tokens.setdefault(name, token.id)
        token_destinations[token.id] = tuple(d for d, dest in destinations.items() if takes_token(dest, token))
    default = tuple(d for d, dest in destinations.items() if dest.only_tokens is None)
    return secret_tokens, token_destinations, default


def unknown_tokens(destination: Any, tokens: Iterable[TokenLike]) -> list[str]:
    """The names in `destination.only_tokens` that no token has."""
    known = set().union(*(token_names(t) for t in tokens))
    return [name for name in destination.only_tokens or () if name not in known]
