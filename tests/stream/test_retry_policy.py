"""Stream workers under the retry policy, with bad events and `server.fsync` (docs/reliability.md).

The warehouse is the machine's Postgres behind a TCP proxy (`tests/destinations/proxy.py`): stopping
the proxy refuses and resets connections as a server going down would, and nothing else on the
machine notices. Maximum ages are a couple of seconds, so that giving up happens within the test.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eventspark.collector.metrics import render
from eventspark.commands.status import plain_line
from eventspark.coordination import MemoryCoordination
from eventspark.destinations.base import PartlyDelivered, TransientError
from eventspark.logs.failed import appending
from eventspark.ops.metrics import pipeline_metrics
from eventspark.ops.status import StatusReader
from eventspark.stream.manager import StreamWorkers
from eventspark.stream.queue import RETRY_FILE, RetryState, queue_dir, read_retry_state, write_retry_state
from eventspark.stream.worker import LATE_ATTEMPTS, StreamWorker, _Stopped
from tests.conftest import PG_HOST, PG_PORT, pg_conninfo
from tests.destinations.proxy import TcpProxy
from tests.stream.helpers import FAST, KEY, Harness, event, line, make_config, postgres_stream

MAX_AGE_HOURS = 0.0005
"""1.8 s: long enough for a few attempts, short enough for a test."""
FAST_RETRY = {"base_sec": 0.05, "max_sec": 0.2}
WAIT = 20.0
"""Bound (seconds) on every wait for the worker thread."""


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    with TcpProxy(PG_HOST, PG_PORT) as forwarder:
        yield forwarder


def build(root: Path, datasource: dict[str, Any], max_age_hours: float, **extra: Any) -> Harness:
    dest = postgres_stream(datasource) | {"retry": {**FAST_RETRY, "max_age_hours": max_age_hours}}
    return Harness.build(make_config(root, {"pg": dest}, **extra), "pg")


def through(proxy: TcpProxy, datasource: dict[str, Any]) -> dict[str, Any]:
    return datasource | {"port": proxy.port}


def loaded_ids(schema: str) -> list[str]:
    with psycopg.connect(pg_conninfo()) as conn:
        exists = conn.execute(f"SELECT to_regclass('\"{schema}\".events')").fetchone()
        if exists is None or exists[0] is None:
            return []
        return [row[0] for row in conn.execute(f'SELECT {KEY} FROM "{schema}".events ORDER BY 1')]


def failed_ids(harness: Harness) -> list[str]:
    return sorted(record["event_id"] for record in harness.failed())


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {WAIT} s: {what}")
        time.sleep(0.02)


def expired_clock(root: Path, datasource: dict[str, Any]) -> Harness:
    """A worker restarted after an outage older than its maximum age (its `retry.json` says so)."""
    long_ago = time.time() - 10 * 3600
    state = RetryState(first_failure=long_ago, attempts=40, last_attempt=long_ago, last_error="events: down")
    directory = queue_dir(root / "events", "pg")
    directory.mkdir(parents=True, exist_ok=True)
    write_retry_state(directory, state)
    harness = build(root, datasource, 1.0)
    assert harness.worker.retry == state
    return harness


def queue_path(harness: Harness) -> Path:
    return harness.worker.reader.path


def start(harness: Harness) -> StreamWorker:
    """The harness's worker on its own thread (which opens the queue itself)."""
    harness.worker.close()
    harness.worker.start()
    return harness.worker


