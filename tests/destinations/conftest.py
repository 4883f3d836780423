"""Warehouse servers for the destination tests.

ClickHouse: a private server (scripts/clickhouse.sh, Debian's clickhouse-server installed when
missing) on free loopback ports with its data in a temporary folder, started once per session;
each test gets a fresh database. MySQL: the machine's MariaDB at 127.0.0.1:3306 (root, no
password); each test gets a fresh database, dropped afterwards.
"""

from __future__ import annotations

import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLICKHOUSE_SCRIPT = ROOT / "scripts" / "clickhouse.sh"
MYSQL_HOST, MYSQL_PORT, MYSQL_USER = "127.0.0.1", 3306, "root"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class ClickHouseServer:
    """A running test server; `stop` and `start` let a test take it down and bring it back."""

    folder: Path
    http_port: int
    tcp_port: int

    @property
    def url(self) -> str:
        return f"http://default:@127.0.0.1:{self.http_port}"

    def start(self) -> None:
        command = [str(CLICKHOUSE_SCRIPT), "start", str(self.folder), str(self.http_port), str(self.tcp_port)]
        subprocess.run(command, check=True, timeout=600)

    def stop(self) -> None:
        subprocess.run([str(CLICKHOUSE_SCRIPT), "stop", str(self.folder)], check=True, timeout=60)

    def query(self, sql: str) -> list[list[Any]]:
        """Rows of `sql` through the HTTP interface (JSON values)."""
        from eventspark.destinations.clickhouse.client import Client, parse_dsn

        client = Client(parse_dsn(self.url))
        try:
            if sql.lstrip().upper().startswith(("SELECT", "WITH")):
                return client.rows(sql)
            client.execute(sql)
            return []
        finally:
            client.close()


@pytest.fixture(scope="session")
def clickhouse_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseServer]:
    server = ClickHouseServer(tmp_path_factory.mktemp("clickhouse"), free_port(), free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def clickhouse_db(clickhouse_server: ClickHouseServer) -> Iterator[str]:
    """A fresh database name (created by the adapter on first use), dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    clickhouse_server.start()  # a test may have stopped it; starting a running server is a no-op
    clickhouse_server.query(f"DROP DATABASE IF EXISTS `{name}`")


def mysql_connect(database: str | None = None) -> Any:
    import pymysql

    return pymysql.connect(
        host=MYSQL_HOST, port=MYSQL_PORT, user=MYSQL_USER, password="", database=database, autocommit=True
    )


@pytest.fixture
def mysql_db() -> Iterator[str]:
    """A fresh, empty MySQL database, dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    conn = mysql_connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        yield name
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()
