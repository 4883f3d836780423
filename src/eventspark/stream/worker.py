"""The worker of one stream destination: its queue → the step chain → the warehouse, in micro-batches.

A worker thread takes what is queued (up to `batch_events`; when nothing is queued it waits up to
`batch_wait_ms` for the first event), runs every event through the destination's step chain
(template → lookup → mapping → flatten → types), delivers each table's rows with one insert
(`TableDelivery`), appends the events that failed to `failed/failed.dst=<id>.log`, the delivered
ones to the streaming archive, and only then acknowledges the batch in the queue. Batching adapts
to the load: while one batch is inserted, the next one queues up.

When the warehouse or the coordination store cannot be reached, the batch stays in memory (and in
the queue) and is retried with the destination's retry policy (`eventspark.retry`: exponential
backoff from `retry_min_sec` up to `retry_max_sec`). The first failed attempt since the destination
last made progress (a delivery, or a partial one that decided some rows) is kept in the queue's
`retry.json`, so the policy's maximum age counts across restarts; past it, the rows that still fail
go to `failed/` with `gave up after N attempts in <time>: <last error>` and the worker goes on. While
the destination keeps failing, the rows read next get `LATE_ATTEMPTS` attempts each (base back-off)
before they follow: a dead destination drains its queue into `failed/` instead of growing it, and
the first success starts the clock again. A worker stopped or killed before the acknowledgement
redelivers the batch when it starts again.

Bugs do not block the queue: a step that raises on an event fails that event alone (the others go
through the chain again one by one, from their queued lines); a delivery that raises something
else than a connection error is tried `UNEXPECTED_ATTEMPTS` times, then its rows are split in
halves down to single rows, and a row that still raises fails with the exception as its reason.
A local write that fails (a full disk) is retried, the batch's outcome kept in memory: nothing is
delivered twice for it. With `fsync` (`server.fsync`), the failed lines and the streaming archive
are on disk before the acknowledgement.

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
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from eventspark.coordination import CoordinationError
from eventspark.destinations.base import PartlyDelivered, TransientError
from eventspark.logs.failed import appending, event_error_line, event_id_of, failed_log_path
from eventspark.logs.status import sync_dir
from eventspark.ops.cache_results import StreamResults
from eventspark.ops.metrics import pipeline_metrics, record_stream_batch, record_stream_retry
from eventspark.recognition.stream import StreamRecognition
from eventspark.retry import DEFAULT_MAX_AGE_HOURS, RetryPolicy, give_up_reason
from eventspark.steps.chain import ChainResult, DestinationChain, Failure, Row
from eventspark.steps.context import ensure_event_id
from eventspark.stream.archive import StreamArchive, append_whole
from eventspark.stream.delivery import EventDelivery, TableDelivery
from eventspark.stream.queue import (
    QueueBusy,
    QueueReader,
    RetryState,
    clear_retry_state,
    read_retry_state,
    write_retry_state,
)

log = logging.getLogger(__name__)

UNREACHABLE = (TransientError, CoordinationError)
"""Errors after which the batch is kept and retried: nothing was decided about its events."""
TRANSIENT = (*UNREACHABLE, OSError)
"""Retried by the retry policy: the adapters translate their drivers' errors, so an OSError that
gets through (a socket error, a timeout) is a connection problem too, not a bug."""
HELD_EVENTS_FACTOR = 4
"""With a minimum insert interval, a worker holds at most max(min_insert_rows, batch_events) × this
many events in memory (`StreamSettings.max_held_events`), then inserts without waiting longer."""
MAX_RETRY_AFTER = 3600.0
"""The longest wait a destination's `Retry-After` can impose on the worker (seconds)."""
LATE_ATTEMPTS = 3
"""Attempts rows still get when the destination has failed for longer than the maximum age already
(rows read after a give-up, or after a restart): a blip as the warehouse comes back does not send
them to `failed/` at the first error, and a destination that stays down drains its queue."""
UNEXPECTED_ATTEMPTS = 3
"""Attempts of a delivery that raises an unexpected exception (neither a connection error nor a
refusal: a bug, or an error an adapter does not classify) before its rows are isolated."""
MAX_REASON = 1000
"""Characters of an exception's text kept in a failed event's reason."""
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
    retry_max_age_sec: float = DEFAULT_MAX_AGE_HOURS * 3600
    """The retry policy's maximum age: past it since the first failed attempt, rows go to `failed/`.
    Per destination (`StreamWorkers.settings_for`), like the backoff: `retry_policy(config, dest)`."""
    fsync: bool = False
    """`server.fsync`: failed lines and the streaming archive are fsynced before the acknowledgement."""

    @property
    def policy(self) -> RetryPolicy:
        return RetryPolicy(self.retry_min_sec, max(self.retry_min_sec, self.retry_max_sec), self.retry_max_age_sec)

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
        known: dict[str, Any] = {}
        for key, value in raw.items():
            if key in cls.__slots__ and value is not None:
                known[key] = bool(value) if key == "fsync" else int(value) if key in _INT_SETTINGS else float(value)
        return cls(**known)


