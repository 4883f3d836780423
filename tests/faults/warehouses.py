"""The warehouse down for minutes under load (tests/faults/test_warehouse_down.py): one
`eventspark serve` with a batch and a stream destination on the same warehouse, clients posting
all along, the warehouse taken away and brought back (serve itself restarted halfway through when
a test asks); then every acknowledged event must be in both tables once.

The tables are read with plain drivers (`tests.stream.warehouses`' readers, `PostgresTable`
here), never through eventspark's own clients, so that a bug there cannot hide itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass, field
from typing import Any, Protocol

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from eventspark.logs.rotated import rotated_logs
from eventspark.stream.queue import queue_dir
from tests.collector.conftest import Server
from tests.stream.warehouses import KEY, STREAM_SETTINGS, TOKENS, Load, event_id, queued_bytes

ADMIN = "fault-admin"
BATCH, STREAM = "dw_batch", "dw_stream"
"""The two destinations, and their tables (`events_batch`, `events_stream`)."""
OUTAGE_ENV = "EVENTSPARK_FAULT_OUTAGE_SEC"
CLIENT_THREADS = 3
CLIENT_PAUSE_SEC = 0.01
"""Between two posts of one client: a few hundred events a second in all, on a 2-core machine
that also runs Spark, a warehouse and other tests."""
AFTER_SEC = 2.0
"""The load goes on this long after the warehouse is back: recovery under load, too."""
CATCH_UP_SEC = 240.0
"""Bound on the wait for every acknowledged event after the load stops (a batch pass over the
logs of the whole outage on `local[1]`, behind a back-off of at most `retry.max_sec`)."""


def outage_sec(default: float) -> float:
    """The outage length: `EVENTSPARK_FAULT_OUTAGE_SEC` when set, else this warehouse's default."""
    text = os.environ.get(OUTAGE_ENV, "").strip()
    return float(text) if text else default


def node_config(batch: dict[str, Any], stream: dict[str, Any]) -> dict[str, Any]:
    """Serve's config: short rotation and uploader period so passes run during the outage, and a
    retry policy of 1 s doubling up to 5 s so recovery shows within seconds."""
    return {
        "server": {"admin_token": ADMIN},
        "api_keys": TOKENS,
        "log": {"rotation_min": 0.05, "uploader_period_sec": 2},
        "spark": {"master": "local[1]"},
        "stream": STREAM_SETTINGS,
        "retry": {"base_sec": 1, "max_sec": 5},
        "destinations": {BATCH: batch, STREAM: stream},
    }


def as_batch(stream: dict[str, Any], table: str) -> dict[str, Any]:
    """The batch twin of a stream destination, into `table`, without primary keys: the load
    markers alone keep a pass's rows from being loaded twice, and a duplicate would show."""
    layout = {k: v for k, v in stream["data_layout"].items() if k != "primary_key_fields"}
    return {**stream, "mode": "batch", "data_layout": {**layout, "table_name_template": table}}


class Table(Protocol):
    def counts(self) -> tuple[int, int]: ...

    def ids_and_numbers(self) -> dict[str, int]: ...


@dataclass
class PostgresTable:
    """`schema.table` on a PostgreSQL server, read with psycopg."""

    conninfo: str
    schema: str
    table: str

    def _select(self, sql: str) -> list[tuple[Any, ...]] | None:
        """Rows of `sql`; None when the server is down or the table does not exist yet."""
        try:
            with psycopg.connect(self.conninfo, connect_timeout=2) as conn:
                return list(conn.execute(sql.encode()).fetchall())
        except (psycopg.OperationalError, psycopg.errors.UndefinedTable):
            return None

    def counts(self) -> tuple[int, int]:
        rows = self._select(f'SELECT count(*), count(DISTINCT {KEY}) FROM "{self.schema}"."{self.table}"')
        return (0, 0) if rows is None else (int(rows[0][0]), int(rows[0][1]))

    def ids_and_numbers(self) -> dict[str, int]:
        rows = self._select(f'SELECT {KEY}, n FROM "{self.schema}"."{self.table}"')
        return {key: int(n) for key, n in rows or ()}


