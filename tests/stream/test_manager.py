"""StreamWorkers: which destinations get a worker, settings, threads that start and stop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eventspark.coordination import MemoryCoordination
from eventspark.stream.manager import StreamWorkers
from eventspark.stream.queue import QueueReader, QueueWriter, queue_dir
from eventspark.stream.worker import StreamSettings
from tests.stream.helpers import FAST, duckdb_stream, event, line, make_config, postgres_stream
from tests.stream.test_crashes import wait_for_rows


def test_every_stream_destination_gets_a_worker(tmp_path: Path) -> None:
    destinations = {
        "dd": duckdb_stream(tmp_path / "w.duckdb"),
        "batch": {**duckdb_stream(tmp_path / "b.duckdb"), "mode": "batch"},
        "ch": {"type": "clickhouse", "mode": "stream", "clickhouse": {"dsns": ["http://ch:8123"], "db": "d"}},
        "my": {"type": "mysql", "mode": "stream", "datasource": {"db": "d"}},
    }
    workers = StreamWorkers(make_config(tmp_path, destinations), MemoryCoordination("t"))
    assert sorted(workers.destination_ids) == ["ch", "dd", "my"]


def test_settings_come_from_the_stream_section(tmp_path: Path) -> None:
    loaded = make_config(tmp_path, {}, stream={"batch_events": 10, "batch_wait_ms": 5, "retry_max_sec": 2})
    settings = StreamWorkers(loaded, MemoryCoordination("t")).settings
    assert settings == StreamSettings(batch_events=10, batch_wait_ms=5.0, retry_max_sec=2.0)
    assert StreamWorkers(make_config(tmp_path, {}), MemoryCoordination("t")).settings == StreamSettings()


def test_workers_deliver_on_their_threads_and_release_the_queue_on_stop(
    tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str
) -> None:
    loaded = make_config(tmp_path, {"pg": postgres_stream(pg_datasource)})
    workers = StreamWorkers(loaded, MemoryCoordination("t"), FAST)
    workers.start()
    writer = QueueWriter(queue_dir(tmp_path / "events", "pg"))
    try:
        for n in range(30):
            writer.append(line(event(n)))
        assert wait_for_rows(pg_schema, 30, 10) == (30, 30)
    finally:
        workers.stop()
        writer.close()
    reader = QueueReader(queue_dir(tmp_path / "events", "pg"))
    reader.open()  # the worker's consumer lock is gone
    assert reader.pending_bytes() == 0
    reader.close()