def test_past_the_maximum_age_events_go_to_failed_once_and_the_worker_goes_on(
    tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str, proxy: TcpProxy
) -> None:
    harness = build(tmp_path, through(proxy, pg_datasource), MAX_AGE_HOURS)
    gave_up_before = pipeline_metrics().sample().counters.get("retry_gave_up_events", {}).get(("pg",), 0)
    try:
        proxy.stop()
        harness.append(*(event(n) for n in range(5)))
        outcome = harness.worker.run_once()  # retries until the maximum age is over
        assert outcome is not None and len(outcome.failed) == 5
        records = harness.failed()
        assert failed_ids(harness) == [f"e{n:06d}" for n in range(5)]
        reason = records[0]["error"]
        assert reason.startswith("gave up after ") and " s: postgres: " in reason, reason
        attempts = int(reason.split()[3])
        assert attempts >= 2  # backed off and tried again before giving up
        assert harness.worker.reader.pending_bytes() == 0  # acknowledged: the worker went on
        # The clock is kept for the next events, but with nothing queued nothing is being retried.
        assert (queue_path(harness) / RETRY_FILE).exists()
        [status] = StatusReader(harness.loaded.config).read()
        assert status.retry_attempts == 0 and status.retry_oldest_age is None

        # Still down: the next events get LATE_ATTEMPTS each (the outage is older than the maximum age).
        harness.append(event(5))
        outcome = harness.worker.run_once()
        assert outcome is not None and len(outcome.failed) == 1
        assert harness.failed()[-1]["error"].startswith(f"gave up after {attempts + LATE_ATTEMPTS} attempts")

        proxy.start()
        harness.append(*(event(n) for n in range(6, 9)))
        harness.drain()
        assert loaded_ids(pg_schema) == [f"e{n:06d}" for n in range(6, 9)]
        assert failed_ids(harness) == [f"e{n:06d}" for n in range(6)]  # each failed once
        assert not (queue_path(harness) / RETRY_FILE).exists()  # the clock starts again at the next failure
        gave_up = pipeline_metrics().sample().counters["retry_gave_up_events"][("pg",)]
        assert gave_up - gave_up_before == 6
    finally:
        harness.close()


def test_a_recovery_before_the_maximum_age_delivers_every_event_once(
    tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str, proxy: TcpProxy
) -> None:
    harness = build(tmp_path, through(proxy, pg_datasource), 1.0)
    try:
        proxy.stop()
        worker = start(harness)
        harness.append(*(event(n) for n in range(20)))
        wait_for(
            lambda: (state := read_retry_state(queue_path(harness))) is not None and state.attempts >= 3, "3 attempts"
        )
        harness.append(*(event(n) for n in range(20, 30)))
        proxy.start()
        assert worker.wait_idle(WAIT)
        assert loaded_ids(pg_schema) == [f"e{n:06d}" for n in range(30)]
        assert harness.failed() == []
        wait_for(lambda: worker.retry is None, "the retry state cleared")
        assert read_retry_state(queue_path(harness)) is None
    finally:
        harness.worker.stop(WAIT)
        harness.close()


def test_the_age_of_the_first_failure_survives_a_restart(
    tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str, proxy: TcpProxy
) -> None:
    datasource = through(proxy, pg_datasource)
    first = build(tmp_path, datasource, MAX_AGE_HOURS * 2)
    proxy.stop()
    first.append(*(event(n) for n in range(4)))
    start(first)
    try:
        wait_for(
            lambda: (state := read_retry_state(queue_path(first))) is not None and state.attempts >= 2, "2 attempts"
        )
    finally:
        first.worker.stop(WAIT)
        first.close()
    before = read_retry_state(queue_path(first))
    assert before is not None and first.failed() == []

    second = build(tmp_path, datasource, MAX_AGE_HOURS * 2)  # a new worker on the same queue
    try:
        assert second.worker.retry == before  # the clock did not start again
        outcome = second.worker.run_once()  # gives up at the first failure's age, not the restart's
        assert outcome is not None and len(outcome.failed) == 4
        after = read_retry_state(queue_path(second))
        assert after is not None and after.first_failure == before.first_failure
        assert after.attempts > before.attempts
        assert second.failed()[0]["error"].startswith(f"gave up after {after.attempts} attempts")
        assert failed_ids(second) == [f"e{n:06d}" for n in range(4)]
    finally:
        second.close()


DEEP = 1000
"""Nesting that the queue's JSON parser reads but flattening cannot store (its JSON is too deep)."""


def deep_event(n: int) -> bytes:
    """A queued line whose flatten step raises: `{"x":{"x":...}}` DEEP levels down (a replayed file
    can hold one; the collector refuses such bodies)."""
    head = line(event(n))[:-2]  # without the closing brace and newline
    return head + b',"deep":' + b'{"x":' * DEEP + b"1" + b"}" * DEEP + b"}\n"


