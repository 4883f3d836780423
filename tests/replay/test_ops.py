"""Replay without HTTP: file names from the internet, the events read back, pass requests between
processes, `eventspark replay` when no node serves (it runs the pass itself), and a replay through
a node whose collector runs in two worker processes (the uploader is in their parent)."""

from __future__ import annotations

import asyncio
import gzip
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest
import yaml

from eventspark.config import load_config
from eventspark.logs.failed import event_error_line
from eventspark.logs.replay import replay_destination, replay_log_name
from eventspark.ops.fallback import failed_files, reasons
from eventspark.ops.passes import (
    PassRequests,
    RotationRequests,
    read_answer,
    request_pass,
    request_state,
    wait_answer,
)
from eventspark.ops.replay import ReplayError, count_events, event_line, hand_over, plan_replay, resolve_source
from tests.batch.helpers import run_cli
from tests.collector import conftest as collector_fixtures
from tests.collector.conftest import MAGIC, parse_records
from tests.conftest import pg_conninfo
from tests.emulators.s3 import S3_KEY_ID, S3_REGION, S3_SECRET, s3_client

run_server = collector_fixtures.run_server
ADMIN = "admin-token-ops"


def s3_keys(endpoint: str, bucket: str) -> list[str]:
    listed = s3_client(endpoint).list_objects_v2(Bucket=bucket).get("Contents", [])
    return [entry["Key"] for entry in listed]


def write_failed(events_dir: Path, dest_id: str, events: list[Any], error: str = "column x: does not fit") -> Path:
    """A failed file as the pipeline writes it (`logs.failed.event_error_line`)."""
    path = events_dir / "failed" / f"failed.dst={dest_id}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as file:
        for event in events:
            file.write(event_error_line(event, error))
    return path


def config_file(root: Path, destinations: dict[str, Any], **extra: Any) -> Path:
    config = {
        "server": {"admin_token": ADMIN},
        "api_keys": [{"id": "web", "server_secret": "s2s-ops"}],
        "log": {"path": str(root / "events"), "rotation_min": 60, "uploader_period_sec": 3600},
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        "destinations": destinations,
        **extra,
    }
    path = root / "eventspark.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def remote_config_file(root: Path, destinations: dict[str, Any], endpoint: str, bucket: str) -> Path:
    """`config_file` with `log.remote` on moto's S3 server, one node."""
    path = config_file(root, destinations, coordination={"type": "inmemory"})
    config = yaml.safe_load(path.read_text())
    options = {
        "key": S3_KEY_ID,
        "secret": S3_SECRET,
        "client_kwargs": {"endpoint_url": endpoint, "region_name": S3_REGION},
    }
    config["log"]["remote"] = {"url": f"s3://{bucket}/events", "storage_options": options}
    path.write_text(yaml.safe_dump(config))
    return path


def pg_dest(pg_datasource: dict[str, Any], mode: str = "batch", keyed: bool = True) -> dict[str, Any]:
    layout = {"table_name_template": "events", **({"primary_key_fields": ["eventn_ctx_event_id"]} if keyed else {})}
    return {"type": "postgres", "mode": mode, "datasource": pg_datasource, "data_layout": layout}


def ids_in(schema: str) -> list[str]:
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        return [row[0] for row in conn.execute(f'SELECT eventn_ctx_event_id FROM "{schema}".events ORDER BY 1')]


def events(prefix: str, count: int) -> list[dict[str, Any]]:
    return [
        {"event_type": "t", "n": n, "eventn_ctx": {"event_id": f"{prefix}-{n}"}, "api_key": "s2s-ops"}
        for n in range(count)
    ]


# --- names and lines ------------------------------------------------------------------------------


