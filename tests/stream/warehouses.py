"""Warehouses and a load client for the end-to-end stream tests through `eventspark serve`.

- `MariaDBServer` / `private_mariadb`: a private MariaDB (scripts/mariadb.sh) that a test may
  kill; the machine's server on 3306 stays up for everyone else.
- `kill_clickhouse`: SIGKILL of the ClickHouse test server (the pid file of scripts/clickhouse.sh).
- `ClickHouseTable`, `MySQLTable`: what a table holds, read with plain HTTP / PyMySQL (not with
  eventspark's own clients, so a bug there cannot hide itself).
- `Load` / `Poster`: threads posting numbered events to serve's s2s endpoint, recording the
  acknowledged ones; `queued_bytes`: what serve's queue holds unacknowledged, read from outside.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pymysql
import pytest

from tests.destinations.conftest import ClickHouseServer, free_port
from tests.private_postgres import process_alive

ROOT = Path(__file__).resolve().parents[2]
MARIADB_SCRIPT = ROOT / "scripts" / "mariadb.sh"
TOKENS = [{"id": "web", "client_secret": "web-js", "server_secret": "web-s2s"}]
S2S_PATH = "/api/v1/s2s/event?token=web-s2s"
KEY = "eventn_ctx_event_id"
SEGMENT_MAGIC = b"ESQUEUE1"
TABLE = "events"
STREAM_SETTINGS = {"batch_wait_ms": 20, "retry_min_sec": 0.2, "retry_max_sec": 1.0, "poll_ms": 5}
"""Short backoffs: a worker finds the restarted warehouse within a second."""


def event_id(n: int) -> str:
    return f"e{n:07d}"


def serve_config(destinations: dict[str, Any]) -> dict[str, Any]:
    """A config for `tests.collector.conftest.start_server` (which adds the port and log.path)."""
    return {"api_keys": TOKENS, "log": {"rotation_min": 60}, "destinations": destinations, "stream": STREAM_SETTINGS}


def clickhouse_stream(server: ClickHouseServer, db: str, table: str = TABLE) -> dict[str, Any]:
    """A stream destination with the default table layout (ReplacingMergeTree ordered by the event id)."""
    return {
        "type": "clickhouse",
        "mode": "stream",
        "clickhouse": {"dsns": [f"{server.url}/{db}"], "db": db},
        "data_layout": {"table_name_template": table},
    }


def mysql_stream(port: int, db: str, table: str = TABLE) -> dict[str, Any]:
    """A stream destination upserting on the event id: a redelivered batch is loaded once."""
    return {
        "type": "mysql",
        "mode": "stream",
        "datasource": {"host": "127.0.0.1", "port": port, "db": db, "username": "root"},
        "data_layout": {"table_name_template": table, "primary_key_fields": [KEY]},
    }


# --- reading the tables -------------------------------------------------------------------------


@dataclass
class ClickHouseTable:
    """`db.events` on a ClickHouse server, read through the HTTP interface."""

    server: ClickHouseServer
    db: str
    table: str = TABLE

    def _select(self, sql: str) -> list[list[str]] | None:
        """TSV rows of `sql`; None when the table does not exist yet (code 60) or the server is down."""
        try:
            response = httpx.post(f"http://127.0.0.1:{self.server.http_port}/", content=sql + " FORMAT TSV", timeout=10)
        except httpx.TransportError:
            return None
        if response.status_code != 200:
            if "Code: 60," in response.text or "Code: 81," in response.text:  # no table / no database
                return None
            raise AssertionError(f"ClickHouse refused {sql!r}: {response.text}")
        return [line.split("\t") for line in response.text.splitlines()]

    def counts(self, final: bool = True) -> tuple[int, int]:
        """(rows, distinct event ids) as queries see them after duplicates collapse (FINAL); with
        `final` False, the rows stored, duplicates not merged yet included."""
        rows = self._select(
            f"SELECT count(), uniqExact({KEY}) FROM `{self.db}`.`{self.table}`" + (" FINAL" if final else "")
        )
        return (0, 0) if rows is None else (int(rows[0][0]), int(rows[0][1]))

    def ids_and_numbers(self) -> dict[str, int]:
        """Event id -> n of every row (FINAL); empty before the table exists."""
        rows = self._select(f"SELECT {KEY}, n FROM `{self.db}`.`{self.table}` FINAL")
        return {key: int(n) for key, n in rows or ()}

    def values_of(self, column: str, n: int) -> list[str]:
        """The `column` of each row of event n, as text."""
        rows = self._select(f"SELECT toString(`{column}`) FROM `{self.db}`.`{self.table}` WHERE n = {n}")
        return [row[0] for row in rows or ()]


@dataclass
class MySQLTable:
    """`db.events` on a MySQL/MariaDB server."""

    port: int
    db: str
    table: str = TABLE

    def _select(self, sql: str) -> list[tuple[Any, ...]] | None:
        try:
            conn = pymysql.connect(
                host="127.0.0.1", port=self.port, user="root", password="", database=self.db, connect_timeout=2
            )
        except pymysql.err.OperationalError:
            return None  # down, or the database is not created yet
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return list(cur.fetchall())
        except pymysql.err.ProgrammingError as exc:
            if exc.args[0] == 1146:  # no such table yet
                return None
            raise
        finally:
            conn.close()

    def counts(self) -> tuple[int, int]:
        rows = self._select(f"SELECT count(*), count(DISTINCT {KEY}) FROM `{self.table}`")
        return (0, 0) if rows is None else (int(rows[0][0]), int(rows[0][1]))

    def ids_and_numbers(self) -> dict[str, int]:
        """Event id -> n of every row; empty before the table exists."""
        rows = self._select(f"SELECT {KEY}, n FROM `{self.table}`")
        return {key: int(n) for key, n in rows or ()}

    def values_of(self, column: str, n: int) -> list[str]:
        """The `column` of each row of event n, as text."""
        rows = self._select(f"SELECT CAST(`{column}` AS CHAR) FROM `{self.table}` WHERE n = {n}")
        return [row[0] for row in rows or ()]


def wait_for_counts(counts: Callable[[], tuple[int, int]], expected: int, timeout: float) -> tuple[int, int]:
    """Polls `counts` until it holds `expected` distinct events or `timeout` passes; the last counts."""
    deadline = time.monotonic() + timeout
    found = counts()
    while found[1] < expected and time.monotonic() < deadline:
        time.sleep(0.2)
        found = counts()
    return found


# --- servers ------------------------------------------------------------------------------------


@dataclass
class MariaDBServer:
    """A private MariaDB in `folder`, on 127.0.0.1:`port` (root, no password)."""

    folder: Path
    port: int

    def _script(self, *args: str, timeout: float) -> None:
        subprocess.run([str(MARIADB_SCRIPT), *args], check=True, timeout=timeout)

    def start(self) -> None:
        self._script("start", str(self.folder), str(self.port), timeout=120)

    def stop(self) -> None:
        self._script("stop", str(self.folder), timeout=90)

    def kill(self) -> None:
        """SIGKILL, as a crash; returns once the process is gone."""
        self._script("kill", str(self.folder), timeout=30)


@pytest.fixture
def private_mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBServer]:
    server = MariaDBServer(tmp_path_factory.mktemp("mariadb"), free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def kill_clickhouse(server: ClickHouseServer, timeout: float = 30) -> None:
    """SIGKILL of the server started in `server.folder`; returns once the process is gone."""
    pid = int((server.folder / "server.pid").read_text().strip())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while process_alive(pid):
        assert time.monotonic() < deadline, f"ClickHouse ({pid}) survived SIGKILL for {timeout} s"
        time.sleep(0.05)


def queued_bytes(queue: Path) -> int:
    """Bytes of a stream queue not acknowledged by its consumer, read without taking the consumer's
    lock (the consumer is running): segments `<writer>.<seq>.dque` past `offsets.json`'s
    `{writer: [seq, offset]}` (the on-disk format of docs/stream.md). A racy snapshot: good
    enough to choose a moment to kill, not to prove anything."""
    try:
        offsets = orjson.loads((queue / "offsets.json").read_bytes())
    except FileNotFoundError:
        offsets = {}
    except orjson.JSONDecodeError:
        return 0  # caught between write and rename: look again
    total = 0
    for segment in queue.glob("*.dque"):
        writer, seq_text, _ = segment.name.rsplit(".", 2)
        acked_seq, acked_offset = offsets.get(writer, (0, 0))
        seq = int(seq_text)
        if seq < acked_seq:
            continue
        try:
            size = segment.stat().st_size
        except FileNotFoundError:
            continue  # consumed and deleted meanwhile
        total += max(0, size - (max(acked_offset, len(SEGMENT_MAGIC)) if seq == acked_seq else len(SEGMENT_MAGIC)))
    return total


# --- load ---------------------------------------------------------------------------------------


class Poster(threading.Thread):
    """Posts events n = first, first + step, ... to serve, one at a time, until `halt` is set.

    `acknowledged` holds the n answered 200, `refused` the (n, status) of other answers, `sent`
    how many requests went out (the highest n sent is below first + sent * step). A transport error
    (serve killed, restarting) is not an acknowledgement: the poster waits a little and goes on.
    """

    def __init__(self, url: str, first: int = 0, step: int = 1, pause: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.url, self.first, self.step, self.pause = url, first, step, pause
        self.acknowledged: list[int] = []
        self.refused: list[tuple[int, int]] = []
        self.transport_errors = 0
        self.sent = 0
        self.halt = threading.Event()

    def run(self) -> None:
        n = self.first
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self.halt.is_set():
                body = {"event_type": "load", "eventn_ctx": {"event_id": event_id(n)}, "n": n, "pad": "x" * 100}
                self.sent += 1
                try:
                    status = client.post(S2S_PATH, json=body).status_code
                except httpx.TransportError:
                    self.transport_errors += 1
                    self.halt.wait(0.05)
                else:
                    if status == 200:
                        self.acknowledged.append(n)
                    else:
                        self.refused.append((n, status))
                n += self.step
                if self.pause:
                    self.halt.wait(self.pause)

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)
        assert not self.is_alive(), "the poster did not stop"


class Load:
    """Several posters sharing the event numbers (thread t posts n ≡ t mod threads)."""

    def __init__(self, url: str, threads: int = 2, pause: float = 0.0) -> None:
        self.posters = [Poster(url, t, threads, pause) for t in range(threads)]

    def start(self) -> None:
        for poster in self.posters:
            poster.start()

    def stop(self) -> None:
        for poster in self.posters:
            poster.halt.set()
        for poster in self.posters:
            poster.stop()

    @property
    def acknowledged(self) -> set[int]:
        return {n for poster in self.posters for n in list(poster.acknowledged)}

    @property
    def refused(self) -> list[tuple[int, int]]:
        return [r for poster in self.posters for r in poster.refused]

    @property
    def transport_errors(self) -> int:
        return sum(poster.transport_errors for poster in self.posters)

    def sent_ids(self) -> set[str]:
        """Every id that went out, acknowledged or not: nothing else may reach a table."""
        return {event_id(p.first + i * p.step) for p in self.posters for i in range(p.sent)}