# --- serve's metrics ----------------------------------------------------------------------------


def metric_total(server: Server, name: str, **labels: str) -> float:
    """The sum of the samples of `name` in `/prometheus` whose labels include `labels`."""
    response = httpx.get(f"{server.url}/prometheus", headers={"X-Admin-Token": ADMIN}, timeout=30)
    assert response.status_code == 200, response.text
    wanted = set(labels.items())
    return sum(
        sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name == name and wanted <= set(sample.labels.items())
    )


@dataclass
class Counters:
    """The pipeline's counters at one moment, or their growth over a while."""

    passes: float = 0
    failed_passes: float = 0
    stream_retries: float = 0

    @classmethod
    def read(cls, server: Server) -> Counters:
        return cls(
            metric_total(server, "eventspark_batch_passes_total"),
            metric_total(server, "eventspark_batch_passes_total", result="failed"),
            metric_total(server, "eventspark_stream_retries_total", destination=STREAM),
        )

    def __add__(self, other: Counters) -> Counters:
        return Counters(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def __sub__(self, other: Counters) -> Counters:
        return Counters(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))


# --- the scenario -------------------------------------------------------------------------------


@dataclass
class Node:
    """The serve processes of one test, the running one last. `restart` (when set) replaces the
    running process halfway through the outage: a restart while events wait for the warehouse
    (jitsu#1023 lost them)."""

    servers: list[Server]
    restart: Callable[[Server], Server] | None = None
    restart_name: str = ""

    @property
    def current(self) -> Server:
        return self.servers[-1]


@dataclass
class Outcome:
    """What the load and the tables showed; `figure()` is the test's line in the summary."""

    outage: float
    acknowledged: set[int]
    during: int
    seen: Counters
    stored: dict[str, dict[str, int]]
    counts: dict[str, tuple[int, int]]
    caught_up_sec: float
    failed_lines: int = 0
    restart: str = ""
    unanswered: int = 0
    """Posts that got no answer (the port closed during a restart): not acknowledged, not counted."""
    extra: list[str] = field(default_factory=list)

    def lost(self, dest: str) -> int:
        return len({event_id(n) for n in self.acknowledged} - self.stored[dest].keys())

    def duplicated(self, dest: str) -> int:
        rows, distinct = self.counts[dest]
        return rows - distinct

    def figure(self) -> str:
        tables = ", ".join(f"{d.split('_')[1]} {len(self.stored[d]):,}" for d in (BATCH, STREAM))
        lost = sum(self.lost(d) for d in (BATCH, STREAM))
        duplicated = sum(self.duplicated(d) for d in (BATCH, STREAM))
        restart = (
            f", serve restarted ({self.restart}) halfway, {self.unanswered} posts unanswered" if self.restart else ""
        )
        return (
            f"outage {self.outage:.0f} s{restart}, acknowledged {len(self.acknowledged):,} ({self.during:,} during "
            f"the outage; in the tables: {tables}), lost {lost}, duplicated {duplicated}, failed {self.failed_lines}, "
            f"batch passes during the outage {self.seen.passes:.0f} ({self.seen.failed_passes:.0f} failed), "
            f"stream retries {self.seen.stream_retries:.0f}, caught up {self.caught_up_sec:.0f} s after the load "
            "stopped" + "".join(f", {x}" for x in self.extra)
        )


def wait_for_rows(server: Server, tables: dict[str, Table], at_least: int, timeout: float = 120) -> None:
    """Until each table holds `at_least` events: the table exists, Spark is warm, the load flows."""
    deadline = time.monotonic() + timeout
    while any(table.counts()[1] < at_least for table in tables.values()):
        assert server.process.poll() is None, server.text()[-3000:]
        found = {dest: table.counts() for dest, table in tables.items()}
        assert time.monotonic() < deadline, f"{found} after {timeout} s:\n{server.text()[-3000:]}"
        time.sleep(0.5)