def test_names_stay_inside_failed_and_archive(tmp_path: Path) -> None:
    log_path = tmp_path / "events"
    write_failed(log_path, "pg", events("a", 1))
    (log_path / "archive" / "2026-01-01").mkdir(parents=True)
    archived = log_path / "archive" / "2026-01-01" / "incoming.tok=web-2026-01-01T00-00-00.000.log.gz"
    archived.write_bytes(gzip.compress(b'{"a": 1}\n'))
    (tmp_path / "secret.log").write_text("x")
    # A symbolic link inside failed/ that leads out of it.
    os.symlink(tmp_path / "secret.log", log_path / "failed" / "failed.dst=evil.log")
    assert resolve_source(log_path, "failed.dst=pg.log")[0] == "failed/failed.dst=pg.log"
    assert resolve_source(log_path, "failed/failed.dst=pg.log")[2] == "failed"
    assert resolve_source(log_path, "archive/2026-01-01/" + archived.name)[2] == "archive"
    for name, status in [
        ("failed.dst=evil.log", 404),
        ("../secret.log", 400),
        ("archive/../../secret.log", 400),
        ("failed/./failed.dst=pg.log", 400),
        ("failed//failed.dst=pg.log", 400),
        ("/failed/failed.dst=pg.log", 400),
        ("incoming/x.log", 400),  # read as failed/incoming/x.log: not a failed file
        ("archive", 400),
        ("secret.log", 400),
        (None, 400),
        ("x" * 300, 400),  # longer than a file name can be
        ("\udc80.log", 400),  # not encodable
        ("failed.dst=other.log", 404),
    ]:
        with pytest.raises(ReplayError) as caught:
            resolve_source(log_path, name)
        assert caught.value.status == status, name


def test_archived_logs_go_to_the_destinations_they_came_from(tmp_path: Path, pg_datasource: dict[str, Any]) -> None:
    config = load_config(
        config_file(tmp_path, {"pg": pg_dest(pg_datasource), "live-1": pg_dest(pg_datasource, "stream")})
    ).config
    day = tmp_path / "events" / "archive" / "2026-01-01"
    day.mkdir(parents=True)
    names = {
        "incoming.tok=web-2026-01-01T00-00-00.000.log.gz": {"pg": "batch", "live-1": "stream"},
        "streaming-archive.dst=live-1-2026-01-01T00-00-00.000.log.gz": {"live-1": "stream"},
        f"{replay_log_name('pg')}.gz": {"pg": "batch"},
    }
    for name, targets in names.items():
        (day / name).write_bytes(gzip.compress(b'{"a": 1}\n'))
        plan = plan_replay(config, f"archive/2026-01-01/{name}")
        assert plan.targets == targets and plan.file_format == "raw_json", name
    (day / "other.log.gz").write_bytes(gzip.compress(b"{}\n"))
    with pytest.raises(ReplayError) as caught:
        plan_replay(config, "archive/2026-01-01/other.log.gz")
    assert caught.value.status == 400 and caught.value.message == "destination_id is required"
    assert plan_replay(config, "archive/2026-01-01/other.log.gz", "pg").targets == {"pg": "batch"}


def test_an_archived_log_on_the_store_is_fetched_to_be_replayed(
    tmp_path: Path, pg_datasource: dict[str, Any], moto_s3: str, s3_bucket: str
) -> None:
    # With log.remote the passes archive on the store: a replay of archive/... fetches it first.
    config = load_config(remote_config_file(tmp_path, {"pg": pg_dest(pg_datasource)}, moto_s3, s3_bucket)).config
    name = "incoming.tok=web|n=node-a-2026-01-01T00-00-00.000.log.gz"
    body = gzip.compress(b'{"a": 1}\n')
    s3_client(moto_s3).put_object(Bucket=s3_bucket, Key=f"events/archive/2026-01-01/{name}", Body=body)

    plan = plan_replay(config, f"archive/2026-01-01/{name}")
    assert plan.targets == {"pg": "batch"} and plan.kind == "archive"
    assert plan.path == tmp_path / "events" / "archive" / "2026-01-01" / name and plan.path.read_bytes() == body
    with pytest.raises(ReplayError) as caught:
        plan_replay(config, "archive/2026-01-02/incoming.tok=web-2026-01-02T00-00-00.000.log.gz")
    assert caught.value.status == 404
    assert sorted(p.name for p in (tmp_path / "events" / "archive").iterdir()) == ["2026-01-01"]


def test_failed_records_give_back_their_original_event() -> None:
    original = {"event_type": "t", "nested": {"a": [1, 2]}, "eventn_ctx": {"event_id": "e1"}}
    line = event_error_line(orjson.Fragment(orjson.dumps(original)), "boom")
    assert orjson.loads(event_line(line, "failed") or b"") == original
    # A line that was not JSON when received is replayed as it was (it fails again, with its reason).
    assert event_line(event_error_line("not json {", "the line is not JSON"), "failed") == b"not json {"
    assert event_line(b"garbage", "failed") is None
    assert event_line(b'{"no_event": 1}', "failed") is None
    assert event_line(b'{"a": 1}\n', "raw_json") == b'{"a": 1}'


