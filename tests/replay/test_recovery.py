"""What a replay or a pass request leaves behind when it is cut short, and how it is finished:
requests a stopped uploader took, a replay interrupted by a busy queue, temporary replay logs of a
crashed replay, the collector's cheap polling for rotation requests; and archives, whose events
were loaded once already, replayed into a destination without key only when forced; and a pass
asked over HTTP of a node with two collector processes loads the events of both."""

from __future__ import annotations

import asyncio
import fcntl
import gzip
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from eventspark.config import load_config
from eventspark.logs.failed import event_error_line
from eventspark.ops import replay_sinks
from eventspark.ops.passes import PassRequests, RotationRequests, request_pass, request_state
from eventspark.ops.replay import ReplayError, hand_over, plan_replay
from eventspark.stream.queue import queue_dir
from tests.collector import conftest as collector_fixtures
from tests.replay.test_ops import ADMIN, config_file, events, ids_in, pg_dest, write_failed

run_server = collector_fixtures.run_server


def test_a_request_taken_by_a_stopped_uploader_is_put_back(tmp_path: Path) -> None:
    request_id = request_pass(tmp_path, "before the crash")
    assert PassRequests(tmp_path).take() == [request_id]
    assert request_state(tmp_path, request_id)[0] == "running"  # the uploader died here
    restarted = PassRequests(tmp_path)
    assert restarted.recover() == [request_id]
    assert request_state(tmp_path, request_id)[0] == "pending"
    assert restarted.take() == [request_id]  # the next pass answers it


def test_rotation_polling_sees_new_requests_after_a_quiet_folder(tmp_path: Path) -> None:
    worker = RotationRequests(tmp_path, None)
    request_pass(tmp_path, "no rotation")
    folder = tmp_path / "requests"
    past = time.time() - 60
    os.utime(folder, (past, past))
    assert worker.asking() == [] and worker.asking() == []  # the second from the folder's mtime
    asked = request_pass(tmp_path, "rotate", rotate=True)
    assert worker.asking() == [asked]
    worker.done([asked])
    os.utime(folder, (past, past))
    assert worker.asking() == [] and worker.asking() == []
    assert asyncio.run(worker.wait(0.3)) == []


