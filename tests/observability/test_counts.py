"""`ops.status` on real files: pending counts of incoming logs and queues, their caches and budget."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from eventspark.config import load_config
from eventspark.logs.incoming import live_log_name, rotated_log_name
from eventspark.logs.replay import replay_log_name
from eventspark.logs.status import PairStatus, write_status
from eventspark.ops.state import DestinationState, read_state, write_state
from eventspark.ops.status import LineCounter, StatusReader, _Budget, parse_timestamp
from eventspark.stream.queue import QueueReader, QueueWriter, queue_dir

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def event_line(n: int, at: datetime = NOW, size: int = 0) -> bytes:
    event = {"n": n, "_timestamp": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "pad": "x" * size}
    return orjson.dumps(event) + b"\n"


def config(tmp_path: Path) -> Any:
    raw = {
        "api_keys": [{"id": "web", "client_secret": "js"}, {"id": "app", "server_secret": "s2s"}],
        "log": {"path": str(tmp_path / "events")},
        "destinations": {
            "dw": {"type": "duckdb", "duckdb": {"path": "w.duckdb"}},
            "web_only": {"type": "duckdb", "duckdb": {"path": "v.duckdb"}, "only_tokens": ["web"]},
            "live": {"type": "duckdb", "mode": "stream", "duckdb": {"path": "s.duckdb"}},
        },
    }
    path = tmp_path / "config.json"
    path.write_bytes(orjson.dumps(raw))
    return load_config(path).config


def by_id(reader: StatusReader, now: datetime = NOW) -> dict[str, Any]:
    return {s.destination: s for s in reader.read(now.timestamp())}


def incoming(tmp_path: Path) -> Path:
    folder = tmp_path / "events" / "incoming"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# --- batch ----------------------------------------------------------------------------------------


def test_batch_counts_live_and_unloaded_rotated_logs_of_the_destinations_tokens(tmp_path: Path) -> None:
    reader = StatusReader(config(tmp_path))
    folder = incoming(tmp_path)
    (folder / live_log_name("web", 0)).write_bytes(event_line(1) * 3)
    (folder / live_log_name("app", 1)).write_bytes(event_line(2) * 2)
    hour_ago = NOW - timedelta(hours=1)
    loaded = folder / rotated_log_name("web", NOW - timedelta(minutes=50))
    loaded.write_bytes(event_line(3, hour_ago) * 7)
    write_status(loaded, {"dw": {"events": PairStatus(True)}, "web_only": {"events": PairStatus(True)}})
    partly = folder / rotated_log_name("app", NOW - timedelta(minutes=30))
    partly.write_bytes(event_line(4, NOW - timedelta(minutes=40)) * 5)
    write_status(partly, {"dw": {"a": PairStatus(True), "b": PairStatus(False, "boom")}})
    new = folder / rotated_log_name("web", NOW - timedelta(minutes=10))
    new.write_bytes(event_line(5, NOW - timedelta(minutes=15)) * 11)

    found = by_id(reader)

    dw, web_only = found["dw"], found["web_only"]
    assert (dw.live_events, dw.pending_logs, dw.pending_log_events, dw.queue_events) == (5, 2, 16, 21)
    # `partly` failed one table of dw: read again for it. web_only takes only `web`'s logs.
    assert (web_only.live_events, web_only.pending_logs, web_only.pending_log_events) == (3, 1, 11)
    assert dw.oldest_pending_age == 40 * 60 and web_only.oldest_pending_age == 15 * 60
    assert dw.exact and web_only.exact


def test_a_replay_log_waits_for_its_destination_only(tmp_path: Path) -> None:
    reader = StatusReader(config(tmp_path))
    log = incoming(tmp_path) / replay_log_name("web_only", NOW)
    log.write_bytes(event_line(1) * 4)
    found = by_id(reader)
    assert (found["web_only"].pending_logs, found["web_only"].queue_events) == (1, 4)
    assert found["dw"].queue_events == 0
    write_status(log, {"web_only": {"events": PairStatus(True)}})
    assert by_id(reader)["web_only"].queue_events == 0


def test_nothing_waiting_is_zero_with_no_age(tmp_path: Path) -> None:
    found = by_id(StatusReader(config(tmp_path)))
    assert all(s.queue_events == 0 and s.oldest_pending_age is None for s in found.values())
    assert [s.mode for s in found.values()] == ["batch", "batch", "stream"]


def test_failed_events_and_the_last_load_record(tmp_path: Path) -> None:
    reader = StatusReader(config(tmp_path))
    failed = tmp_path / "events" / "failed"
    failed.mkdir(parents=True)
    (failed / "failed.dst=dw.log").write_bytes(b'{"event":{},"error":"x"}\n' * 3)
    at = NOW.timestamp() - 30
    stamp = (NOW - timedelta(seconds=90)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    write_state(tmp_path / "events", "live", DestinationState(at, 7, stamp, "down", at - 5))
    found = by_id(reader)
    assert found["dw"].failed_events == 3 and found["live"].failed_events == 0
    live = found["live"]
    assert (live.last_load_at, live.last_load_events, live.last_error, live.last_error_at) == (at, 7, "down", at - 5)
    assert live.last_event_age == 90


# --- the line counter -----------------------------------------------------------------------------


def test_lines_are_counted_once_and_follow_a_rename(tmp_path: Path) -> None:
    budget = _Budget(1 << 30)
    counter = LineCounter(budget)
    live = tmp_path / "live.log"
    live.write_bytes(event_line(1) * 10)
    assert counter.count(live)[:2] == (10, True)
    with live.open("ab") as out:
        out.write(event_line(2) * 5)
    budget.left = budget.total
    assert counter.count(live)[:2] == (15, True)
    assert budget.total - budget.left == len(event_line(2)) * 5 + 0  # only the appended bytes were read
    rotated = tmp_path / "rotated.log"
    os.rename(live, rotated)
    budget.left = budget.total
    assert counter.count(rotated)[:2] == (15, True) and budget.left == budget.total


def test_a_truncated_or_replaced_file_is_counted_again(tmp_path: Path) -> None:
    counter = LineCounter(_Budget(1 << 30))
    path = tmp_path / "f.log"
    path.write_bytes(event_line(1) * 10)
    assert counter.count(path)[0] == 10
    path.write_bytes(event_line(2) * 3)  # same inode, shorter
    assert counter.count(path)[0] == 3
    with path.open("r+b") as out:  # same inode and a larger size, other first bytes
        out.write(event_line(3, size=50) * 20)
    assert counter.count(path)[0] == 20


def test_a_budget_estimates_then_catches_up(tmp_path: Path) -> None:
    budget = _Budget(4096)
    counter = LineCounter(budget)
    path = tmp_path / "big.log"
    line = event_line(1, size=100)
    path.write_bytes(line * 1000)
    lines, exact, first = counter.count(path)
    assert not exact and abs(lines - 1000) <= 1  # estimated from the average line length
    assert first == NOW.timestamp()
    rounds = 1
    while not exact:
        budget.left = budget.total
        lines, exact, _ = counter.count(path)
        rounds += 1
    assert lines == 1000 and rounds == -(-len(line) * 1000 // 4096)


def test_timestamps_parse_with_or_without_zone() -> None:
    assert parse_timestamp("2026-03-01T12:00:00.000000Z") == NOW.timestamp()
    assert parse_timestamp("2026-03-01T12:00:00") == NOW.timestamp()
    assert parse_timestamp("not a time") is None


# --- stream queues --------------------------------------------------------------------------------


def test_queue_depth_is_the_records_after_the_acknowledged_offsets(tmp_path: Path) -> None:
    reader_status = StatusReader(config(tmp_path))
    directory = queue_dir(tmp_path / "events", "live")
    writers = [QueueWriter(directory, worker, segment_bytes=4096) for worker in (0, 1)]
    for n in range(300):  # several segments per writer, more than one index mark per segment
        writers[n % 2].append(event_line(n, NOW - timedelta(seconds=300 - n)))
    assert by_id(reader_status)["live"].queue_events == 300
    assert by_id(reader_status)["live"].oldest_pending_age == 300

    consumer = QueueReader(directory)
    consumer.open()
    try:
        read = consumer.read(137)
        consumer.ack()
        found = by_id(reader_status)["live"]
        assert found.queue_events == 300 - len(read) and found.exact
        oldest = min(orjson.loads(r)["n"] for r in consumer.read(1000))
        assert found.oldest_pending_age == 300 - oldest
        consumer.rewind()
        rest = consumer.read(1000)
        consumer.ack()
        assert len(read) + len(rest) == 300
        assert by_id(reader_status)["live"].queue_events == 0
        writers[1].append(event_line(1000) * 4, 4)
        assert by_id(reader_status)["live"].queue_events == 4
    finally:
        consumer.close()
        for writer in writers:
            writer.close()


def test_state_records_survive_garbage(tmp_path: Path) -> None:
    write_state(tmp_path, "a/../b", DestinationState(1.0, 2, "t", "e", 3.0))
    assert read_state(tmp_path, "a/../b") == DestinationState(1.0, 2, "t", "e", 3.0)
    assert [p.parent.name for p in tmp_path.rglob("*.json")] == ["state"]  # the id cannot leave the folder
    (tmp_path / "state" / "dst=x.json").write_bytes(b'{"last_load_at": "soon", "last_error": 5}')
    assert read_state(tmp_path, "x") == DestinationState()
