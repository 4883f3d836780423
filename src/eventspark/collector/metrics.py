"""Prometheus metrics of the node (served on `/prometheus` to the admin token).

Counting happens on the event loop for every request, so the collector's counters are plain ints
and a latency histogram is one `bisect`; prometheus-client only formats them when scraped. What
is rendered is whole for the node whatever process answers (docs/monitoring.md):

* counters: this process's live ones plus the snapshots of the node's other processes (collector
  workers, the pipeline in the parent) and of ended ones (`eventspark.ops.metrics`);
* gauges (queue depth, oldest pending event, failed events, last load): computed from the files
  under `log.path` at scrape time (`eventspark.ops.status`), so every process sees the same.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from eventspark.ops.metrics import Histogram, Sample
from eventspark.ops.status import DestinationStatus

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
UNKNOWN_TOKEN = "unknown"
PREFIX = "eventspark_"

COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "events_accepted": ("Events accepted and written, by token id", ("token",)),
    "requests_rejected": (
        "Requests answered with an error, by token id ('unknown' before authentication) and status",
        ("token", "status"),
    ),
    "batch_passes": ("Batch passes over at least one log, by result (failed: a pair or the job failed)", ("result",)),
    "batch_rows_loaded": ("Rows a batch pass loaded, by destination and table", ("destination", "table")),
    "batch_rows_failed": ("Events a batch pass sent to failed/, by destination and table", ("destination", "table")),
    "batch_rows_skipped": ("Events a batch pass skipped (empty table name)", ("destination", "table")),
    "batch_load_errors": (
        "Destination/table loads of a batch pass that failed (retried on the next pass)",
        ("destination", "table"),
    ),
    "stream_events_delivered": ("Events a stream worker inserted or sent", ("destination",)),
    "stream_events_failed": ("Events a stream worker sent to failed/", ("destination",)),
    "stream_events_skipped": ("Events a stream worker skipped (empty table name)", ("destination",)),
    "stream_inserts": ("Inserts (or requests) of a stream worker that succeeded", ("destination",)),
    "stream_retries": ("Deliveries a stream worker retried after a connection error", ("destination",)),
    "retention_removed_files": ("Files the retention policy removed, by directory (archive, failed)", ("dir",)),
    "retention_removed_bytes": ("Bytes the retention policy removed, by directory (archive, failed)", ("dir",)),
    "retry_gave_up_events": (
        "Events sent to failed/ once the retry policy's max_age_hours was over (batch and stream)",
        ("destination",),
    ),
}
HISTOGRAMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "request_duration_seconds": ("Time to answer a request, by endpoint", ("endpoint",)),
    "batch_pass_duration_seconds": ("Duration of batch passes over at least one log", ()),
}


class LatencyHistogram(Histogram):
    """A request latency histogram (LATENCY_BUCKETS)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(LATENCY_BUCKETS)

    def observe(self, value: float) -> None:
        # Every request: the module's constant, not an attribute look-up.
        self.counts[bisect_left(LATENCY_BUCKETS, value)] += 1
        self.total += value


class CollectorMetrics:
    """This process's request counters (mutated on the hot path, read by `sample`)."""

    def __init__(self, token_ids: Iterable[str], endpoints: Iterable[str]) -> None:
        self.accepted: dict[str, int] = dict.fromkeys(token_ids, 0)
        self.rejected: dict[tuple[str, str], int] = {}
        self.latency = {name: LatencyHistogram() for name in endpoints}

    def reject(self, token_id: str | None, status: int) -> None:
        key = (token_id or UNKNOWN_TOKEN, str(status))
        self.rejected[key] = self.rejected.get(key, 0) + 1

    def sample(self) -> Sample:
        """A copy of the counters (safe from another thread: dict copies are atomic under the GIL)."""
        accepted, rejected, latency = dict(self.accepted), dict(self.rejected), dict(self.latency)
        return Sample(
            counters={
                "events_accepted": {(token,): count for token, count in accepted.items()},
                "requests_rejected": {key: count for key, count in rejected.items()},
            },
            histograms={
                "request_duration_seconds": {(name,): h.copy() for name, h in latency.items() if any(h.counts)}
            },
        )