def test_a_replay_interrupted_by_a_busy_queue_is_finished_without_force(
    tmp_path: Path, pg_datasource: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(config_file(tmp_path, {"live": pg_dest(pg_datasource, "stream")})).config
    log_path = tmp_path / "events"
    write_failed(log_path, "live", events("q", 3))
    queue = queue_dir(log_path, "live")
    queue.mkdir(parents=True)
    monkeypatch.setattr(replay_sinks, "QUEUE_BUSY_SECONDS", 0.3)
    holder = os.open(queue / f"{replay_sinks.QUEUE_WRITER}.writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another replay writes this queue
    try:
        with pytest.raises(ReplayError) as busy:
            hand_over(config, plan_replay(config, "failed.dst=live.log"))
    finally:
        os.close(holder)
    assert busy.value.status == 409
    # The file was moved before the queue refused: its record says nothing was handed over.
    with pytest.raises(ReplayError) as moved:
        plan_replay(config, "failed.dst=live.log")
    assert moved.value.status == 409 and "did not finish" in moved.value.error
    (folder,) = [p for p in (log_path / "failed" / "replayed").iterdir() if p.is_dir()]
    record = orjson.loads((folder / "replay.json").read_bytes())
    assert record["state"] == "interrupted" and record["destinations"]["live"] == {"mode": "stream"}
    # Replaying the moved file needs no force: none of its events reached the queue.
    name = f"replayed/{folder.name}/failed.dst=live.log"
    finished = hand_over(config, plan_replay(config, name))
    assert finished["state"] == "handed" and finished["destinations"]["live"]["events"] == 3
    with pytest.raises(ReplayError) as again:
        plan_replay(config, name)
    assert again.value.status == 409


def test_a_crashed_replays_temporary_log_is_removed(tmp_path: Path, pg_datasource: dict[str, Any]) -> None:
    config = load_config(config_file(tmp_path, {"pg": pg_dest(pg_datasource)})).config
    log_path = tmp_path / "events"
    incoming = log_path / "incoming"
    incoming.mkdir(parents=True)
    stale = incoming / ".replay.dst=pg-2026-11-01T00-00-00.000-0123abcd.log.tmp"
    fresh = incoming / ".replay.dst=pg-2026-11-24T00-00-00.000-4567cdef.log.tmp"  # a replay writing now
    for path in (stale, fresh):
        path.write_bytes(b'{"a": 1}\n')
    past = time.time() - 2 * replay_sinks.STALE_TMP_SECONDS
    os.utime(stale, (past, past))
    write_failed(log_path, "pg", events("t", 2))
    record = hand_over(config, plan_replay(config, "failed.dst=pg.log"))
    assert not stale.exists() and fresh.exists()
    assert (incoming / record["destinations"]["pg"]["replay_log"]).exists()


def test_an_archive_replays_into_a_destination_without_key_only_when_forced(
    tmp_path: Path, pg_datasource: dict[str, Any]
) -> None:
    destinations = {"keyed": pg_dest(pg_datasource), "plain": pg_dest(pg_datasource, keyed=False)}
    config = load_config(config_file(tmp_path, destinations)).config
    day = tmp_path / "events" / "archive" / "2026-01-01"
    day.mkdir(parents=True)
    (day / "incoming.tok=web-2026-01-01T00-00-00.000.log.gz").write_bytes(gzip.compress(b'{"a": 1}\n'))
    name = "archive/2026-01-01/incoming.tok=web-2026-01-01T00-00-00.000.log.gz"
    assert plan_replay(config, name, "keyed").targets == {"keyed": "batch"}  # upserts: no force needed
    with pytest.raises(ReplayError) as twice:
        plan_replay(config, name)  # the token's destinations: both
    assert twice.value.status == 409 and "plain" in twice.value.error and "keyed" not in twice.value.error
    assert plan_replay(config, name, force=True).targets == {"keyed": "batch", "plain": "batch"}


def test_lines_a_writer_appends_after_the_move_are_replayed(tmp_path: Path, pg_datasource: dict[str, Any]) -> None:
    config = load_config(config_file(tmp_path, {"pg": pg_dest(pg_datasource)})).config
    log_path = tmp_path / "events"
    path = write_failed(log_path, "pg", events("m", 2))
    lines = [event_error_line(event, "late") for event in events("late", 2)]
    writer = path.open("ab")  # a stream worker that opened the file just before the replay moves it
    writer.write(lines[0][:10])  # and has written part of a line
    writer.flush()

    def finish_writing() -> None:
        time.sleep(0.03)
        writer.write(lines[0][10:] + lines[1])
        writer.close()

    thread = threading.Thread(target=finish_writing)
    thread.start()
    try:
        record = hand_over(config, plan_replay(config, "failed.dst=pg.log"))
    finally:
        thread.join()
    assert (record["events"], record["unreadable"]) == (4, 0)
    replay_log = log_path / "incoming" / record["destinations"]["pg"]["replay_log"]
    ids = [orjson.loads(line)["eventn_ctx"]["event_id"] for line in replay_log.read_bytes().splitlines()]
    assert ids == ["m-0", "m-1", "late-0", "late-1"]


def test_batch_run_loads_the_events_of_every_worker_process(
    run_server: Any, tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str
) -> None:
    config = orjson.loads(
        orjson.dumps(yaml.safe_load(config_file(tmp_path, {"pg": pg_dest(pg_datasource, keyed=False)}).read_text()))
    )
    config["server"]["workers"] = 2
    server = run_server(config)
    live = [server.incoming / f"incoming.tok=web|w={n}.log" for n in range(2)]
    sent: list[str] = []
    deadline = time.monotonic() + 60
    # New connections until both processes have accepted some (the kernel spreads them).
    while not all(path.exists() and path.stat().st_size for path in live) or len(sent) < 10:
        assert time.monotonic() < deadline, "one worker process got no event"
        event = {"event_type": "t", "eventn_ctx": {"event_id": f"both-{len(sent)}"}}
        answer = httpx.post(f"{server.url}/api/v1/s2s/event", params={"token": "s2s-ops"}, json=event, timeout=10)
        assert answer.status_code == 200, answer.text
        sent.append(event["eventn_ctx"]["event_id"])
    answer = httpx.post(
        f"{server.url}/api/v1/batch/run", headers={"X-Admin-Token": ADMIN}, params={"wait": 500}, timeout=600
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "ok", answer.text
    assert ids_in(pg_schema) == sorted(sent)  # the other process rotated too (`RotationRequests`)
