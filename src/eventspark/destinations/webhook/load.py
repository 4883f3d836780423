"""The webhook service: one request per event, url, body and headers rendered from the event."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

import orjson

from eventspark.destinations.http.service import HttpRequest, Probe, Refused, Service
from eventspark.destinations.http.sink import HttpSink
from eventspark.destinations.http.template import TextTemplate
from eventspark.destinations.webhook.configuration import (
    MAX_BODY_CHARS,
    MAX_HEADER_CHARS,
    MAX_URL_CHARS,
    WebhookConfig,
    WebhookDestination,
    origin,
)
from eventspark.steps.gotemplate.errors import TemplateEvalError

_BODYLESS = frozenset({"GET", "DELETE"})
_URL_SAFE = ":/?#[]@!$&'()*+,;=%~"
_TOKEN_LIKE = 16
"""URL path segments at least this long are treated as secrets (hooks.slack.com/services/...)."""


def _escape(value: str) -> str:
    """An event's value in the URL: every reserved character encoded (`/ ? # & = @ :`...), so
    that it stays one value of one path segment or query parameter."""
    return quote(value, safe="")


def _split_credentials(url: str) -> tuple[str, tuple[str, ...]]:
    """The url without `user:password@`, and (user, password) decoded; () when it had none.
    The authority is literal text (`origin` checked it)."""
    scheme, _, rest = url.partition("://")
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if "@" not in authority:
        return url, ()
    userinfo, _, host = authority.rpartition("@")
    user, _, password = userinfo.partition(":")
    return f"{scheme}://{host}{tail}", (unquote(user), unquote(password))


def build(dest_id: str, dest: WebhookDestination, events_dir: Path) -> HttpSink:
    return HttpSink(dest_id, Webhook(dest.webhook), dest.webhook)


class Webhook(Service):
    name = "webhook"

    def __init__(self, config: WebhookConfig) -> None:
        self.config = config
        self.method = config.method
        source, self.credentials = _split_credentials(config.url.get_secret_value())
        self.origin = origin(source)
        self.url = TextTemplate(source, MAX_URL_CHARS)
        self.body = None if config.body is None else TextTemplate(config.body, MAX_BODY_CHARS)
        self.headers = {
            name: TextTemplate(value.get_secret_value(), MAX_HEADER_CHARS) for name, value in config.headers.items()
        }
        if self.credentials and not any(name.lower() == "authorization" for name in self.headers):
            token = base64.b64encode(":".join(self.credentials).encode()).decode()
            self.headers["Authorization"] = TextTemplate(f"Basic {token}", 1024)
        if not any(name.lower() == "content-type" for name in self.headers) and self.method not in _BODYLESS:
            self.headers["Content-Type"] = TextTemplate("application/json", 64)
        self.endpoint = urlsplit(config.endpoint) if config.endpoint else None

    def secrets(self) -> Iterable[str]:
        """Header values, and the URL's password, query values and token-like path segments."""
        found = [value.get_secret_value() for value in self.config.headers.values()]
        found += [value for value in self.credentials if value]
        auth = self.headers.get("Authorization")
        if auth is not None and auth.constant:
            found += [auth.constant, auth.constant.split(" ", 1)[-1]]
        url = urlsplit(self.config.url.get_secret_value())
        found += [value for _, value in parse_qsl(url.query) if "{{" not in value]
        found += [part for part in url.path.split("/") if len(part) >= _TOKEN_LIKE and "{{" not in part]
        return found

    def payload(self, event: dict[str, Any]) -> HttpRequest:
        try:
            url = self.url.render(event, _escape).strip()
            headers = {name: template.render(event) for name, template in self.headers.items()}
            if self.body is not None:
                body: bytes | None = self.body.render(event).encode("utf-8")
            elif self.method in _BODYLESS:
                body = None
            else:
                body = orjson.dumps(event, option=orjson.OPT_SORT_KEYS)  # as Go marshals a map
        except TemplateEvalError as exc:
            raise Refused(f"template: {exc}") from None
        except TypeError as exc:  # orjson: a value JSON cannot hold (not from a parsed event)
            raise Refused(f"the event is not JSON: {exc}") from None
        for name, value in headers.items():
            if any(c in value for c in "\r\n\0"):
                raise Refused(f"header {name}: the template made a line break or a NUL")
        return HttpRequest(self.method, self._target(url), (), body, headers)

    def _target(self, url: str) -> str:
        if any(c in url for c in "\r\n\t\0"):
            raise Refused("url template made a URL with control characters")
        # The event's values were percent-encoded whole (`_escape`); the template's own text keeps
        # its URL punctuation, and what it cannot hold as it is (spaces...) is encoded here.
        url = quote(url, safe=_URL_SAFE)
        parts = urlsplit(url)
        try:
            where = (parts.scheme.lower(), parts.hostname, parts.port)
        except ValueError:
            where = None
        if where != self.origin:  # cannot happen with escaped values: a last guard all the same
            raise Refused("url template made a URL to another host or port than the one written in it")
        if self.endpoint is None:
            return url
        base = self.endpoint
        return urlunsplit((base.scheme, base.netloc, base.path + parts.path, parts.query, ""))

    def probe(self) -> Probe:
        """A connection to the URL's host and port: a webhook has no request without side effects."""
        if self.endpoint is not None:
            return Probe(urlunsplit((self.endpoint.scheme, self.endpoint.netloc, "/", "", "")))
        scheme, host, port = self.origin
        netloc = f"[{host}]" if ":" in host else host
        return Probe(f"{scheme}://{netloc}{f':{port}' if port else ''}/")

    def requests(self, payloads: Sequence[tuple[int, Any]]) -> Iterable[HttpRequest]:
        for position, request in payloads:
            yield HttpRequest(request.method, request.url, (position,), request.body, request.headers)
