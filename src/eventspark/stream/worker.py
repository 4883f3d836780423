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
from eventspark.destinations.base import TransientError
from eventspark.logs.failed import event_error_line, event_id_of, failed_log_path
from eventspark.steps.chain import DestinationChain, Failure, Row
from eventspark.stream.archive import StreamArchive
from eventspark.stream.delivery import TableDelivery
from eventspark.stream.queue import QueueBusy, QueueReader

log = logging.getLogger(__name__)

UNREACHABLE = (TransientError, CoordinationError)
"""Errors after which the batch is kept and retried: nothing was decided about its events."""


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

    @classmethod
    def from_config(cls, section: Any) -> StreamSettings:
        """From a `stream:` section (a mapping or a model with these field names); None: defaults."""
        if section is None:
            return cls()
        raw = section if isinstance(section, Mapping) else getattr(section, "model_dump", dict)()
        known = {k: float(v) if k != "batch_events" else int(v) for k, v in raw.items() if k in cls.__slots__}
        return cls(**known)


@dataclass(slots=True)
class BatchOutcome:
    """What became of one micro-batch's events."""

    delivered: list[bytes] = field(default_factory=list)
    failed: list[tuple[bytes, str]] = field(default_factory=list)
    skipped: int = 0


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
        delivery: TableDelivery,
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

    # --- life cycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"eventspark-stream-{self.dest_id}", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Asks the thread to stop after the batch in progress (a batch waiting to retry stays queued)."""
        self._stop.set()

    def stop(self, timeout: float | None = None) -> None:
        """`request_stop`, then waits for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def open(self) -> None:
        self.reader.open()
        self.archive.open()

    def close(self) -> None:
        self.reader.close()
        self.archive.close()
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
                    self.reader.rewind()
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

    def run_once(self) -> BatchOutcome | None:
        """Takes one micro-batch, delivers it, acknowledges it; None when the queue stayed empty."""
        records = self.reader.read(self.settings.batch_events, self.settings.batch_wait_ms / 1000)
        self.archive.rotate_if_due()
        if not records:
            return None
        outcome = self.process(records)
        self._record(outcome)
        self.reader.ack()
        return outcome

    def process(self, records: list[bytes]) -> BatchOutcome:
        """Runs the chain on each event and delivers the rows; retries while the warehouse is away."""
        outcome = BatchOutcome()
        tables: dict[str, list[tuple[Row, bytes]]] = {}
        for line in records:
            result = self._run_chain(line)
            if result is None:
                outcome.skipped += 1
            elif isinstance(result, Failure):
                outcome.failed.append((line, result.error))
            else:
                tables.setdefault(result.table, []).append((result, line))
        for table, items in tables.items():
            errors = self._deliver(table, [row for row, _ in items])
            for (_, line), error in zip(items, errors, strict=True):
                if error is None:
                    outcome.delivered.append(line)
                else:
                    outcome.failed.append((line, error))
        return outcome

    def _run_chain(self, line: bytes) -> Row | Failure | None:
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            return Failure(f"the event is not JSON: {exc}")
        if not isinstance(event, dict):
            return Failure("the event is not a JSON object")
        return self.chain.process(event)

    def _deliver(self, table: str, rows: list[Row]) -> list[str | None]:
        delay = self.settings.retry_min_sec
        while True:
            try:
                return self.delivery.deliver(table, rows)
            except UNREACHABLE as exc:
                log.warning("stream %s/%s: %s; retrying in %.1f s", self.dest_id, table, exc, delay)
            with contextlib.suppress(Exception):
                self.delivery.adapter.close()  # reconnect from scratch on the next attempt
            self.delivery.forget(table)
            if self._stop.wait(delay):
                raise _Stopped
            delay = min(delay * 2, self.settings.retry_max_sec)

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
