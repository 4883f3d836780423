"""The `webhook` destination's config: EventNative's `webhook:` block, plus the HTTP family's keys.

`url`, `body` and each header value are templates over the event (after enrichment and mapping),
in the same safe engine as `table_name_template`. The url and the headers are `SecretStr`: they
often carry tokens, and never show in a repr, a log line or an error.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from eventspark.config.base import DestinationBase
from eventspark.destinations.http import HttpBlock
from eventspark.destinations.http.template import TextTemplate
from eventspark.steps.gotemplate.errors import TemplateSyntaxError

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
MAX_URL_CHARS = 8 * 1024
MAX_HEADER_CHARS = 8 * 1024
MAX_BODY_CHARS = 1024 * 1024


class WebhookConfig(HttpBlock):
    url: SecretStr
    """Template of the request's URL (`http://` or `https://`): scheme, host and port written
    out; the event's values substituted in the path and query are percent-encoded. A
    `user:password@` before the host becomes a Basic `Authorization` header."""
    method: str = "POST"
    """GET, POST, PUT, PATCH or DELETE."""
    body: str | None = None
    """Template of the request's body; none: the event as JSON."""
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    """Header name → template of its value. Content-Type defaults to application/json."""

    @field_validator("method")
    @classmethod
    def _method(cls, value: str) -> str:
        method = value.upper() if value else "POST"
        if method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}")
        return method

    @field_validator("url")
    @classmethod
    def _url(cls, value: SecretStr) -> SecretStr:
        source = value.get_secret_value().strip()
        if not source:
            raise ValueError("url is required")
        _check_template("url", source, MAX_URL_CHARS)
        origin(source)
        return SecretStr(source)

    @field_validator("body")
    @classmethod
    def _body(cls, value: str | None) -> str | None:
        if value is not None and value.strip():
            _check_template("body", value, MAX_BODY_CHARS)
            return value
        return None

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, template in value.items():
            if not name or any(c in name for c in ":\r\n ") or not name.isascii():
                raise ValueError(f"header name {name!r} is not valid")
            _check_template(f"header {name}", template.get_secret_value(), MAX_HEADER_CHARS)
        return value


def origin(url: str) -> tuple[str, str, int | None]:
    """The scheme, host and port of the url template, which must be literal text (no `{{` up to
    the first `/`, `?` or `#` after `//`): an event's values can then never send the request (and
    its headers) to another host or port. ValueError (without the URL) when it is not."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise ValueError("url must start with http:// or https://")
    authority = rest
    for stop in "/?#":
        authority = authority.split(stop, 1)[0]
    if "{{" in authority or "{{" in scheme:
        raise ValueError("url: the scheme, host and port must be written out, not templates")
    parts = urlsplit(f"{scheme}://{authority}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("url: the port is not valid") from None
    if not parts.hostname:
        raise ValueError("url has no host")
    return scheme.lower(), parts.hostname, port


def _check_template(what: str, source: str, max_chars: int) -> None:
    try:
        TextTemplate(source, max_chars)
    except TemplateSyntaxError as exc:  # its message names the line and column, not secrets
        raise ValueError(f"{what} template: line {exc.line}, column {exc.column}: {exc.reason}") from None


class WebhookDestination(DestinationBase):
    """An HTTP request per event to a URL of your own (EventNative's `webhook` type)."""

    type: Literal["webhook"]
    webhook: WebhookConfig