def outage_under_load(
    node: Node, tables: dict[str, Table], down: Callable[[], None], up: Callable[[], None], outage: float
) -> Outcome:
    """Posts events all along while the warehouse is down for `outage` seconds and back; then
    waits until every acknowledged event is in both tables (or `CATCH_UP_SEC` passes)."""
    load = Load(node.current.url, threads=CLIENT_THREADS, pause=CLIENT_PAUSE_SEC)
    load.start()
    try:
        wait_for_rows(node.current, tables, 100)
        went_down = time.monotonic()
        down()
        try:
            during, seen = _through_outage(node, load, outage)
        finally:
            up()  # whatever happened: the next test needs the warehouse
        # From the fault until the warehouse answers again (its start-up included).
        outage = time.monotonic() - went_down
        time.sleep(AFTER_SEC)
    finally:
        load.stop()
    assert load.refused == [], load.refused[:5]
    # A restart closes the port for a moment: those posts are not acknowledged, and not counted.
    assert node.restart is not None or load.transport_errors == 0, load.transport_errors
    acknowledged = load.acknowledged
    stopped = time.monotonic()
    stored = wait_for_ids(tables, {event_id(n) for n in acknowledged}, CATCH_UP_SEC)
    caught_up = time.monotonic() - stopped
    counts = {dest: table.counts() for dest, table in tables.items()}
    outcome = Outcome(outage, acknowledged, during, seen, stored, counts, caught_up, restart=node.restart_name)
    outcome.failed_lines, outcome.unanswered = failed_lines(node.current), load.transport_errors
    for dest, found in stored.items():
        assert found.keys() <= load.sent_ids(), f"{dest} holds events nobody sent"
        assert all(key == event_id(n) for key, n in found.items()), f"{dest}: an event's fields were mixed up"
    return outcome


def _through_outage(node: Node, load: Load, outage: float) -> tuple[int, Counters]:
    """Waits out the outage (restarting serve halfway when the node says so); the events
    acknowledged meanwhile and how the counters grew (read before the warehouse is back: the
    passes of the outage only)."""
    deadline = time.monotonic() + outage
    first, start, seen = len(load.acknowledged), Counters.read(node.current), Counters()
    if node.restart is not None:
        time.sleep(outage / 2)
        seen += Counters.read(node.current) - start
        node.servers.append(node.restart(node.current))
        start = Counters.read(node.current)
    time.sleep(max(0.0, deadline - time.monotonic()))
    seen += Counters.read(node.current) - start
    return len(load.acknowledged) - first, seen


def wait_for_ids(tables: dict[str, Table], wanted: set[str], timeout: float) -> dict[str, dict[str, int]]:
    """Polls the tables until each holds every id of `wanted` or `timeout` passes; their last content."""
    deadline = time.monotonic() + timeout
    stored = {dest: table.ids_and_numbers() for dest, table in tables.items()}
    while any(not wanted <= found.keys() for found in stored.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
        stored = {dest: table.ids_and_numbers() for dest, table in tables.items()}
    return stored


def failed_lines(server: Server) -> int:
    """Lines in `events/failed/` for any destination."""
    folder = server.events_dir / "failed"
    return sum(len(p.read_bytes().splitlines()) for p in folder.glob("*.log")) if folder.is_dir() else 0


def assert_settled(node: Node, timeout: float = 60) -> None:
    """The stream queue acknowledged and every rotated log loaded and archived (within `timeout`),
    then serve stops cleanly; no process of the node logged a traceback."""
    server = node.current
    queue, incoming = queue_dir(server.events_dir, STREAM), server.events_dir / "incoming"
    deadline = time.monotonic() + timeout
    while queued_bytes(queue) > 0 or rotated_logs(incoming):
        waiting = [p.name for p in rotated_logs(incoming)]
        assert time.monotonic() < deadline, f"queue {queued_bytes(queue)} bytes, logs {waiting}"
        time.sleep(0.5)
    assert server.stop() == 0, server.text()[-3000:]
    for each in node.servers:
        assert "Traceback" not in each.text(), each.text()[-5000:]
