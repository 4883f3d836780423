"""`/prometheus` and `eventspark status` against a running `eventspark serve`.

One node with a batch DuckDB destination and a stream Postgres destination (127.0.0.1:5432, db
`test`, a schema of its own) is watched while events wait and after they are loaded; another with
`server.workers: 2` shows the accepted counters summed over both workers, and kept across a restart.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from eventspark.steps.template import LOADS_TABLE
from tests.collector import conftest as collector_fixtures
from tests.collector.conftest import EVENTSPARK, Server, start_server
from tests.conftest import PG_DB, PG_HOST, PG_PORT, PG_USER, pg_conninfo

run_server = collector_fixtures.run_server

ADMIN = "obs-admin"
KEYS = [{"id": "web", "client_secret": "obs-js", "server_secret": "obs-s2s"}]
HOLD_SECONDS = 10
"""The stream destination's minimum insert interval: events wait that long after an insert."""

Metrics = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(server: Server) -> Metrics:
    """Every sample of `/prometheus`, over a fresh connection (any worker may answer)."""
    response = httpx.get(f"{server.url}/prometheus", headers={"X-Admin-Token": ADMIN}, timeout=30)
    assert response.status_code == 200, response.text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.get((name, frozenset(labels.items())))


def total(metrics: Metrics, name: str, **labels: str) -> float:
    """The sum over the series of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, found), v in metrics.items() if n == name and wanted <= found)


def wait_for(server: Server, check: Callable[[Metrics], bool], timeout: float) -> Metrics:
    deadline = time.monotonic() + timeout
    while True:
        metrics = scrape(server)
        if check(metrics):
            return metrics
        assert server.process.poll() is None, server.text()
        if time.monotonic() > deadline:
            pytest.fail(f"not reached in {timeout} s; last scrape: {metrics}\n{server.text()[-3000:]}")
        time.sleep(0.2)


def send(server: Server, *events: dict[str, Any]) -> None:
    for event in events:  # one request (and connection) each
        response = httpx.post(f"{server.url}/api/v1/s2s/event?token=obs-s2s", content=orjson.dumps(event))
        assert response.status_code == 200, response.text


def status_command(directory: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """`eventspark status -c <the config start_server wrote>`; its output is a pipe, not a terminal."""
    config = directory / "eventspark.json"
    command = [str(EVENTSPARK), "status", "-c", str(config), *options]
    found = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=directory)
    assert found.returncode == 0, found.stderr
    return found


def status_json(directory: Path) -> dict[str, dict[str, Any]]:
    document = orjson.loads(status_command(directory, "--json").stdout)
    return {entry["destination"]: entry for entry in document["destinations"]}


# --- one node, batch and stream -------------------------------------------------------------------


@dataclass
class Scenario:
    """What was seen while the events waited and after they were loaded."""

    server: Server
    schema: str
    started: float
    before: dict[str, dict[str, Any]] = field(default_factory=dict)
    waiting: Metrics = field(default_factory=dict)
    waiting_status: dict[str, dict[str, Any]] = field(default_factory=dict)
    waiting_lines: str = ""
    done: Metrics = field(default_factory=dict)
    done_status: dict[str, dict[str, Any]] = field(default_factory=dict)
    done_lines: str = ""
    done_http: dict[str, dict[str, Any]] = field(default_factory=dict)


def node_config(schema: str) -> dict[str, Any]:
    datasource = {"host": PG_HOST, "port": PG_PORT, "db": PG_DB, "schema": schema, "username": PG_USER}
    return {
        "server": {"admin_token": ADMIN, "name": "observed"},
        "api_keys": KEYS,
        "log": {"rotation_min": 0.1, "uploader_period_sec": 1},
        "spark": {"master": "local[1]"},
        "destinations": {
            "dw": {
                "type": "duckdb",
                "duckdb": {"path": "warehouse.duckdb"},
                "data_layout": {"table_name_template": "{{.event_type}}"},
            },
            "pg": {
                "type": "postgres",
                "mode": "stream",
                "datasource": datasource,
                "data_layout": {"table_name_template": "events"},
                "stream": {"min_insert_interval_sec": HOLD_SECONDS},
            },
        },
    }


def events(numbers: range) -> list[dict[str, Any]]:
    # Event 3 names eventspark's own table: the batch destination sends it to failed/.
    return [{"n": n, "event_type": LOADS_TABLE if n == 3 else "page"} for n in numbers]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    directory = tmp_path_factory.mktemp("observed")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    server = start_server(directory, node_config(schema))
    seen = Scenario(server, schema, time.time())
    try:
        seen.before = status_json(directory)
        # The worker's interval counts from its start, then from each insert: event 0 is inserted
        # within HOLD_SECONDS, and the next ones wait HOLD_SECONDS after it.
        send(server, *events(range(1)))
        delivered = "eventspark_stream_events_delivered_total"
        wait_for(server, lambda m: value(m, delivered, destination="pg") == 1, HOLD_SECONDS + 10)
        send(server, *events(range(1, 6)))
        seen.waiting = wait_for(server, lambda m: queue(m, "pg") == 5 and queue(m, "dw") == 6, 5)
        seen.waiting_status = status_json(directory)
        seen.waiting_lines = status_command(directory).stdout
        seen.done = wait_for(server, loaded_everything, 240)
        seen.done_status = status_json(directory)
        seen.done_lines = status_command(directory).stdout
        answer = httpx.get(f"{server.url}/api/v1/status", headers={"X-Admin-Token": ADMIN}).json()
        seen.done_http = {entry["destination"]: entry for entry in answer["destinations"]}
        yield seen
    finally:
        try:
            server.stop()
        finally:
            if server.process.poll() is None:
                server.stop(signal.SIGKILL)
        with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def queue(metrics: Metrics, dest: str) -> float | None:
    mode = "batch" if dest == "dw" else "stream"
    return value(metrics, "eventspark_destination_queue_events", destination=dest, mode=mode)


def loaded_everything(metrics: Metrics) -> bool:
    return (
        queue(metrics, "dw") == 0
        and queue(metrics, "pg") == 0
        and total(metrics, "eventspark_batch_rows_loaded_total", destination="dw") == 5
        and value(metrics, "eventspark_stream_events_delivered_total", destination="pg") == 6
    )


def test_queue_gauges_count_the_waiting_events(scenario: Scenario) -> None:
    waiting = scenario.waiting
    assert queue(waiting, "dw") == 6 and queue(waiting, "pg") == 5
    assert value(waiting, "eventspark_destination_oldest_pending_seconds", destination="dw", mode="batch") > 0
    assert value(waiting, "eventspark_destination_oldest_pending_seconds", destination="pg", mode="stream") > 0
    assert value(waiting, "eventspark_events_accepted_total", token="web") == 6


def test_queue_gauges_fall_to_zero_once_loaded(scenario: Scenario) -> None:
    done = scenario.done
    assert queue(done, "dw") == 0 and queue(done, "pg") == 0
    assert value(done, "eventspark_destination_pending_logs", destination="dw") == 0
    assert value(done, "eventspark_destination_oldest_pending_seconds", destination="dw", mode="batch") == 0


def test_batch_pass_durations_and_rows_loaded_and_failed(scenario: Scenario) -> None:
    done = scenario.done
    assert value(done, "eventspark_batch_rows_loaded_total", destination="dw", table="page") == 5
    assert total(done, "eventspark_batch_rows_failed_total", destination="dw") == 1
    assert total(done, "eventspark_batch_load_errors_total") == 0
    passes = value(done, "eventspark_batch_pass_duration_seconds_count")
    assert passes is not None and passes >= 1
    assert value(done, "eventspark_batch_passes_total", result="ok") == passes
    assert value(done, "eventspark_batch_pass_duration_seconds_sum") > 0
    assert value(done, "eventspark_destination_failed_events", destination="dw", mode="batch") == 1
    last_load = value(done, "eventspark_destination_last_load_timestamp_seconds", destination="dw", mode="batch")
    assert last_load is not None and scenario.started <= last_load <= time.time()


def test_stream_deliveries_inserts_and_lag(scenario: Scenario) -> None:
    done = scenario.done
    assert value(done, "eventspark_stream_events_delivered_total", destination="pg") == 6
    assert value(done, "eventspark_stream_events_failed_total", destination="pg") == 0
    assert value(done, "eventspark_stream_retries_total", destination="pg") == 0
    inserts = value(done, "eventspark_stream_inserts_total", destination="pg")
    assert inserts is not None and 2 <= inserts <= 6
    lag = value(done, "eventspark_destination_last_event_age_seconds", destination="pg", mode="stream")
    assert lag is not None and 0 <= lag < time.time() - scenario.started
    with psycopg.connect(pg_conninfo()) as conn:
        (rows,) = conn.execute(f'SELECT count(*) FROM "{scenario.schema}".events').fetchone() or (0,)
    assert rows == 6  # what the counter says was delivered is in the warehouse


def test_status_before_during_and_after_a_pass(scenario: Scenario) -> None:
    before, waiting, done = scenario.before, scenario.waiting_status, scenario.done_status
    assert before["dw"]["queue_events"] == 0 and before["dw"]["last_load_at"] is None
    dw = waiting["dw"]
    assert dw["mode"] == "batch" and dw["queue_events"] == 6 and dw["failed_events"] == 0
    assert dw["live_events"] + dw["pending_log_events"] == 6 and dw["oldest_pending_age"] > 0
    assert dw["last_load_at"] is None
    assert waiting["pg"]["mode"] == "stream" and waiting["pg"]["last_load_events"] == 1

    dw = done["dw"]
    assert (dw["queue_events"], dw["pending_logs"], dw["failed_events"]) == (0, 0, 1)
    assert dw["oldest_pending_age"] is None and dw["last_error"] == ""
    assert scenario.started <= dw["last_load_at"] <= time.time() and 1 <= dw["last_load_events"] <= 5
    pg = done["pg"]
    assert (pg["queue_events"], pg["failed_events"], pg["last_load_events"]) == (0, 0, 5)
    assert pg["last_event_age"] is not None


def test_status_over_http_is_the_commands_json(scenario: Scenario) -> None:
    http, done = scenario.done_http, scenario.done_status
    volatile = {"oldest_pending_age", "last_event_age", "exact"}
    assert {d: {k: v for k, v in e.items() if k not in volatile} for d, e in http.items()} == {
        d: {k: v for k, v in e.items() if k not in volatile} for d, e in done.items()
    }
    assert httpx.get(f"{scenario.server.url}/api/v1/status").status_code == 401


def test_status_prints_plain_lines_off_a_terminal(scenario: Scenario) -> None:
    waiting = scenario.waiting_lines.splitlines()
    done = scenario.done_lines.splitlines()
    assert len(waiting) == len(done) == 2
    assert waiting[0].startswith("dw\tmode=batch\tqueue=6\t") and waiting[1].startswith("pg\tmode=stream\tqueue=")
    fields = dict(field.split("=", 1) for field in done[0].split("\t")[1:])
    assert done[0].startswith("dw\t") and fields["queue"] == "0" and fields["failed"] == "1"
    assert fields["last_load"].endswith("Z") and fields["last_error"] == '""'


# --- two collector workers ------------------------------------------------------------------------


def workers_config() -> dict[str, Any]:
    return {
        "server": {"admin_token": ADMIN, "workers": 2},
        "api_keys": KEYS,
        "log": {"rotation_min": 60, "uploader_period_sec": 3600},  # no pass: the events stay queued
        "destinations": {"dw": {"type": "duckdb", "duckdb": {"path": "warehouse.duckdb"}}},
    }


def send_concurrently(server: Server, count: int, threads: int = 8) -> None:
    def worker(numbers: range) -> None:
        send(server, *({"n": n} for n in numbers))

    started = [threading.Thread(target=worker, args=(range(i, count, threads),)) for i in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()


def accepted(metrics: Metrics) -> float | None:
    return value(metrics, "eventspark_events_accepted_total", token="web")


def test_two_workers_sum_their_counters_whichever_answers(run_server: Callable[..., Server]) -> None:
    config = workers_config()
    server = run_server(config)
    send_concurrently(server, 60)
    by_worker = {p.name: len(p.read_bytes().splitlines()) for p in server.incoming.glob("*|w=*.log")}
    assert sum(by_worker.values()) == 60 and len([n for n in by_worker.values() if n]) == 2, by_worker
    wait_for(server, lambda m: accepted(m) == 60, 10)
    for _ in range(20):  # fresh connections: both workers answer some of these
        metrics = scrape(server)
        assert accepted(metrics) == 60 and queue(metrics, "dw") == 60
    snapshots = [p for p in (server.events_dir / "metrics").glob("*.json") if p.name != "retired.json"]
    assert len(snapshots) >= 2  # a snapshot per worker (and the parent's)
    assert server.stop(signal.SIGTERM) == 0

    # Restarted on the same directory: the counters go on from where they were, nothing went back.
    server = run_server(config)
    metrics = scrape(server)
    assert accepted(metrics) == 60
    assert queue(metrics, "dw") == 60  # rotated at shutdown, not loaded: still waiting
    assert value(metrics, "eventspark_destination_pending_logs", destination="dw") == 2
    send_concurrently(server, 4, threads=4)
    wait_for(server, lambda m: accepted(m) == 64 and queue(m, "dw") == 64, 10)
