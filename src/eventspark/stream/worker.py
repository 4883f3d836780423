"""The worker of one stream destination: its queue → the step chain → the warehouse, in micro-batches.

A worker thread takes what is queued (up to `batch_events`; when nothing is queued it waits up to
`batch_wait_ms` for the first event), runs every event through the destination's step chain
(template → lookup → mapping → flatten → types), delivers each table's rows with one insert
(`TableDelivery`), appends the events that failed to `failed/failed.dst=<id>.log`, the delivered
ones to the streaming archive, and only then acknowledges the batch in the queue. Batching adapts
to the load: while one batch is inserted, the next one queues up.

When the warehouse or the coordination store cannot be reached, the batch stays in memory (and in
the queue) and is retried with exponential backoff up to `retry_max_sec`; events are never dropped.
A worker stopped or killed before the acknowledgement redelivers the batch when it starts again.

With a minimum insert interval (`min_insert_interval_sec` > 0: ClickHouse by default), micro-batches
are held in memory, read but not acknowledged, until the interval since the last insert is over, a
table holds `min_insert_rows` rows, or `max_held_events` events are held; then each table gets one
insert and everything held is acknowledged at once. A worker stopped or killed meanwhile does not
insert what it holds: those events were never inserted, stay in the queue and are delivered (once)
when it starts again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from eventspark.coordination import CoordinationError
from eventspark.destinations.base import PartlyDelivered, TransientError
from eventspark.logs.failed import event_error_line, event_id_of, failed_log_path
from eventspark.ops.cache_results import StreamResults
from eventspark.ops.metrics import pipeline_metrics, record_stream_batch, record_stream_retry
from eventspark.recognition.stream import StreamRecognition
from eventspark.steps.chain import DestinationChain, Failure, Row
from eventspark.steps.context import ensure_event_id
from eventspark.stream.archive import StreamArchive
from eventspark.stream.delivery import EventDelivery, TableDelivery
from eventspark.stream.queue import QueueBusy, QueueReader

log = logging.getLogger(__name__)

UNREACHABLE = (TransientError, CoordinationError)
"""Errors after which the batch is kept and retried: nothing was decided about its events."""
HELD_EVENTS_FACTOR = 4
"""With a minimum insert interval, a worker holds at most max(min_insert_rows, batch_events) × this
many events in memory (`StreamSettings.max_held_events`), then inserts without waiting longer."""
MAX_RETRY_AFTER = 3600.0
"""The longest wait a destination's `Retry-After` can impose on the worker (seconds)."""
_INT_SETTINGS = frozenset({"batch_events", "min_insert_rows"})


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """Micro-batching and retry knobs (the `stream:` config section)."""

    batch_events: int = 1000
    """Most events in one micro-batch (one insert per table)."""
    batch_wait_ms: float = 100.0
    """How long a worker waits for events when its queue is empty, before checking again."""
    retry_min_sec: float = 0.5
    """First backoff after a connection error; doubled after each failed retry..."""
    retry_max_sec: float = 60.0
    """...up to this."""
    poll_ms: float = 10.0
    """How often an idle worker looks for events appended by other processes."""
    min_insert_interval_sec: float = 0.0
    """Least time between two inserts into the destination (one insert per table each time): the
    micro-batches read meanwhile are held, unacknowledged. 0: every micro-batch is inserted at once.
    Per destination (`StreamWorkers.build`): its `stream:` block, else its type's capabilities."""
    min_insert_rows: int = 0
    """With an interval: rows held for one table that trigger the insert before the interval is
    over (0: the interval alone decides)."""

    @property
    def max_held_events(self) -> int:
        """The most events held in memory between inserts, whatever the interval."""
        return max(self.min_insert_rows, self.batch_events) * HELD_EVENTS_FACTOR

    @classmethod
    def from_config(cls, section: Any) -> StreamSettings:
        """From a `stream:` section (a mapping or a model with these field names); None: defaults."""
        if section is None:
            return cls()
        raw = section if isinstance(section, Mapping) else getattr(section, "model_dump", dict)()
        known = {k: int(v) if k in _INT_SETTINGS else float(v) for k, v in raw.items() if k in cls.__slots__}
        return cls(**known)