@dataclass(slots=True)
class BatchOutcome:
    """What became of one micro-batch's events."""

    delivered: list[bytes] = field(default_factory=list)
    failed: list[tuple[bytes, str]] = field(default_factory=list)
    skipped: int = 0


@dataclass(slots=True)
class _Settling:
    """A delivered batch whose outcome is not recorded and acknowledged yet (`StreamWorker._settle`):
    kept when a local write fails, so that the retry records it without delivering it again."""

    batch: HeldBatch
    outcome: BatchOutcome
    recorded_failed: bool = False
    recorded_archive: bool = False
    counted: bool = False


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
        self.policy = self.settings.policy
        self.clock = time.time
        """Wall-clock time for the retry state (it outlives the process); tests may replace it."""
        self.retry: RetryState | None = None
        """The failing attempts since the last successful delivery (also in the queue's `retry.json`)."""
        self._settling: _Settling | None = None

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
        self._settling = None
        self._last_insert = time.monotonic()
        self.retry = read_retry_state(self.reader.path)

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
        failures = 0
        try:
            while not self._stop.is_set():
                try:
                    self.run_once()
                    failures = 0
                except _Stopped:
                    return
                except Exception:
                    # Delivery and the chain decide bad events themselves: what gets here is local (the
                    # queue, a full disk under failed/ or archive/) or a bug outside them. A delivered
                    # batch is kept to be recorded again (`_settling`); anything else is read again.
                    failures += 1
                    log.exception("stream %s: micro-batch failed; retrying", self.dest_id)
                    if self._settling is None:
                        self._rewind()
                    self._stop.wait(self.policy.delay(failures))
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
        if self._settling is not None:  # delivered, its recording failed: record it, read nothing new
            return self._settle()
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
        self._settling = _Settling(batch, outcome)
        return self._settle()

    def _settle(self) -> BatchOutcome:
        """Records the delivered batch's outcome and acknowledges it; raising (a full disk) keeps it
        in `_settling` for the next try, each step done only once."""
        settling = self._settling
        assert settling is not None
        batch, outcome = settling.batch, settling.outcome
        self._record(settling)
        if self.recognition is not None:  # its ids before the ack (never read again after it)...
            try:
                self.recognition.delivered(batch.tables, {id(line) for line, _ in outcome.failed})
            except Exception:  # recognition is best effort: it must not hold the events up
                log.exception("stream %s: users recognition failed for a batch", self.dest_id)
        self.reader.ack()
        self._settling = None
        if outcome.failed:
            self.reader.end_recording()
        if self.recognition is not None:  # ...its updates after: they never hold the queue up
            self.recognition.run_if_due(self.delivery.adapter)
        log.debug("stream %s: inserted %d held events in %d tables", self.dest_id, batch.events, len(batch.tables))
        return outcome

    def _rewind(self) -> None:
        """Forgets every read since the last acknowledgement, held events included: they are read again."""
        self._held = HeldBatch()
        self.reader.rewind()

    def _run_chain_many(self, records: list[bytes]) -> list[tuple[bytes, ChainResult]]:
        """Each line with the chain's result; the events go through the chain together (a
        transform's engine then takes many per round trip), each failing alone."""
        results: list[tuple[bytes, ChainResult]] = []
        events: list[dict[str, Any]] = []
        lines: list[bytes] = []
        for line in records:
            event = self._parse(line)
            if type(event) is Failure:
                results.append((line, event))
            else:
                events.append(event)
                lines.append(line)
        try:
            chained = self.chain.process_many(events)
        except Exception:  # a bug on some event: each again alone, from its line (the chain changed it)
            log.exception("stream %s: the steps raised on a micro-batch; running its events one by one", self.dest_id)
            chained = [self._chain_alone(line) for line in lines]
        results.extend(zip(lines, chained, strict=True))
        return results

    def _chain_alone(self, line: bytes) -> ChainResult:
        """The chain's result for one event; an exception fails that event with the reason."""
        event = self._parse(line)
        if type(event) is Failure:
            return event
        try:
            return self.chain.process(event)
        except Exception as exc:
            return Failure(_reason("the pipeline steps failed on this event", exc))

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

    def _deliver(self, table: str, rows: list[Row], unexpected_budget: int = UNEXPECTED_ATTEMPTS) -> list[str | None]:
        """Per row, None when delivered, else why it failed. Connection errors are retried by the
        retry policy until its maximum age (`_failed_attempt`); any other exception is tried
        `unexpected_budget` times, then the rows are isolated (`_isolate`)."""
        decided: dict[int, str | None] = {}
        pending = list(range(len(rows)))  # positions in `rows` not decided yet
        unexpected = tries = 0
        while True:
            current = [rows[i] for i in pending] if decided else rows
            try:
                errors = self.delivery.deliver(table, current)
                pipeline_metrics().stream_insert(self.dest_id)
                self._succeeded()
                break
            except TRANSIENT as exc:
                if self._stop.is_set():  # cut short by `request_stop`: not an attempt, nor a give-up
                    raise _Stopped from exc
                if isinstance(exc, PartlyDelivered):  # retry only the events not decided yet
                    for position, error in exc.decided.items():
                        decided[pending[position]] = error
                    pending = [i for i in pending if i not in decided]
                    if exc.decided:  # the destination answered: only failures without progress age
                        self._succeeded()
                if not pending:
                    errors = []
                    break
                tries += 1
                wait = self._failed_attempt(table, exc, tries)
                if wait is None:  # past the maximum age: these rows go to failed/
                    errors = [self._give_up_reason(exc)] * len(pending)
                    self._gave_up(table, len(pending))
                    break
                if isinstance(exc, PartlyDelivered):
                    # The service's Retry-After is honoured even beyond retry_max_sec (up to an hour).
                    wait = max(wait, min(exc.retry_after, MAX_RETRY_AFTER))
                log.warning("stream %s/%s: %s; retrying in %.1f s", self.dest_id, table, exc, wait)
            except Exception as exc:  # a bug, or an error the adapter does not classify
                unexpected += 1
                record_stream_retry(self._log_path, self.dest_id, _reason(table, exc))
                if unexpected >= unexpected_budget:
                    errors = self._isolate(table, current, exc)
                    break
                wait = self.policy.delay(unexpected)
                log.exception("stream %s/%s: delivery raised; retrying in %.1f s", self.dest_id, table, wait)
            with contextlib.suppress(Exception):
                self.delivery.adapter.close()  # reconnect from scratch on the next attempt
            self.delivery.forget(table)
            if self._stop.wait(wait):
                raise _Stopped
        decided.update(zip(pending, errors, strict=True))
        return [decided[i] for i in range(len(rows))]

    def _isolate(self, table: str, rows: list[Row], exc: Exception) -> list[str | None]:
        """Rows whose delivery keeps raising: halves delivered apart (each tried once more), down to
        single rows; a single row that raises fails with the exception as its reason."""
        if len(rows) == 1:
            log.error("stream %s/%s: delivering an event raised %r; it goes to failed/", self.dest_id, table, exc)
            return [_reason("delivering this event raised", exc)]
        middle = len(rows) // 2
        return self._deliver(table, rows[:middle], 1) + self._deliver(table, rows[middle:], 1)

    # --- the retry policy -------------------------------------------------------------------------

    @property
    def _log_path(self) -> Path:
        # `failed_path` is <log.path>/failed/failed.dst=<id>.log: the records go under <log.path>/state.
        return self.failed_path.parent.parent

    def _failed_attempt(self, table: str, exc: Exception, tries: int) -> float | None:
        """Counts a failed attempt (kept in the queue's `retry.json`), the `tries`-th of these rows;
        the wait before the next one, never past the maximum age, or None when the maximum age is
        over and the rows had their `LATE_ATTEMPTS`."""
        record_stream_retry(self._log_path, self.dest_id, f"{table}: {exc}")
        now = self.clock()
        state = self.retry or RetryState(first_failure=now)
        state.first_failure = min(state.first_failure, now)  # a clock set back must not stop the age
        state.attempts += 1
        state.last_attempt = now
        state.last_error = _reason(table, exc)
        self.retry = state
        try:
            write_retry_state(self.reader.path, state, self.settings.fsync)
        except OSError as write_error:  # a full disk: the age counts in memory meanwhile
            log.warning("stream %s: cannot write the retry state: %s", self.dest_id, write_error)
        if self.policy.expired(state.first_failure, now):
            return None if tries >= LATE_ATTEMPTS else self.policy.delay(tries)
        left = state.first_failure + self.policy.max_age_sec - now
        return max(0.0, min(self.policy.delay(state.attempts), left))

    def _give_up_reason(self, exc: Exception) -> str:
        state = self.retry
        assert state is not None
        return give_up_reason(state.attempts, state.first_failure, state.last_attempt, _cut(str(exc)))  # as batch's

    def _gave_up(self, table: str, events: int) -> None:
        pipeline_metrics().retry_gave_up(self.dest_id, events)
        log.error(
            "stream %s/%s: %d rows failed for longer than %.3g h; they go to failed/ (replay them)",
            self.dest_id,
            table,
            events,
            self.policy.max_age_sec / 3600,
        )

    def _succeeded(self) -> None:
        """A delivery went through: the retry clock starts again at the next failure."""
        if self.retry is None:
            return
        self.retry = None
        try:
            clear_retry_state(self.reader.path)
        except OSError as exc:
            log.warning("stream %s: cannot remove the retry state: %s", self.dest_id, exc)

    # --- recording outcomes -----------------------------------------------------------------------

    def _record(self, settling: _Settling) -> None:
        """Failed events to `failed/`, delivered ones to the archive: before the acknowledgement,
        so a crash in between repeats them rather than losing them (the failed lines are cut back
        then: `QueueReader.mark_recording`). Each step once, however often a full disk makes it raise."""
        outcome = settling.outcome
        if outcome.failed and not settling.recorded_failed:
            data = b"".join(_error_line(line, error) for line, error in outcome.failed)
            # Under the append lock of failed/: a replay or the retention moves the log away under
            # it, so never between the mark and the append, nor in the middle of the append.
            with appending(self.failed_path.parent):
                self.reader.mark_recording(self.failed_path, len(data))
                _append(self.failed_path, data, self.settings.fsync)
            settling.recorded_failed = True
            for line, error in outcome.failed[:3]:
                log.warning("stream %s: event failed: %s (%.200r)", self.dest_id, error, line)
        if not settling.recorded_archive:
            self.archive.append(outcome.delivered, sync=self.settings.fsync)
            settling.recorded_archive = True
        if not settling.counted:
            settling.counted = True
            self.delivered += len(outcome.delivered)
            self.failed += len(outcome.failed)
            self.skipped += outcome.skipped
            record_stream_batch(self._log_path, self.dest_id, outcome.delivered, len(outcome.failed), outcome.skipped)

    def wait_idle(self, timeout: float) -> bool:
        """Waits until the queue is consumed (tests and benchmarks); False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.reader.pending_bytes() == 0:
                return True
            time.sleep(0.01)
        return False


def _reason(what: str, exc: BaseException) -> str:
    """`<what>: <exception type>: <its text>`, the text cut to MAX_REASON characters."""
    return f"{what}: {type(exc).__name__}: {_cut(str(exc))}"


def _cut(text: str) -> str:
    return text if len(text) <= MAX_REASON else text[:MAX_REASON] + "..."


def _append(path: Path, data: bytes, sync: bool) -> None:
    """Appends `data` to `path` whole or not at all (a full disk leaves no torn line); with `sync`,
    on disk before returning (the directory too when the file is new)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        start = append_whole(fd, data, sync)
    finally:
        os.close(fd)
    if sync and start == 0:
        sync_dir(path.parent)


def _error_line(line: bytes, error: str) -> bytes:
    try:
        original: Any = orjson.loads(line)  # the event as queued, not as the chain left it
        event: Any = orjson.Fragment(line)
    except orjson.JSONDecodeError:
        original = event = line.decode("utf-8", "replace")
    return event_error_line(event, error, event_id_of(original))