def test_replay_log_names_round_trip() -> None:
    for dest_id in ("pg", "a-b", "we/ird|id", "x=y"):
        name = replay_log_name(dest_id)
        assert "/" not in name and replay_destination(name) == dest_id
    assert replay_destination("incoming.tok=web-2026-01-01T00-00-00.000.log") is None


def test_reasons_are_grouped(tmp_path: Path) -> None:
    log_path = tmp_path / "events"
    for n in range(5):
        write_failed(log_path, "pg", [{"n": n}], f"column 'amount': value '{n}x' does not fit a INT64 column")
    write_failed(log_path, "pg", [{"n": 9}], "permission denied for table events")
    count, common = reasons(log_path / "failed" / "failed.dst=pg.log")
    assert count == 6
    assert common[0][1] == 5 and "does not fit" in common[0][0]
    assert common[1] == ("permission denied for table events", 1)


# --- pass requests --------------------------------------------------------------------------------


def test_a_pass_request_is_answered_by_the_next_pass(tmp_path: Path) -> None:
    requests = PassRequests(tmp_path)
    stop = threading.Event()
    answered: list[str] = []

    def uploader() -> None:  # the shape of batch.uploader's loop
        while requests.wait(stop, 3600):
            taken = requests.take()
            requests.answer(taken, None, "no pass in this test", time.time())
            answered.extend(taken)

    thread = threading.Thread(target=uploader)
    thread.start()
    try:
        started = time.monotonic()
        request_id = request_pass(tmp_path, "test")
        answer = wait_answer(tmp_path, request_id, 10)
        assert answer is not None and answer["id"] == request_id and answer["status"] == "failed"
        assert time.monotonic() - started < 2, "a request must start a pass within about a second"
        assert request_state(tmp_path, request_id)[0] == "done"
        assert answered == [request_id]
        # A request written by another process (no in-process wake-up) is found by polling.
        other = "f" * 32
        (tmp_path / "requests" / f"pass-{other}.json").write_bytes(b"{}")
        assert wait_answer(tmp_path, other, 5) is not None
    finally:
        stop.set()
        thread.join()
    assert read_answer(tmp_path, "0" * 32) is None


def test_collector_processes_rotate_before_a_requested_pass(tmp_path: Path) -> None:
    workers = [RotationRequests(tmp_path, n) for n in range(2)]
    assert asyncio.run(workers[0].wait(0.05)) == []  # nothing asked: the period passes
    plain = request_pass(tmp_path, "no rotation")
    request_id = request_pass(tmp_path, "with rotation", rotate=True)
    started = time.monotonic()
    assert asyncio.run(workers[0].wait(3600)) == [request_id]
    assert time.monotonic() - started < 1
    requests = PassRequests(tmp_path)
    taken = requests.take()
    assert sorted(taken) == sorted([plain, request_id])
    workers[0].done([request_id])
    assert workers[0].asking() == [] and workers[1].asking() == [request_id]  # a taken request still asks
    assert not requests.wait_rotated(taken, writers=2, timeout=0.2)  # worker 1 has not rotated yet
    workers[1].done([request_id])
    assert requests.wait_rotated(taken, writers=2, timeout=0.2)
    requests.answer(taken, None, "test")
    assert not list((tmp_path / "requests").glob("*.rotated.*"))


# --- replay without a node ------------------------------------------------------------------------


def test_replay_command_runs_the_pass_itself_when_no_node_serves(
    tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str
) -> None:
    config = config_file(tmp_path, {"pg": pg_dest(pg_datasource), "live": pg_dest(pg_datasource, "stream")})
    log_path = tmp_path / "events"
    write_failed(log_path, "pg", events("f", 5))
    dry = run_cli(tmp_path, "replay", "failed.dst=pg.log", "--dry-run")
    assert "would replay 5 event(s) of failed/failed.dst=pg.log into pg (batch)" in dry.stdout, dry.stderr
    done = run_cli(tmp_path, "replay", "failed.dst=pg.log")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 event(s) → pg" in done.stdout and "OK" in done.stdout
    assert ids_in(pg_schema) == [f"f-{n}" for n in range(5)]
    again = run_cli(tmp_path, "replay", "failed.dst=pg.log")
    assert again.returncode == 1 and "Already replayed" in again.stderr
    # Into a stream destination: the events wait in its queue, under a writer of their own.
    moved = failed_files(log_path)[0].file_name
    loaded = load_config(config)
    record = hand_over(loaded.config, plan_replay(loaded.config, moved, "live"))
    assert record["destinations"]["live"] == {"mode": "stream", "events": 5, "queue": "queue.dst=live"}
    records: list[bytes] = []
    for segment in sorted((log_path / "queue.dst=live").glob("replay.*.dque")):
        parse_records(segment.read_bytes()[len(MAGIC) :], records, limit=100)
    assert [orjson.loads(r)["eventn_ctx"]["event_id"] for r in records] == [f"f-{n}" for n in range(5)]