def test_a_step_raising_on_one_event_fails_that_event_alone(
    tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str
) -> None:
    harness = build(tmp_path, pg_datasource, 1.0)
    try:
        harness.writer.append(line(event(1)) + deep_event(2) + line(event(3)), 3)
        outcome = harness.worker.run_once()  # today: the batch rewound and retried forever
        assert outcome is not None
        assert loaded_ids(pg_schema) == ["e000001", "e000003"]
        [record] = harness.failed()
        assert record["event_id"] == "e000002"
        assert record["error"].startswith("the pipeline steps failed on this event: ValueError: ")
        assert harness.worker.reader.pending_bytes() == 0
    finally:
        harness.close()


def test_a_delivery_that_keeps_raising_isolates_its_rows(
    tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = build(tmp_path, pg_datasource, 1.0)
    delivery = harness.worker.delivery
    real = delivery.deliver
    calls = []

    def buggy(table: str, rows: list[Any]) -> list[str | None]:
        calls.append(len(rows))
        if any(row.values.get("poison") for row in rows):
            raise KeyError("an adapter bug")  # neither a connection error nor a refusal
        return real(table, rows)

    monkeypatch.setattr(delivery, "deliver", buggy)
    try:
        harness.append(*(event(n, poison=n == 5) for n in range(8)))
        outcome = harness.worker.run_once()
        assert outcome is not None
        assert loaded_ids(pg_schema) == [f"e{n:06d}" for n in range(8) if n != 5]
        [record] = harness.failed()
        assert record["event_id"] == "e000005"
        assert record["error"] == "delivering this event raised: KeyError: 'an adapter bug'"
        assert calls[:3] == [8, 8, 8]  # tried as a whole three times, then split
    finally:
        harness.close()


def test_failed_lines_and_the_archive_are_fsynced_before_the_ack(
    tmp_path: Path, pg_datasource: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    for fsync in (True, False):
        root = tmp_path / str(fsync)
        root.mkdir()
        harness = build(root, pg_datasource, 1.0, server={"fsync": fsync})
        reader = harness.worker.reader
        real_ack = reader.ack
        monkeypatch.setattr(reader, "ack", lambda real_ack=real_ack: (synced.append("ack"), real_ack()))
        monkeypatch.setattr(os, "fsync", spy)
        synced.clear()
        try:
            harness.writer.append(line(event(1)) + b"[1]\n", 2)  # one delivered, one not an object
            outcome = harness.worker.run_once()
            assert outcome is not None and len(outcome.failed) == 1 and len(outcome.delivered) == 1
        finally:
            monkeypatch.setattr(os, "fsync", real_fsync)
            harness.close()
        ack = synced.index("ack")
        if fsync:
            assert "failed.dst=pg.log" in synced[:ack]
            assert "streaming-archive.dst=pg.log" in synced[:ack]
        else:
            assert "failed.dst=pg.log" not in synced and "streaming-archive.dst=pg.log" not in synced


def crash_at(
    root: Path, datasource: dict[str, Any], monkeypatch: pytest.MonkeyPatch, step: str, data: bytes
) -> Harness:
    """A worker that delivers `data` (queued lines) and dies at the reader's `step` (`ack`, or
    `end_recording` after it): nothing after it runs. Returns its closed harness."""
    first = build(root, datasource, 1.0)
    first.writer.append(data, data.count(b"\n"))

    def crash() -> None:
        raise KeyboardInterrupt  # the process dies here: nothing cleaned up

    monkeypatch.setattr(first.worker.reader, step, crash)
    with pytest.raises(KeyboardInterrupt):
        first.worker.run_once()
    assert len(first.failed()) == 1  # appended before the step
    first.close()
    return first


def test_a_crash_between_the_failed_lines_and_the_ack_leaves_them_once(
    tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    crash_at(tmp_path, pg_datasource, monkeypatch, "ack", line(event(1)) + b'"not an object"\n' + line(event(2)))

    second = build(tmp_path, pg_datasource, 1.0)
    try:
        second.drain()  # the batch again: delivered (once, by its key), the bad line failed again
        assert len(second.failed()) == 1
        assert loaded_ids(pg_schema) == ["e000001", "e000002"]
    finally:
        second.close()


def test_metrics_show_the_attempts_and_the_age(tmp_path: Path, pg_datasource: dict[str, Any], proxy: TcpProxy) -> None:
    harness = build(tmp_path, through(proxy, pg_datasource), 1.0)
    try:
        proxy.stop()
        worker = start(harness)
        harness.append(event(1))
        wait_for(
            lambda: (state := read_retry_state(queue_path(harness))) is not None and state.attempts >= 2, "2 attempts"
        )
        [status] = StatusReader(harness.loaded.config).read()
        assert status.retry_attempts >= 2 and status.retry_oldest_age is not None and status.retry_oldest_age > 0
        assert f"\tretry_attempts={status.retry_attempts}\t" in plain_line(status)  # `eventspark status`
        text = render(pipeline_metrics().sample(), [status]).decode()
        assert f'eventspark_retry_attempts{{destination="pg"}} {float(status.retry_attempts)}' in text
        assert 'eventspark_retry_oldest_age_seconds{destination="pg"}' in text
        assert 'eventspark_retry_gave_up_events_total{destination="pg"}' in text
        proxy.start()
        assert worker.wait_idle(WAIT)
        wait_for(lambda: read_retry_state(queue_path(harness)) is None, "the retry state cleared")
        [status] = StatusReader(harness.loaded.config).read()
        assert status.retry_attempts == 0 and status.retry_oldest_age is None
    finally:
        harness.worker.stop(WAIT)
        harness.close()


def test_a_full_disk_while_recording_retries_the_writes_not_the_delivery(
    tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = build(tmp_path, pg_datasource, 1.0)
    delivery = harness.worker.delivery
    real_deliver, delivered = delivery.deliver, []
    monkeypatch.setattr(
        delivery, "deliver", lambda table, rows: (delivered.append(len(rows)), real_deliver(table, rows))[1]
    )
    real_write, full = os.write, [True]

    def write(fd: int, data: Any) -> int:
        if full[0] and os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) == "failed.dst=pg.log":
            full[0] = False
            written = real_write(fd, bytes(data)[:10])  # a torn line, then the disk is full
            assert written == 10
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    try:
        harness.writer.append(line(event(1)) + b"[1]\n", 2)
        with pytest.raises(OSError, match="No space"):
            harness.worker.run_once()
        assert harness.failed() == []  # the torn line was cut
        outcome = harness.worker.run_once()  # the same batch's writes again, nothing read or delivered
        assert outcome is not None and len(outcome.failed) == 1 and len(outcome.delivered) == 1
        assert delivered == [1]
        assert len(harness.failed()) == 1 and len(harness.archived()) == 1
        assert harness.worker.reader.pending_bytes() == 0
        assert loaded_ids(pg_schema) == ["e000001"]
    finally:
        monkeypatch.setattr(os, "write", real_write)
        harness.close()


def test_a_crash_after_the_ack_keeps_the_failed_lines(
    tmp_path: Path, pg_datasource: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    crash_at(tmp_path, pg_datasource, monkeypatch, "end_recording", b'"not an object"\n')  # acknowledged

    second = build(tmp_path, pg_datasource, 1.0)
    try:
        second.drain()
        assert len(second.failed()) == 1  # not cut: the batch will not come again
        assert second.worker.reader.pending_bytes() == 0
    finally:
        second.close()


def test_past_the_maximum_age_a_blip_does_not_fail_the_batch(
    tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str, proxy: TcpProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = expired_clock(tmp_path, through(proxy, pg_datasource))
    delivery = harness.worker.delivery
    real, calls = delivery.deliver, []

    def blip(table: str, rows: list[Any]) -> list[str | None]:
        calls.append(len(rows))
        try:
            return real(table, rows)
        finally:
            proxy.start()  # the warehouse is back after its first refusal

    monkeypatch.setattr(delivery, "deliver", blip)
    try:
        proxy.stop()
        harness.append(*(event(n) for n in range(3)))
        outcome = harness.worker.run_once()
        assert outcome is not None and outcome.failed == [] and calls == [3, 3]
        assert loaded_ids(pg_schema) == [f"e{n:06d}" for n in range(3)]
        assert harness.worker.retry is None and read_retry_state(queue_path(harness)) is None
    finally:
        harness.close()


def test_a_partial_delivery_is_progress_not_age(
    tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A throttling service (PartlyDelivered, as HTTP destinations raise on a 429) that takes one
    row per attempt, after an outage older than the maximum age: every row gets through."""
    harness = expired_clock(tmp_path, pg_datasource)
    delivery = harness.worker.delivery
    real = delivery.deliver

    def throttled(table: str, rows: list[Any]) -> list[str | None]:
        if len(rows) == 1:
            return real(table, rows)
        assert real(table, rows[:1]) == [None]
        raise PartlyDelivered("429 Too Many Requests", {0: None})

    monkeypatch.setattr(delivery, "deliver", throttled)
    try:
        harness.append(*(event(n) for n in range(LATE_ATTEMPTS + 2)))
        outcome = harness.worker.run_once()
        assert outcome is not None and outcome.failed == []
        assert loaded_ids(pg_schema) == [f"e{n:06d}" for n in range(LATE_ATTEMPTS + 2)]
    finally:
        harness.close()


def test_lines_appended_after_a_crashed_recording_are_not_cut(
    tmp_path: Path, pg_datasource: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = crash_at(tmp_path, pg_datasource, monkeypatch, "ack", b'"not an object"\n')
    other = b'{"event_id": "other", "error": "appended by another writer"}\n'
    with first.worker.failed_path.open("ab") as out:  # e.g. a batch pass while the destination was batch
        out.write(other)

    second = build(tmp_path, pg_datasource, 1.0)
    try:
        second.drain()
        assert first.worker.failed_path.read_bytes().count(other) == 1
        assert [record["event_id"] for record in second.failed()].count("other") == 1
    finally:
        second.close()


def test_a_stop_during_a_late_attempt_is_not_a_failed_attempt(
    tmp_path: Path, pg_datasource: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = expired_clock(tmp_path, pg_datasource)
    worker = harness.worker
    before = worker.retry

    def interrupted(table: str, rows: list[Any]) -> list[str | None]:
        worker.request_stop()  # serve stops: the adapter's request is cut short
        raise TransientError("interrupted")

    monkeypatch.setattr(worker.delivery, "deliver", interrupted)
    try:
        harness.append(*(event(n) for n in range(2)))
        with pytest.raises(_Stopped):
            worker.run_once()
        assert harness.failed() == [] and worker.reader.pending_bytes() > 0  # still queued
        assert read_retry_state(queue_path(harness)) == before  # not counted
    finally:
        harness.close()


def test_a_reload_that_changes_the_global_retry_section_rebuilds_the_worker(
    tmp_path: Path, pg_datasource: dict[str, Any]
) -> None:
    destinations = {"pg": postgres_stream(pg_datasource)}
    workers = StreamWorkers(make_config(tmp_path, destinations), MemoryCoordination("test"), FAST)
    workers.start()
    try:
        first = workers.workers["pg"]
        workers.apply(make_config(tmp_path, destinations), WAIT)
        assert workers.workers["pg"] is first  # nothing changed: kept
        workers.apply(make_config(tmp_path, destinations, retry={"max_age_hours": 2}), WAIT)
        assert workers.workers["pg"] is not first
        assert workers.workers["pg"].policy.max_age_sec == 2 * 3600
    finally:
        workers.stop(WAIT)


def test_failed_lines_are_appended_under_the_append_lock(
    tmp_path: Path, pg_datasource: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay moves a failed log away under the append lock (`logs.failed.quiet_failed_log`):
    never between the worker's recording mark and its append, nor in the middle of it."""
    harness = build(tmp_path, pg_datasource, 1.0)
    real_write, order = os.write, []
    locked = threading.Event()

    def replay() -> None:  # takes the lock as a replay moving the log would
        with appending(harness.worker.failed_path.parent):
            order.append("replay")
            locked.set()

    def write(fd: int, data: Any) -> int:
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) == "failed.dst=pg.log":
            threading.Thread(target=replay, daemon=True).start()
            locked.wait(1.0)  # it gets the lock at once unless the worker holds it
            order.append("append")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    try:
        harness.writer.append(b'"not an object"\n', 1)
        outcome = harness.worker.run_once()
        assert outcome is not None and len(outcome.failed) == 1
        wait_for(locked.is_set, "the replay's lock")
        assert order == ["append", "replay"]
    finally:
        monkeypatch.setattr(os, "write", real_write)
        harness.close()