@dataclass(slots=True)
class BatchOutcome:
    """What became of one micro-batch's events."""

    delivered: list[bytes] = field(default_factory=list)
    failed: list[tuple[bytes, str]] = field(default_factory=list)
    skipped: int = 0


@dataclass(slots=True)
class HeldBatch:
    """Events read since the last acknowledgement, run through the chain: the rows of each table
    (with each row's queued line) and the events already decided (skipped, failed by the chain)."""

    outcome: BatchOutcome = field(default_factory=BatchOutcome)
    tables: dict[str, list[tuple[Row, bytes]]] = field(default_factory=dict)
    events: int = 0

    def largest_table(self) -> int:
        return max((len(items) for items in self.tables.values()), default=0)


class _Stopped(Exception):
    """The worker was asked to stop while it waited to retry: the batch stays in the queue."""


class StreamWorker:
    """Consumes one destination's queue on a thread of its own (`start`/`stop`), or step by step
    (`open`, `run_once`, `close`) in tests."""

    def __init__(
        self,
        dest_id: str,
        chain: DestinationChain,
        reader: QueueReader,
        delivery: TableDelivery | EventDelivery,
        archive: StreamArchive,
        failed_dir: Path,
        settings: StreamSettings | None = None,
    ) -> None:
        self.dest_id = dest_id
        self.chain = chain
        self.reader = reader
        self.delivery = delivery
        self.archive = archive
        self.failed_path = failed_log_path(failed_dir, dest_id)
        self.settings = settings or StreamSettings()
        self.delivered = self.failed = self.skipped = 0
        """Counters since start: events loaded, sent to `failed`, skipped by the template."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held = HeldBatch()
        self._last_insert = time.monotonic()
        self.cache: StreamResults | None = None
        """Reports outcomes to the events cache (`eventspark.ops.cache_results`); None: disabled."""
        self.recognition: StreamRecognition | None = None
        """Users recognition after each flush (`eventspark.recognition.stream`); None: disabled."""

    # --- life cycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"eventspark-stream-{self.dest_id}", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Asks the thread to stop after the batch in progress (a batch waiting to retry, or held
        for the minimum insert interval, stays queued: it is delivered after the next start)."""
        self._stop.set()
        self.delivery.interrupt()

    def stop(self, timeout: float | None = None) -> None:
        """`request_stop`, then waits for the thread."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def open(self) -> None:
        self.reader.open()
        self.archive.open()
        # Held events of an earlier run are in the queue again; the interval counts from now, so
        # a restart loop cannot insert more often than the interval allows.
        self._held = HeldBatch()
        self._last_insert = time.monotonic()

    def close(self) -> None:
        self.reader.close()
        self.archive.close()
        if self.recognition is not None:  # ids gathered for a later run (ClickHouse) are run now
            self.recognition.run_if_due(self.delivery.adapter, force=True)
        with contextlib.suppress(Exception):  # closing a broken connection must not hide the real error
            self.delivery.adapter.close()

    def _run(self) -> None:
        if not self._open_when_free():
            return
        try:
            while not self._stop.is_set():
                try:
                    self.run_once()
                except _Stopped:
                    return
                except Exception:  # a bug must not kill the worker silently: log, keep the batch, retry
                    log.exception("stream %s: micro-batch failed; retrying", self.dest_id)
                    self._rewind()
                    self._stop.wait(min(5.0, self.settings.retry_max_sec))
        finally:
            self.close()

    def _open_when_free(self) -> bool:
        while not self._stop.is_set():
            try:
                self.open()
                return True
            except QueueBusy as exc:
                log.error("stream %s: %s; waiting for it to stop", self.dest_id, exc)
                self._stop.wait(5.0)
        return False

    # --- one micro-batch --------------------------------------------------------------------------

    @property
    def held_events(self) -> int:
        """Events read and held for the minimum insert interval, not inserted nor acknowledged yet."""
        return self._held.events

    def run_once(self) -> BatchOutcome | None:
        """Reads one micro-batch into the held batch; when an insert is due (at once without a
        minimum insert interval), delivers everything held and acknowledges it. None: nothing came
        and nothing was due; an empty outcome: the micro-batch is held."""
        room = self.settings.max_held_events - self._held.events
        records = self.reader.read(min(self.settings.batch_events, room), self._held_wait()) if room > 0 else []
        self.archive.rotate_if_due()
        if records:
            self._hold(self._held, records)
        if self._held.events and self._insert_due():
            return self._flush()
        return BatchOutcome() if records else None

    def _hold(self, batch: HeldBatch, records: list[bytes]) -> None:
        """Runs the chain on each event: its row joins its table's, or its outcome is decided."""
        batch.events += len(records)
        outcome, tables = batch.outcome, batch.tables
        for line, result in self._run_chain_many(records):
            if result is None:
                outcome.skipped += 1
                if self.cache is not None:
                    self.cache.skipped(line)
            elif isinstance(result, Failure):
                outcome.failed.append((line, result.error))
            elif type(result) is list:  # a transform made several rows (docs/transforms.md)
                for row in result:
                    tables.setdefault(row.table, []).append((row, line))
            else:
                tables.setdefault(result.table, []).append((result, line))

    def _deliver_all(self, batch: HeldBatch) -> BatchOutcome:
        """One insert per table (more only to isolate refused rows); the batch's outcome."""
        outcome = batch.outcome
        # Per event (its line: rows of one event share it), the first error of its rows: an event
        # a transform made several rows of is delivered only when all of them are.
        errors_of: dict[int, tuple[bytes, str | None]] = {}
        loaded_in: dict[int, dict[str, None]] = {}  # the tables that took a row of the event
        for table, items in batch.tables.items():
            errors = self._deliver(table, [row for row, _ in items])
            for (_, line), error in zip(items, errors, strict=True):
                known = errors_of.get(id(line))
                if known is None or (known[1] is None and error is not None):
                    errors_of[id(line)] = (line, error)
                if error is None:
                    loaded_in.setdefault(id(line), {})[table] = None
        for key, (line, error) in errors_of.items():
            if error is None:
                outcome.delivered.append(line)
            elif key in loaded_in:  # a replay would load these rows again: say so
                outcome.failed.append((line, f"{error} (its rows in {', '.join(loaded_in[key])} were loaded)"))
            else:
                outcome.failed.append((line, error))
        if self.cache is not None:
            self.cache.record(batch.tables, outcome.delivered, outcome.failed)
        return outcome

    # --- held micro-batches (minimum insert interval) ---------------------------------------------

    def _held_wait(self) -> float:
        """How long `read` may wait for events: not past the moment the held ones are due."""
        wait = self.settings.batch_wait_ms / 1000
        if not self._held.events:
            return wait
        due = self._last_insert + self.settings.min_insert_interval_sec
        return max(0.0, min(wait, due - time.monotonic()))

    def _insert_due(self) -> bool:
        settings, held = self.settings, self._held
        if time.monotonic() - self._last_insert >= settings.min_insert_interval_sec:
            return True
        if held.events >= settings.max_held_events:
            return True
        return settings.min_insert_rows > 0 and held.largest_table() >= settings.min_insert_rows

    def _flush(self) -> BatchOutcome:
        """Delivers everything held, records it, acknowledges every micro-batch read since the last
        flush. Raising (a bug, or `_Stopped` while the warehouse is away) leaves it all unacknowledged."""
        batch, self._held = self._held, HeldBatch()
        self._last_insert = time.monotonic()
        outcome = self._deliver_all(batch)
        self._record(outcome)
        if self.recognition is not None:  # its ids before the ack (never read again after it)...
            self.recognition.delivered(batch.tables, {id(line) for line, _ in outcome.failed})
        self.reader.ack()
        if self.recognition is not None:  # ...its updates after: they never hold the queue up
            self.recognition.run_if_due(self.delivery.adapter)
        log.debug("stream %s: inserted %d held events in %d tables", self.dest_id, batch.events, len(batch.tables))
        return outcome

    def _rewind(self) -> None:
        """Forgets every read since the last acknowledgement, held events included: they are read again."""
        self._held = HeldBatch()
        self.reader.rewind()

    def _run_chain_many(self, records: list[bytes]) -> list[tuple[bytes, Row | list[Row] | Failure | None]]:
        """Each line with the chain's result; the events go through the chain together (a
        transform's engine then takes many per round trip), each failing alone."""
        results: list[tuple[bytes, Row | list[Row] | Failure | None]] = []
        events: list[dict[str, Any]] = []
        lines: list[bytes] = []
        for line in records:
            event = self._parse(line)
            if type(event) is Failure:
                results.append((line, event))
            else:
                events.append(event)
                lines.append(line)
        results.extend(zip(lines, self.chain.process_many(events), strict=True))
        return results

    @staticmethod
    def _parse(line: bytes) -> dict[str, Any] | Failure:
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            return Failure(f"the event is not JSON: {exc}")
        if not isinstance(event, dict):
            return Failure("the event is not a JSON object")
        ensure_event_id(event, line)  # a replayed line may have none: a deterministic one
        return event

    def _deliver(self, table: str, rows: list[Row]) -> list[str | None]:
        delay = self.settings.retry_min_sec
        decided: dict[int, str | None] = {}
        pending: list[int] = []  # positions in `rows` not decided yet (once something was decided)
        while True:
            try:
                errors = self.delivery.deliver(table, rows if not decided else [rows[i] for i in pending])
                pipeline_metrics().stream_insert(self.dest_id)
                break
            except UNREACHABLE as exc:
                record_stream_retry(self.failed_path.parent.parent, self.dest_id, f"{table}: {exc}")
                wait = delay
                if isinstance(exc, PartlyDelivered):  # retry only the events not decided yet
                    if not decided:
                        pending = list(range(len(rows)))
                    for position, error in exc.decided.items():
                        decided[pending[position]] = error
                    pending = [i for i in pending if i not in decided]
                    # The service's Retry-After is honoured even beyond retry_max_sec (up to an hour).
                    wait = max(delay, min(exc.retry_after, MAX_RETRY_AFTER))
                log.warning("stream %s/%s: %s; retrying in %.1f s", self.dest_id, table, exc, wait)
            with contextlib.suppress(Exception):
                self.delivery.adapter.close()  # reconnect from scratch on the next attempt
            self.delivery.forget(table)
            if self._stop.wait(wait):
                raise _Stopped
            delay = min(delay * 2, self.settings.retry_max_sec)
        if not decided:
            return errors
        decided.update(zip(pending, errors, strict=True))
        return [decided[i] for i in range(len(rows))]

    def _record(self, outcome: BatchOutcome) -> None:
        """Failed events to `failed/`, delivered ones to the archive: before the acknowledgement,
        so a crash in between repeats them rather than losing them."""
        if outcome.failed:
            self.failed_path.parent.mkdir(parents=True, exist_ok=True)
            with self.failed_path.open("ab") as out:
                out.write(b"".join(_error_line(line, error) for line, error in outcome.failed))
            for line, error in outcome.failed[:3]:
                log.warning("stream %s: event failed: %s (%.200r)", self.dest_id, error, line)
        self.archive.append(outcome.delivered)
        self.delivered += len(outcome.delivered)
        self.failed += len(outcome.failed)
        self.skipped += outcome.skipped
        # `failed_path` is <log.path>/failed/failed.dst=<id>.log: the records go under <log.path>/state.
        log_path = self.failed_path.parent.parent
        record_stream_batch(log_path, self.dest_id, outcome.delivered, len(outcome.failed), outcome.skipped)

    def wait_idle(self, timeout: float) -> bool:
        """Waits until the queue is consumed (tests and benchmarks); False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.reader.pending_bytes() == 0:
                return True
            time.sleep(0.01)
        return False


def _error_line(line: bytes, error: str) -> bytes:
    try:
        original: Any = orjson.loads(line)  # the event as queued, not as the chain left it
        event: Any = orjson.Fragment(line)
    except orjson.JSONDecodeError:
        original = event = line.decode("utf-8", "replace")
    return event_error_line(event, error, event_id_of(original))
