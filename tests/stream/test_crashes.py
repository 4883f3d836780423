"""Nothing acknowledged is lost: kill -9 of a process with a non-empty queue, and Postgres stopped
for 30 s under load (`test_postgres_outage_*`, marked slow: it takes about 40 s). The outage is
of a private server (`private_postgres`): the machine's server on 5432 is shared and stays up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eventspark.coordination import MemoryCoordination
from eventspark.stream.manager import StreamWorkers
from eventspark.stream.queue import QueueReader, QueueWriter, queue_dir
from tests.conftest import pg_conninfo
from tests.private_postgres import PostgresServer
from tests.stream.helpers import FAST, KEY, Harness, event, line, make_config, postgres_stream

REPO = Path(__file__).resolve().parents[2]


def counts(schema: str, conninfo: str | None = None) -> tuple[int, int]:
    """(rows, distinct event ids) in the events table (of the shared server unless `conninfo`
    says otherwise); (0, 0) before it exists."""
    try:
        with psycopg.connect(conninfo or pg_conninfo(), connect_timeout=2) as conn:
            row = conn.execute(f'SELECT count(*), count(DISTINCT {KEY}) FROM "{schema}".events').fetchone()
    except psycopg.errors.UndefinedTable:
        return 0, 0
    assert row is not None
    return int(row[0]), int(row[1])


def ids_in(schema: str) -> set[str]:
    with psycopg.connect(pg_conninfo()) as conn:
        return {r[0] for r in conn.execute(f'SELECT {KEY} FROM "{schema}".events').fetchall()}


def wait_for_rows(schema: str, expected: int, timeout: float, conninfo: str | None = None) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    found = counts(schema, conninfo)
    while found[0] < expected and time.monotonic() < deadline:
        time.sleep(0.1)
        found = counts(schema, conninfo)
    return found


def test_kill_9_with_a_non_empty_queue_loses_nothing(
    tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str
) -> None:
    loaded = make_config(tmp_path, {"pg": postgres_stream(pg_datasource)})
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.stream.stream_process",
            str(tmp_path / "eventspark.yaml"),
            "pg",
            "20000",
            "50",
            "0.002",
        ],
        stdout=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"},
    )
    assert process.stdout is not None
    acknowledged = 0
    while acknowledged < 10000:  # killed in the middle of appending, with the worker busy
        text = process.stdout.readline()
        assert text, "the stream process died"
        acknowledged = int(text)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    # It went on appending until the kill landed: the last count it printed bounds what it wrote.
    printed = [int(line) for line in process.stdout.read().split()]
    appended = printed[-1] if printed else acknowledged
    queue = QueueReader(queue_dir(tmp_path / "events", "pg"))
    queue.open()
    assert queue.pending_bytes() > 0, "the queue was empty at the kill: the test proves nothing"
    queue.close()

    restarted = Harness.build(loaded, "pg")
    try:
        restarted.drain()
    finally:
        restarted.close()
    rows, distinct = counts(pg_schema)
    assert rows == distinct
    assert {f"e{n:06d}" for n in range(acknowledged)} <= ids_in(pg_schema)
    assert rows <= appended + 50  # nothing invented: at most what was being appended at the kill
    assert restarted.failed() == []


class _Producer(threading.Thread):
    """Appends events at about `rate` per second; `acknowledged` counts appends that returned."""

    def __init__(self, writer: QueueWriter, rate: float) -> None:
        super().__init__(daemon=True)
        self.writer, self.rate = writer, rate
        self.acknowledged = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(1 / self.rate):
            self.writer.append(line(event(self.acknowledged)))
            self.acknowledged += 1


@pytest.mark.slow
def test_postgres_outage_under_load_delivers_every_event_exactly_once(
    tmp_path: Path, private_postgres: PostgresServer
) -> None:
    schema, conninfo = f"t_{uuid.uuid4().hex[:12]}", private_postgres.conninfo()
    loaded = make_config(tmp_path, {"pg": postgres_stream(private_postgres.datasource(schema))})
    workers = StreamWorkers(loaded, MemoryCoordination("test"), FAST)
    writer = QueueWriter(queue_dir(tmp_path / "events", "pg"))
    producer = _Producer(writer, rate=200)
    workers.start()
    producer.start()
    try:
        assert wait_for_rows(schema, 100, 10, conninfo)[0] >= 100
        private_postgres.stop("fast")
        try:
            during = producer.acknowledged
            time.sleep(30)
            assert producer.acknowledged > during + 3000  # the collector side kept acknowledging
        finally:
            if not private_postgres.is_up():
                private_postgres.start()  # the next test using the server needs it, whatever happened here
        time.sleep(2)
        producer.halt.set()
        producer.join()
        rows, distinct = wait_for_rows(schema, producer.acknowledged, 60, conninfo)
        assert rows == distinct == producer.acknowledged
        assert workers.workers["pg"].failed == 0
    finally:
        producer.halt.set()
        producer.join()
        workers.stop()
        writer.close()
        if private_postgres.is_up():
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
