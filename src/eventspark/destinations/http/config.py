"""The keys every HTTP destination's block has, beside the service's own."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, field_validator

from eventspark.config.base import Section


class HttpBlock(Section):
    """Shared keys of `webhook:`, `google_analytics:`, `amplitude:` and `facebook:` blocks."""

    # Secrets are in these blocks: errors name the key and the reason, not the value given. (This
    # holds when a block is validated alone; in a whole config, `config.loading` prints each
    # error's key and message only.)
    model_config = ConfigDict(extra="allow", populate_by_name=True, hide_input_in_errors=True)

    endpoint: str | None = None
    """Base URL of the service (`https://host[:port][/prefix]`), replacing the public one: a
    proxy, a regional endpoint, a test server. None: the service's public URL."""
    timeout_sec: float = Field(default=10.0, gt=0, le=300)
    """Deadline of one attempt: connecting, then (once connected) sending and reading the whole
    answer, however slowly it trickles. Name resolution (DNS) is the system resolver's."""
    concurrency: int = Field(default=4, ge=1, le=64)
    """Requests in flight at once, per destination."""
    retries: int = Field(default=2, ge=0, le=10)
    """Immediate retries of a request after 429, 5xx or a connection error, before the worker
    keeps its events queued and retries them later with its own back-off."""
    retry_min_sec: float = Field(default=0.5, ge=0, le=60)
    """First back-off between retries; doubled after each."""
    retry_max_sec: float = Field(default=5.0, ge=0, le=300)
    """Longest back-off between two retries of a request (a longer `Retry-After` is left to the
    worker, which waits that long, up to an hour, before sending the events again)."""

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        # Only declared fields: an unknown key (a misspelt `api_secert`...) may hold a secret.
        declared = type(self).model_fields
        return [(name, value) for name, value in super().__repr_args__() if name in declared]

    @field_validator("endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("endpoint must be an http:// or https:// URL")
        if parts.query or parts.fragment:
            raise ValueError("endpoint must not have a query or a fragment")
        try:
            parts.port  # noqa: B018 (raises when out of range)
        except ValueError:
            raise ValueError("endpoint: the port is not valid") from None
        return value.rstrip("/")


def base_url(block: HttpBlock, default: str) -> str:
    """The block's endpoint, else the service's public base URL (no trailing slash)."""
    return block.endpoint or default.rstrip("/")
