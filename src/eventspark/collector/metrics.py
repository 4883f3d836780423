"""Prometheus metrics of the collector (served on `/prometheus` to the admin token).

Counting happens on the event loop for every request, so the counters are plain ints and
a latency histogram is one `bisect`; prometheus-client only formats them when scraped (a
custom collector). Each collector process has its own registry: with several workers,
`/prometheus` shows the worker that answered.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from eventspark.collector.multiplex import LineFile, Route

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
UNKNOWN_TOKEN = "unknown"


class LatencyHistogram:
    """Counts per bucket (the last one is +Inf) and the sum of observed seconds."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        running, buckets = 0, []
        for bound, count in zip((*map(str, LATENCY_BUCKETS), "+Inf"), self.counts, strict=True):
            running += count
            buckets.append((bound, running))
        return buckets


class CollectorMetrics(Collector):
    def __init__(self, token_ids: Iterable[str], endpoints: Iterable[str]) -> None:
        self.accepted: dict[str, int] = dict.fromkeys(token_ids, 0)
        self.rejected: dict[tuple[str, str], int] = {}
        self.latency = {name: LatencyHistogram() for name in endpoints}
        self._queues: list[tuple[str, str, Callable[[], int]]] = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def reject(self, token_id: str | None, status: int) -> None:
        key = (token_id or UNKNOWN_TOKEN, str(status))
        self.rejected[key] = self.rejected.get(key, 0) + 1

    def watch_queues(self, routes: Iterable[Route]) -> None:
        """Queue gauges, computed on scrape from the routes' files."""
        batch: dict[str, dict[int, Route]] = {}
        for route in routes:
            for dest_id in route.batch_destinations:
                batch.setdefault(dest_id, {})[id(route.incoming)] = route
            for dest_id, spool in zip(route.stream_destinations, route.spools, strict=True):
                self._queues.append((dest_id, "stream", _lines_of([spool.file])))
        for dest_id, taking in batch.items():
            files = [r.incoming for r in taking.values() if r.incoming is not None]
            self._queues.append((dest_id, "batch", _lines_of(files)))

    def collect(self) -> Iterator[Metric]:
        accepted = CounterMetricFamily(
            "eventspark_events_accepted", "Events accepted and written, by token id", labels=["token"]
        )
        for token_id, count in self.accepted.items():
            accepted.add_metric([token_id], count)
        yield accepted
        rejected = CounterMetricFamily(
            "eventspark_requests_rejected",
            "Requests answered with an error, by token id ('unknown' before authentication) and status",
            labels=["token", "status"],
        )
        for (token_id, status), count in sorted(self.rejected.items()):
            rejected.add_metric([token_id, status], count)
        yield rejected
        yield self._latency_family()
        yield self._queue_family()

    def _latency_family(self) -> Metric:
        family = HistogramMetricFamily(
            "eventspark_request_duration_seconds",
            "Time to answer a request, by endpoint",
            labels=["endpoint"],
        )
        for name, histogram in self.latency.items():
            if any(histogram.counts):
                family.add_metric([name], histogram.cumulative(), histogram.total)
        return family

    def _queue_family(self) -> Metric:
        family = GaugeMetricFamily(
            "eventspark_destination_queue_events",
            "Events waiting for a destination: lines in the live incoming logs of its tokens (batch) "
            "or lines this process appended to its spool (stream)",
            labels=["destination", "mode"],
        )
        for dest_id, mode, lines in self._queues:
            family.add_metric([dest_id, mode], lines())
        return family

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _lines_of(files: list[LineFile]) -> Callable[[], int]:
    return lambda: sum(f.lines for f in files)
