"""A minimum insert interval per destination: held micro-batches, one insert per table, one ack.

Inserts are counted by wrapping the Postgres adapter's `insert` (the rows still go to the
machine's Postgres). No assertion depends on how fast the machine is: the interval is either long
enough never to pass during a test (60 s, so only the size and memory triggers flush) or waited
out on purpose.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventspark.coordination import MemoryCoordination
from eventspark.destinations.base import TransientError
from eventspark.stream.manager import StreamWorkers
from eventspark.stream.queue import QueueReader, QueueWriter, queue_dir
from eventspark.stream.worker import BatchOutcome, StreamSettings, _Stopped
from tests.stream.helpers import FAST, Harness, event, line, make_config, postgres_stream
from tests.stream.test_crashes import counts, wait_for_rows

NEVER = 60.0
"""An interval no test waits for: only the size or memory trigger can flush."""


def settings(batch_events: int) -> StreamSettings:
    return dataclasses.replace(FAST, batch_events=batch_events)


def held_destination(datasource: dict[str, Any], interval: float, rows: int = 0, **extra: Any) -> dict[str, Any]:
    dest = postgres_stream(datasource, **extra)
    return {**dest, "stream": {"min_insert_interval_sec": interval, "min_insert_rows": rows}}


class InsertCounter:
    """Wraps a live adapter's `insert`: records (table, rows) per call, optionally failing first."""

    def __init__(self, harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail_next = 0
        adapter = harness.worker.delivery.adapter
        original = adapter.insert

        def insert(table: Any, rows: Any) -> None:
            if self.fail_next:
                self.fail_next -= 1
                raise TransientError("connection reset (injected)")
            original(table, rows)
            self.calls.append((table.name, len(rows)))

        monkeypatch.setattr(adapter, "insert", insert)


def pending(harness: Harness) -> int:
    return harness.worker.reader.pending_bytes()


def acked_offsets(harness: Harness) -> bool:
    return (queue_dir(harness.events_dir, harness.dest_id) / "offsets.json").exists()


@pytest.fixture
def build(tmp_path: Path, pg_datasource: dict[str, Any]) -> Iterator[Any]:
    """`build(interval, rows, batch_events)`: a harness on Postgres; closed after the test."""
    built: list[Harness] = []

    def make(interval: float, rows: int = 0, batch_events: int = 4, template: str = "events") -> Harness:
        dest = held_destination(pg_datasource, interval, rows, template=template)
        harness = Harness.build(make_config(tmp_path, {"pg": dest}), "pg", settings(batch_events))
        built.append(harness)
        return harness

    yield make
    for harness in built:
        harness.close()


# --- the queue: several reads, one acknowledgement ----------------------------------------------


def test_several_reads_are_acknowledged_or_rewound_together(tmp_path: Path) -> None:
    writer = QueueWriter(tmp_path)
    writer.append(b"".join(b'{"n": %d}\n' % n for n in range(10)), 10)
    reader = QueueReader(tmp_path)
    reader.open()
    first = reader.read(4) + reader.read(4) + reader.read(4)
    reader.rewind()  # before the writer's first ack: back to its first record, not into the magic
    assert reader.read(4) + reader.read(4) + reader.read(4) == first and len(first) == 10
    reader.ack()
    writer.append(b'{"n": 10}\n')
    assert reader.read(4) == [b'{"n": 10}']
    reader.rewind()
    assert reader.read(4) == [b'{"n": 10}']
    reader.close()
    again = QueueReader(tmp_path)
    again.open()
    assert again.read(20) == [b'{"n": 10}']  # the ack covered all three reads, not the later one
    again.close()


def test_an_offset_inside_the_magic_reads_from_the_first_record(tmp_path: Path) -> None:
    writer = QueueWriter(tmp_path)
    writer.append(b'{"n": 0}\n{"n": 1}\n', 2)
    (tmp_path / "offsets.json").write_bytes(b'{"main": [1, 0]}')  # as an older rewind + ack left it
    reader = QueueReader(tmp_path)
    reader.open()
    assert reader.read(10) == [b'{"n": 0}', b'{"n": 1}']
    reader.close()


# --- settings per destination ---------------------------------------------------------------------


def test_the_interval_comes_from_the_destination_else_its_type(tmp_path: Path, pg_datasource: dict[str, Any]) -> None:
    clickhouse = {"type": "clickhouse", "mode": "stream", "clickhouse": {"dsns": ["http://ch:8123"], "db": "d"}}
    destinations = {
        "ch": clickhouse,
        "ch_fast": {**clickhouse, "stream": {"min_insert_interval_sec": 0.25}},
        "pg": postgres_stream(pg_datasource),
        "pg_held": held_destination(pg_datasource, 2.0, 500),
    }
    loaded = make_config(tmp_path, destinations)
    workers = StreamWorkers(loaded, MemoryCoordination("t"), settings(7))
    found = {
        dest_id: (s.min_insert_interval_sec, s.min_insert_rows, s.batch_events)
        for dest_id, dest in loaded.config.destinations.items()
        for s in [workers.settings_for(dest)]
    }
    assert found == {"ch": (1.0, 10_000, 7), "ch_fast": (0.25, 10_000, 7), "pg": (0.0, 0, 7), "pg_held": (2.0, 500, 7)}
    assert StreamSettings(batch_events=1000, min_insert_rows=10_000).max_held_events == 40_000


# --- holding and flushing -------------------------------------------------------------------------


def test_interval_zero_inserts_and_acknowledges_every_micro_batch(
    build: Any, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = build(0.0, batch_events=4)
    inserts = InsertCounter(h, monkeypatch)
    h.append(*[event(n) for n in range(10)])
    first = h.worker.run_once()
    assert first is not None and len(first.delivered) == 4
    assert acked_offsets(h) and pending(h) > 0 and h.worker.held_events == 0  # acknowledged at once
    outcomes = [first]
    while (outcome := h.worker.run_once()) is not None:
        outcomes.append(outcome)
    assert [len(o.delivered) for o in outcomes] == [4, 4, 2]
    assert inserts.calls == [("events", 4), ("events", 4), ("events", 2)]
    assert counts(pg_schema) == (10, 10) and pending(h) == 0


def test_held_micro_batches_go_in_one_insert_after_the_interval(
    build: Any, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = build(1.5, rows=1000, batch_events=4)  # neither 1,000 rows nor 4,000 held events are reached
    inserts = InsertCounter(h, monkeypatch)
    h.append(*[event(n) for n in range(20)])
    for _ in range(5):  # five micro-batches of four, read in milliseconds, long before 1.5 s
        assert h.worker.run_once() == BatchOutcome()
    assert h.worker.held_events == 20
    assert inserts.calls == [] and pending(h) > 0 and not acked_offsets(h)

    deadline = time.monotonic() + 30
    outcome = h.worker.run_once()
    while outcome is None and time.monotonic() < deadline:  # None: nothing new, not due yet
        outcome = h.worker.run_once()
    assert outcome is not None and len(outcome.delivered) == 20
    assert inserts.calls == [("events", 20)]
    assert counts(pg_schema) == (20, 20) and pending(h) == 0 and h.worker.held_events == 0
    assert len(h.archived()) == 20


def test_an_event_after_a_quiet_interval_is_inserted_at_once(build: Any, pg_schema: str) -> None:
    h = build(0.2)
    time.sleep(0.3)  # the interval since the worker opened is over: nothing to wait for
    h.append(event(1))
    outcome = h.worker.run_once()
    assert outcome is not None and len(outcome.delivered) == 1
    assert counts(pg_schema) == (1, 1) and pending(h) == 0


def test_a_table_reaching_min_insert_rows_flushes_every_table_once(
    build: Any, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = build(NEVER, rows=5, batch_events=2, template="{{.event_type}}")
    inserts = InsertCounter(h, monkeypatch)
    h.append(*[event(n, event_type="click" if n in (1, 5) else "pageview") for n in range(10)])
    # pageview rows held after each read: 1, 3, 4, 6 -> the fourth read reaches 5.
    assert [h.worker.run_once() for _ in range(3)] == [BatchOutcome()] * 3
    assert inserts.calls == [] and not acked_offsets(h)
    flushed = h.worker.run_once()
    assert flushed is not None and len(flushed.delivered) == 8
    assert sorted(inserts.calls) == [("click", 2), ("pageview", 6)]
    assert h.worker.run_once() == BatchOutcome() and h.worker.held_events == 2  # the rest waits


def test_held_events_are_bounded_in_memory(build: Any, pg_schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    h = build(NEVER, rows=0, batch_events=3)  # at most max(0, 3) * 4 = 12 held events
    inserts = InsertCounter(h, monkeypatch)
    h.append(*[event(n) for n in range(14)])
    results = [h.worker.run_once() for _ in range(4)]
    assert results[:3] == [BatchOutcome()] * 3
    assert results[3] is not None and len(results[3].delivered) == 12
    assert inserts.calls == [("events", 12)] and counts(pg_schema) == (12, 12)


# --- crashes, stops and outages -------------------------------------------------------------------


def test_held_events_of_a_killed_worker_are_redelivered_once(
    build: Any, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = build(NEVER, batch_events=4)
    h.append(*[event(n) for n in range(10)])
    for _ in range(3):
        h.worker.run_once()
    assert h.worker.held_events == 10 and not acked_offsets(h)
    h.close()  # as after kill -9: nothing inserted, nothing acknowledged

    again = build(0.0, batch_events=100)
    inserts = InsertCounter(again, monkeypatch)
    again.drain()
    assert inserts.calls == [("events", 10)]
    assert counts(pg_schema) == (10, 10) and pending(again) == 0
    assert sorted(e["n"] for e in again.archived()) == list(range(10))  # archived once each


class FailsOnce:
    """A chain that raises (a bug, not an event's failure) on event n=5 the first time it sees it."""

    def __init__(self, chain: Any) -> None:
        self.chain = chain
        self.raised = False

    def process(self, value: dict[str, Any]) -> Any:
        if value["n"] == 5 and not self.raised:
            self.raised = True
            raise RuntimeError("a bug (injected)")
        return self.chain.process(value)

    def process_many(self, values: list[dict[str, Any]]) -> list[Any]:
        return [self.process(value) for value in values]


def test_a_bug_while_holding_rereads_the_held_events_once(
    build: Any, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = build(0.3, rows=1000, batch_events=2)
    h.worker.close()  # `start` opens it again on the worker's thread
    chain = FailsOnce(h.worker.chain)
    monkeypatch.setattr(h.worker, "chain", chain)
    h.append(*[event(n) for n in range(10)])  # held: 0-1, 2-3, then the bug in 4-5
    h.worker.start()
    try:
        assert wait_for_rows(pg_schema, 10, 20) == (10, 10)
        assert h.worker.wait_idle(20)
    finally:
        h.worker.stop()
    assert chain.raised
    assert sorted(e["n"] for e in h.archived()) == list(range(10))  # the held ones were dropped, not kept twice


def test_stopped_workers_leave_held_events_queued(
    tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str
) -> None:
    def serve(interval: float) -> StreamWorkers:
        loaded = make_config(tmp_path, {"pg": held_destination(pg_datasource, interval)})
        workers = StreamWorkers(loaded, MemoryCoordination("t"), FAST)
        workers.start()
        return workers

    workers = serve(NEVER)
    writer = QueueWriter(queue_dir(tmp_path / "events", "pg"))
    try:
        for n in range(12):
            writer.append(line(event(n)))
        worker = workers.workers["pg"]
        deadline = time.monotonic() + 20
        while worker.held_events < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.held_events == 12
        workers.stop()  # returns at once: no flush, no wait for the interval
        assert counts(pg_schema) == (0, 0)

        workers = serve(0.2)
        assert wait_for_rows(pg_schema, 12, 20) == (12, 12)
        assert workers.workers["pg"].wait_idle(20)
    finally:
        workers.stop()
        writer.close()


def test_an_outage_during_the_insert_keeps_everything_queued(
    build: Any, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = build(NEVER, rows=5, batch_events=5)
    inserts = InsertCounter(h, monkeypatch)
    inserts.fail_next = 1
    h.append(*[event(n) for n in range(5)])
    outcome = h.worker.run_once()  # due at once (5 rows); the first attempt fails, the retry lands
    assert outcome is not None and len(outcome.delivered) == 5
    assert inserts.calls == [("events", 5)] and pending(h) == 0

    inserts.fail_next = 1_000
    h.append(*[event(n) for n in range(5, 10)])
    h.worker.request_stop()  # stopped while waiting to retry: nothing is acknowledged
    with pytest.raises(_Stopped):
        h.worker.run_once()
    assert pending(h) > 0 and counts(pg_schema) == (5, 5)
    h.close()

    again = build(0.0, batch_events=100)
    again.drain()
    assert counts(pg_schema) == (10, 10) and pending(again) == 0
    assert sorted(e["n"] for e in again.archived()) == list(range(10))
