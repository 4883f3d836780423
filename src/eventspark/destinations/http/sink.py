"""The adapter of an HTTP destination: events in, requests out, one outcome per event."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from eventspark.destinations.base import Capabilities, EventSender, PartlyDelivered
from eventspark.destinations.http.capabilities import http_capabilities
from eventspark.destinations.http.config import HttpBlock
from eventspark.destinations.http.sender import Result, Sender
from eventspark.destinations.http.service import HttpRequest, Redactor, Refused, Service

log = logging.getLogger(__name__)

SPLIT_STATUSES = frozenset({400, 413, 422})
"""Refusals that may come from some events of a batched request (bad values, too large): the
request is sent again in halves, down to single events. Other refusals (401, 403, 404...) are
about the request itself: every event of it fails with the reason at once."""


class HttpSink(EventSender):
    """Sends the events of one destination through `service` with at most `block.concurrency`
    requests in flight. Constructing it does no I/O; `close` ends the pool (reopened on use)."""

    capabilities: Capabilities = http_capabilities()

    def __init__(self, dest_id: str, service: Service, block: HttpBlock) -> None:
        self.dest_id = dest_id
        self.service = service
        self.block = block
        self.redact = Redactor(service.secrets())
        self.sender = Sender(service.name, block, self.redact)
        self._pool: ThreadPoolExecutor | None = None

    def __repr__(self) -> str:  # never the block: it holds secrets
        return f"HttpSink({self.dest_id!r}, {self.service.name})"

    def send(self, events: Sequence[dict[str, Any]]) -> list[str | None]:
        """Per event None (delivered) or the reason it failed; `PartlyDelivered` when some could
        not be delivered yet (429, 5xx, connection errors after the sender's retries)."""
        outcomes: dict[int, str | None] = {}
        payloads: list[tuple[int, Any]] = []
        for position, event in enumerate(events):
            try:
                payloads.append((position, self.service.payload(event)))
            except Refused as exc:
                outcomes[position] = self.redact(f"{self.service.name}: {exc}")
        by_position = dict(payloads)
        transient: list[Result] = []
        pool = self._open()
        running: set[Future[Result]] = set()
        carried: dict[Future[Result], HttpRequest] = {}

        def submit(items: Sequence[tuple[int, Any]]) -> None:
            for request in self.service.requests(items):
                future = pool.submit(self.sender.send, request)
                running.add(future)
                carried[future] = request

        submit(payloads)
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                running.discard(future)
                request = carried.pop(future)
                result = future.result()
                if result.kind == "delivered":
                    outcomes.update(dict.fromkeys(request.events))
                elif result.kind == "transient":
                    transient.append(result)
                elif len(request.events) > 1 and result.status in SPLIT_STATUSES:  # find the bad events
                    middle = len(request.events) // 2
                    log.info("%s: %s; splitting %d events", self.dest_id, result.reason, len(request.events))
                    for half in (request.events[:middle], request.events[middle:]):
                        submit([(i, by_position[i]) for i in half])
                else:  # the one event, or every event of a request refused for what they share
                    outcomes.update(dict.fromkeys(request.events, result.reason))
        if transient:
            undecided = len(events) - len(outcomes)
            retry_after = max(result.retry_after for result in transient)
            message = f"{undecided} events not delivered yet: {transient[0].reason}"
            raise PartlyDelivered(message, outcomes, retry_after)
        return [outcomes[i] for i in range(len(events))]

    def _open(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self.sender.reopen()
            name = f"eventspark-http-{self.dest_id}"
            self._pool = ThreadPoolExecutor(self.block.concurrency, thread_name_prefix=name)
        return self._pool

    def interrupt(self) -> None:
        self.sender.close()  # waits between retries end; the next `send` after `close` reopens

    def close(self) -> None:
        self.sender.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