def render(sample: Sample, statuses: list[DestinationStatus]) -> bytes:
    """The Prometheus text exposition of merged counters and destination statuses."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Exposition(_seeded(sample, statuses), statuses))
    return generate_latest(registry)


def _seeded(sample: Sample, statuses: list[DestinationStatus]) -> Sample:
    """`sample` with zeros for the series every node has, so that rate() works from the start."""
    zeros = Sample()
    for status in statuses:
        zeros.count("retry_gave_up_events", (status.destination,), 0)
        if status.mode == "stream":
            for family in COUNTERS:
                if family.startswith("stream_"):
                    zeros.count(family, (status.destination,), 0)
    if any(status.mode == "batch" for status in statuses):
        zeros.count("batch_passes", ("ok",), 0)
        zeros.count("batch_passes", ("failed",), 0)
    for directory in ("archive", "failed"):  # retention runs on every node (logs.retention)
        zeros.count("retention_removed_files", (directory,), 0)
        zeros.count("retention_removed_bytes", (directory,), 0)
    zeros.add(sample)
    return zeros


class _Exposition(Collector):
    def __init__(self, sample: Sample, statuses: list[DestinationStatus]) -> None:
        self.sample = sample
        self.statuses = statuses

    def collect(self) -> Iterator[Metric]:
        for name, (documentation, labels) in COUNTERS.items():
            family = CounterMetricFamily(PREFIX + name, documentation, labels=list(labels))
            for values, count in sorted(self.sample.counters.get(name, {}).items()):
                family.add_metric(list(values), count)
            yield family
        for name, (documentation, labels) in HISTOGRAMS.items():
            histogram = HistogramMetricFamily(PREFIX + name, documentation, labels=list(labels))
            for values, observed in sorted(self.sample.histograms.get(name, {}).items()):
                histogram.add_metric(list(values), observed.cumulative(), observed.total)
            yield histogram
        yield from _gauges(self.statuses)


def _gauges(statuses: list[DestinationStatus]) -> Iterator[Metric]:
    labels = ["destination", "mode"]
    queue = GaugeMetricFamily(
        PREFIX + "destination_queue_events",
        "Events not loaded yet: in the live incoming logs of its tokens and in rotated logs not loaded "
        "(batch), or in its persistent queue after the acknowledged offsets (stream)",
        labels=labels,
    )
    logs = GaugeMetricFamily(
        PREFIX + "destination_pending_logs", "Rotated logs not loaded yet (batch)", labels=["destination"]
    )
    oldest = GaugeMetricFamily(
        PREFIX + "destination_oldest_pending_seconds",
        "Age of the oldest event not loaded yet (its _timestamp); 0 when nothing waits",
        labels=labels,
    )
    failed = GaugeMetricFamily(
        PREFIX + "destination_failed_events", "Events in failed/failed.dst=<id>.log", labels=labels
    )
    last_load = GaugeMetricFamily(
        PREFIX + "destination_last_load_timestamp_seconds", "When events were last loaded (epoch)", labels=labels
    )
    lag = GaugeMetricFamily(
        PREFIX + "destination_last_event_age_seconds",
        "Age of the _timestamp of the newest event loaded (stream destinations)",
        labels=labels,
    )
    for status in statuses:
        values = [status.destination, status.mode]
        queue.add_metric(values, status.queue_events)
        if status.mode == "batch":
            logs.add_metric([status.destination], status.pending_logs)
        oldest.add_metric(values, status.oldest_pending_age or 0.0)
        failed.add_metric(values, status.failed_events)
        if status.last_load_at is not None:
            last_load.add_metric(values, status.last_load_at)
        if status.last_event_age is not None:
            lag.add_metric(values, status.last_event_age)
    yield from (queue, logs, oldest, failed, last_load, lag)
    yield from _retry_gauges(statuses)


def _retry_gauges(statuses: list[DestinationStatus]) -> Iterator[Metric]:
    """The retry policy's progress per destination (docs/reliability.md); 0 while nothing fails."""
    attempts = GaugeMetricFamily(
        PREFIX + "retry_attempts",
        "Consecutive failed delivery attempts of what the destination holds (stream: its micro-batch; "
        "batch: the most of one failed pair)",
        labels=["destination"],
    )
    age = GaugeMetricFamily(
        PREFIX + "retry_oldest_age_seconds",
        "Time since the first failed attempt of the oldest events being retried; 0 when nothing fails",
        labels=["destination"],
    )
    pending = GaugeMetricFamily(
        PREFIX + "retry_pending_pairs",
        "Batch: (rotated log, table) pairs that failed and wait for their next attempt",
        labels=["destination"],
    )
    for status in statuses:
        attempts.add_metric([status.destination], status.retry_attempts)
        age.add_metric([status.destination], status.retry_oldest_age or 0.0)
        if status.mode == "batch":
            pending.add_metric([status.destination], status.retry_pending_pairs)
    yield from (attempts, age, pending)
