"""Prometheus metrics of the collector (served on `/prometheus` to the admin token).

Each collector process has its own registry; with several workers, `/prometheus` shows the
worker that answered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from eventspark.collector.multiplex import Route
from eventspark.logs.incoming import AppendOnlyFile

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
UNKNOWN_TOKEN = "unknown"


class CollectorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.accepted = Counter(
            "eventspark_events_accepted", "Events accepted and written", ["token"], registry=self.registry
        )
        self.rejected = Counter(
            "eventspark_requests_rejected",
            "Requests answered with an error, by token id ('unknown' before authentication) and status",
            ["token", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "eventspark_request_duration_seconds",
            "Time to answer a request",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue = Gauge(
            "eventspark_destination_queue_events",
            "Events waiting for a destination: lines in the live incoming logs of its tokens (batch) "
            "or lines this process appended to its spool (stream)",
            ["destination", "mode"],
            registry=self.registry,
        )
        self._accepted: dict[str, MetricWrapperBase] = {}

    def accepted_counter(self, token_id: str) -> Counter:
        """The per-token child, cached: `labels()` costs more than the increment itself."""
        child = self._accepted.get(token_id)
        if child is None:
            child = self._accepted[token_id] = self.accepted.labels(token_id)
        return child  # type: ignore[return-value]

    def reject(self, token_id: str | None, status: int) -> None:
        self.rejected.labels(token_id or UNKNOWN_TOKEN, str(status)).inc()

    def watch_queues(self, routes: Iterable[Route]) -> None:
        """Queue gauges computed on scrape from the routes' files."""
        batch: dict[str, list[Route]] = {}
        for route in routes:
            for dest_id in route.batch_destinations:
                batch.setdefault(dest_id, []).append(route)
            for dest_id, spool in zip(route.stream_destinations, route.spools, strict=True):
                self.queue.labels(dest_id, "stream").set_function(lambda f=spool.file: f.lines)
        for dest_id, taking in batch.items():
            files = {id(r.incoming): r.incoming for r in taking if r.incoming is not None}
            self.queue.labels(dest_id, "batch").set_function(_line_counter(list(files.values())))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _line_counter(files: list[AppendOnlyFile]) -> Callable[[], float]:
    return lambda: sum(f.lines for f in files)
