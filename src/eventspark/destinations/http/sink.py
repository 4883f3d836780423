"""The adapter of an HTTP destination: events in, requests out, one outcome per event."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, ThreadPoolExecutor, wait
from typing import Any

from eventspark.destinations.base import Capabilities, EventSender, PartlyDelivered
from eventspark.destinations.http.capabilities import http_capabilities
from eventspark.destinations.http.config import HttpBlock
from eventspark.destinations.http.sender import STOPPING, Result, Sender
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
            except Exception as exc:  # a bug must not block the destination: this event fails
                log.exception("%s: preparing an event failed", self.dest_id)
                outcomes[position] = self._unexpected(exc)
        by_position = dict(payloads)
        transient: list[Result] = []
        pool = self._open()
        running: set[Future[Result]] = set()
        carried: dict[Future[Result], HttpRequest] = {}

        def submit(items: Sequence[tuple[int, Any]]) -> None:
            try:
                requests = list(self.service.requests(items))
            except Exception as exc:  # a bug must not block the destination: one by one, then fail
                if len(items) > 1:
                    for item in items:
                        submit([item])
                    return
                log.exception("%s: building requests failed", self.dest_id)
                outcomes[items[0][0]] = self._unexpected(exc)
                return
            for request in requests:
                future = pool.submit(self.sender.send, request)
                running.add(future)
                carried[future] = request

        submit(payloads)
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                running.discard(future)
                request = carried.pop(future)
                try:
                    result = future.result()
                except CancelledError:
                    result = STOPPING
                except Exception as exc:  # a bug in one request fails its events, not the batch
                    log.error("%s: sending a request failed: %s", self.dest_id, self._unexpected(exc))
                    result = Result("refused", self._unexpected(exc))
                if result.kind == "delivered":
                    outcomes.update(dict.fromkeys(request.events))
                elif result.kind == "transient":
                    transient.append(result)
                else:
                    self._refused(request, result, outcomes, by_position, submit)
            if self.sender.closing:  # stopping: what has not started stays queued
                for future in list(running):
                    if future.cancel():
                        running.discard(future)
                        carried.pop(future)
                        transient.append(STOPPING)
        if transient:
            undecided = len(events) - len(outcomes)
            retry_after = max(result.retry_after for result in transient)
            message = f"{undecided} events not delivered yet: {transient[0].reason}"
            raise PartlyDelivered(message, outcomes, retry_after)
        return [outcomes[i] for i in range(len(events))]

    def _refused(
        self,
        request: HttpRequest,
        result: Result,
        outcomes: dict[int, str | None],
        by_position: dict[int, Any],
        submit: Callable[[Sequence[tuple[int, Any]]], None],
    ) -> None:
        """A refusal: the service may name the bad events (the others are sent again) or say the
        request itself is refused; else a batched request refused with 400, 413 or 422 is split
        in halves, and any other refusal fails every event of the request."""
        try:
            verdict = self.service.refusal(result.status, result.body, len(request.events))
        except Exception as exc:
            log.warning("%s: reading the refusal failed: %s", self.dest_id, self._unexpected(exc))
            verdict = None
        if verdict is not None and verdict.bad:
            bad = {request.events[i]: why for i, why in verdict.bad.items() if 0 <= i < len(request.events)}
            for position, why in bad.items():
                outcomes[position] = self.redact(f"{result.reason} ({why})")
            rest = [i for i in request.events if i not in bad]
            if bad and rest:
                log.info("%s: %s; %d refused, %d sent again", self.dest_id, result.reason, len(bad), len(rest))
                submit([(i, by_position[i]) for i in rest])
            if bad:
                return
        whole = verdict is not None and verdict.whole
        if not whole and len(request.events) > 1 and result.status in SPLIT_STATUSES:  # find the bad events
            middle = len(request.events) // 2
            log.info("%s: %s; splitting %d events", self.dest_id, result.reason, len(request.events))
            for half in (request.events[:middle], request.events[middle:]):
                submit([(i, by_position[i]) for i in half])
            return
        outcomes.update(dict.fromkeys(request.events, result.reason))

    def _unexpected(self, exc: BaseException) -> str:
        return self.redact(f"{self.service.name}: internal error: {type(exc).__name__}: {exc}")[:1000]

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