def test_unreadable_lines_stay_in_the_moved_file(tmp_path: Path, pg_datasource: dict[str, Any]) -> None:
    config = config_file(tmp_path, {"pg": pg_dest(pg_datasource)})
    log_path = tmp_path / "events"
    path = write_failed(log_path, "pg", events("u", 2))
    with path.open("ab") as file:
        file.write(b"{torn line\n")
    loaded = load_config(config)
    plan = plan_replay(loaded.config, "failed.dst=pg.log")
    assert count_events(plan) == (2, 1)
    record = hand_over(loaded.config, plan)
    assert (record["events"], record["unreadable"]) == (2, 1)
    assert not path.exists()
    moved = log_path / record["moved_to"]
    assert moved.read_bytes().endswith(b"{torn line\n")  # nothing is deleted
    replay_log = log_path / "incoming" / record["destinations"]["pg"]["replay_log"]
    assert [orjson.loads(line)["eventn_ctx"]["event_id"] for line in replay_log.read_bytes().splitlines()] == [
        "u-0",
        "u-1",
    ]


# --- through a node with two collector worker processes -------------------------------------------


def test_replay_through_worker_processes(
    run_server: Any, tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str
) -> None:
    log_path = tmp_path / "events"
    write_failed(log_path, "pg", events("w", 7))
    config = orjson.loads(
        orjson.dumps(yaml.safe_load(config_file(tmp_path, {"pg": pg_dest(pg_datasource, keyed=False)}).read_text()))
    )
    config["server"]["workers"] = 2
    server = run_server(config)
    answer = httpx.post(
        f"{server.url}/api/v1/replay",
        headers={"X-Admin-Token": ADMIN},
        params={"wait": 500},  # the node's first pass starts Spark: slow on a loaded machine
        json={"file_name": "failed.dst=pg.log"},
        timeout=600,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["pass"]["pairs"] == [
        {"destination_id": "pg", "table": "events", "rows": 7, "failed": 0, "skipped": 0, "error": ""}
    ]
    assert ids_in(pg_schema) == [f"w-{n}" for n in range(7)]
    # Polled with wait=0: 202, then the answer at the address given.
    pending = httpx.post(f"{server.url}/api/v1/batch/run", params={"wait": 0, "token": ADMIN}, timeout=30)
    assert pending.status_code == 202, pending.text
    poll = pending.json()["poll"]
    deadline = time.monotonic() + 120
    while (state := httpx.get(f"{server.url}{poll}", headers={"X-Admin-Token": ADMIN}, timeout=30).json())[
        "status"
    ] in (
        "pending",
        "running",
    ):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert state["status"] == "ok" and state["request_id"] == pending.json()["request_id"]


def test_replay_command_with_log_remote_uploads_the_replay_log_before_its_pass(
    tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str, moto_s3: str, s3_bucket: str
) -> None:
    # Review: without a serving node, `eventspark replay` ran the pass without uploading the replay
    # log first: it stayed in the local incoming/ and the pass, reading the store, found nothing.
    remote_config_file(tmp_path, {"pg": pg_dest(pg_datasource)}, moto_s3, s3_bucket)
    log_path = tmp_path / "events"
    write_failed(log_path, "pg", events("r", 3))

    done = run_cli(tmp_path, "replay", "failed.dst=pg.log")
    assert done.returncode == 0, done.stdout + done.stderr
    assert ids_in(pg_schema) == [f"r-{n}" for n in range(3)]
    assert not [p for p in (log_path / "incoming").iterdir() if replay_destination(p.name)]
    archived = [key for key in s3_keys(moto_s3, s3_bucket) if key.startswith("events/archive/")]
    assert len(archived) == 1 and "replay.dst=pg-" in archived[0]
