"""The webhook service: one request per event, url, body and headers rendered from the event."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

import orjson

from eventspark.destinations.http.service import HttpRequest, Refused, Service
from eventspark.destinations.http.sink import HttpSink
from eventspark.destinations.http.template import TextTemplate
from eventspark.destinations.webhook.configuration import (
    MAX_BODY_CHARS,
    MAX_HEADER_CHARS,
    MAX_URL_CHARS,
    WebhookConfig,
    WebhookDestination,
)
from eventspark.steps.gotemplate.errors import TemplateEvalError

_BODYLESS = frozenset({"GET", "DELETE"})
_URL_SAFE = ":/?#[]@!$&'()*+,;=%~"
_TOKEN_LIKE = 16
"""URL path segments at least this long are treated as secrets (hooks.slack.com/services/...)."""


def build(dest_id: str, dest: WebhookDestination, events_dir: Path) -> HttpSink:
    return HttpSink(dest_id, Webhook(dest.webhook), dest.webhook)


class Webhook(Service):
    name = "webhook"

    def __init__(self, config: WebhookConfig) -> None:
        self.config = config
        self.method = config.method
        self.url = TextTemplate(config.url.get_secret_value(), MAX_URL_CHARS)
        self.body = None if config.body is None else TextTemplate(config.body, MAX_BODY_CHARS)
        self.headers = {
            name: TextTemplate(value.get_secret_value(), MAX_HEADER_CHARS) for name, value in config.headers.items()
        }
        if not any(name.lower() == "content-type" for name in self.headers) and self.method not in _BODYLESS:
            self.headers["Content-Type"] = TextTemplate("application/json", 64)
        self.endpoint = urlsplit(config.endpoint) if config.endpoint else None

    def secrets(self) -> Iterable[str]:
        """Header values, and the URL's password, query values and token-like path segments."""
        found = [value.get_secret_value() for value in self.config.headers.values()]
        url = urlsplit(self.config.url.get_secret_value())
        if url.password:
            found.append(url.password)
        found += [value for _, value in parse_qsl(url.query) if "{{" not in value]
        found += [part for part in url.path.split("/") if len(part) >= _TOKEN_LIKE and "{{" not in part]
        return found

    def payload(self, event: dict[str, Any]) -> HttpRequest:
        try:
            url = self.url.render(event).strip()
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
        # Characters a URL cannot hold as they are (spaces, non-ASCII from event values) are
        # percent-encoded; what is already encoded, and URL punctuation, stays as it is.
        url = quote(url, safe=_URL_SAFE)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise Refused("url template did not make an http:// or https:// URL")
        if self.endpoint is None:
            return url
        base = self.endpoint
        return urlunsplit((base.scheme, base.netloc, base.path + parts.path, parts.query, ""))

    def requests(self, payloads: Sequence[tuple[int, Any]]) -> Iterable[HttpRequest]:
        for position, request in payloads:
            yield HttpRequest(request.method, request.url, (position,), request.body, request.headers)
