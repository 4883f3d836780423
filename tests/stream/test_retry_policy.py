"""Stream workers under the retry policy, with bad events and `server.fsync` (docs/reliability.md).

The warehouse is the machine's Postgres behind a TCP proxy (`tests/destinations/proxy.py`): stopping
the proxy refuses and resets connections as a server going down would, and nothing else on the
machine notices. Maximum ages are a couple of seconds, so that giving up happens within the test.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eventspark.collector.metrics import render
from eventspark.ops.metrics import pipeline_metrics
from eventspark.ops.status import StatusReader
from eventspark.stream.queue import RETRY_FILE, read_retry_state
from eventspark.stream.worker import StreamWorker
from tests.conftest import PG_HOST, PG_PORT, pg_conninfo
from tests.destinations.proxy import TcpProxy
from tests.stream.helpers import KEY, Harness, event, line, make_config, postgres_stream

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
        assert reason.startswith("gave up after ") and " h: postgres: " in reason, reason
        attempts = int(reason.split()[3])
        assert attempts >= 2  # backed off and tried again before giving up
        assert harness.worker.reader.pending_bytes() == 0  # acknowledged: the worker went on

        # Still down: the next events get one attempt each (the outage is older than the maximum age).
        harness.append(event(5))
        outcome = harness.worker.run_once()
        assert outcome is not None and len(outcome.failed) == 1
        assert harness.failed()[-1]["error"].startswith(f"gave up after {attempts + 1} attempts")

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


def test_a_crash_between_the_failed_lines_and_the_ack_leaves_them_once(
    tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = build(tmp_path, pg_datasource, 1.0)
    first.writer.append(line(event(1)) + b'"not an object"\n' + line(event(2)), 3)

    def crash() -> None:
        raise KeyboardInterrupt  # the process dies here: no ack, nothing cleaned up

    monkeypatch.setattr(first.worker.reader, "ack", crash)
    with pytest.raises(KeyboardInterrupt):
        first.worker.run_once()
    assert len(first.failed()) == 1  # appended before the (failed) ack
    first.close()

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
    first = build(tmp_path, pg_datasource, 1.0)
    first.writer.append(b'"not an object"\n', 1)

    def crash() -> None:
        raise KeyboardInterrupt  # acknowledged, its recording mark still there

    monkeypatch.setattr(first.worker.reader, "end_recording", crash)
    with pytest.raises(KeyboardInterrupt):
        first.worker.run_once()
    first.close()

    second = build(tmp_path, pg_datasource, 1.0)
    try:
        second.drain()
        assert len(second.failed()) == 1  # not cut: the batch will not come again
        assert second.worker.reader.pending_bytes() == 0
    finally:
        second.close()
