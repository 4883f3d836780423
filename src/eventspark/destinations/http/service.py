"""What each HTTP service defines: how an event becomes its payload and payloads become requests."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import quote


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One request on the wire and the events it carries (positions in the send)."""

    method: str
    url: str
    events: tuple[int, ...]
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:  # the url and headers may hold secrets
        return f"HttpRequest({self.method}, {len(self.events)} events, {len(self.body or b'')} bytes)"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a service reads in a refusal of a batched request: `bad` names the refused events
    (index in the request → why; the others are sent again), `whole` says the request itself is
    refused (a bad key...): every event of it fails, without splitting."""

    bad: Mapping[int, str] = field(default_factory=dict)
    whole: bool = False


@dataclass(frozen=True, slots=True)
class Probe:
    """How a destination test (`http/probe.py`) checks a service without delivering an event: a
    `request` whose answer `verdict(status, body)` reads (None: fine, else what is wrong; without
    a verdict, any 2xx is fine), or, with no request, a connection (TCP, and TLS for https) to
    the host and port of `url`."""

    url: str
    request: HttpRequest | None = None
    verdict: Callable[[int, str], str | None] | None = None


class Refused(ValueError):
    """`Service.payload` refuses one event (it goes to failed/ with this reason)."""


class Service(ABC):
    """One HTTP service: subclasses define `payload` and `requests`, nothing about the wire."""

    name: ClassVar[str]
    """For messages: "webhook", "Amplitude"..."""
    batch_size: ClassVar[int] = 1
    """Most events in one request, as the protocol allows."""

    def secrets(self) -> Iterable[str]:
        """Texts never to show in a log line or a failed record (keys, tokens)."""
        return ()

    @abstractmethod
    def payload(self, event: dict[str, Any]) -> Any:
        """The event as this service takes it; `Refused` (the reason) when it cannot be sent.
        `event` belongs to the caller: copy before changing it."""

    def refusal(self, status: int, body: str, count: int) -> Verdict | None:
        """What a refusal (`status`, `body`) of a request of `count` events says; None: nothing
        more than its status (the sink splits 400, 413 and 422, fails the rest)."""
        return None

    @abstractmethod
    def requests(self, payloads: Sequence[tuple[int, Any]]) -> Iterable[HttpRequest]:
        """Requests for `payloads` (position, payload): each position in exactly one request."""

    def probe(self) -> Probe:
        """The cheapest check that the URL (and, where the service has a way, the key) works,
        without delivering an event (every registered service has one)."""
        raise NotImplementedError(f"{self.name}: this service has no destination test")


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Redactor:
    """Replaces every secret (and its URL-encoded form) in a text by `***`."""

    def __init__(self, secrets: Iterable[str]) -> None:
        forms = set()
        for secret in secrets:
            if secret:
                forms.update({secret, quote(secret, safe=""), quote(secret)})
        self._forms = sorted(forms, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for form in self._forms:
            if form in text:
                text = text.replace(form, "***")
        return text
