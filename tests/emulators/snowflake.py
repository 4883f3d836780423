"""Snowflake for the tests: fakesnow's server (`fakesnow[server]` 0.12.1, a dev dependency) on a
free loopback port, once per session; the real snowflake-connector-python talks to it over HTTP.
../shared/emulators.md section 1 lists what works (and docs/destinations/snowflake.md what
eventspark meets of it).

`fakesnow_server` gives the port; `snowflake_db` a fresh database per test (connections share one
in-memory DuckDB, so each test gets its own database and never sees another's tables), dropped
after the test. `sf_connect` opens a connection with the driver, bypassing eventspark.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SF_HOST = "127.0.0.1"
_FOLDERS: dict[int, Path] = {}
"""The TMPDIR of the fakesnow server on each port (its internal stages live under it)."""


def sf_connect(port: int, database: str | None = None, schema: str | None = None, **options: Any) -> Any:
    """A connection of the driver to the test server (fakesnow takes any user and password)."""
    import snowflake.connector

    return snowflake.connector.connect(
        user="fake",
        password="snow",
        account="fakesnow",
        host=SF_HOST,
        port=port,
        protocol="http",
        database=database,
        schema=schema,
        session_parameters={"CLIENT_OUT_OF_BAND_TELEMETRY_ENABLED": False, "TIMEZONE": "UTC"},
        network_timeout=20,
        login_timeout=10,
        paramstyle="qmark",
        **options,
    )


def sf_rows(port: int, sql: str, params: Any = None, database: str | None = None) -> list[tuple[Any, ...]]:
    conn = sf_connect(port, database)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


def internal_stage_url(port: int, database: str, schema: str, stage: str) -> str:
    """The `file://` URL of the folder where the fakesnow server on `port` keeps the internal
    stage `database.schema.stage` (stored names). A named stage created with this URL behaves as
    the internal stage for PUT and LIST, and as an external one for COPY: fakesnow 0.12.1 accepts
    COPY ... FILES = (...) only from a location with a URL scheme (copy_into.py `_source_urls`)."""
    (bucket,) = _FOLDERS[port].glob("fakesnow_bucket_*")
    return f"file://{bucket}/{database}/{schema}/{stage}/"


def _free_port() -> int:
    from tests.destinations.conftest import free_port

    return free_port()


@pytest.fixture(scope="session")
def fakesnow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The port of a fakesnow server running for the session (in-memory databases)."""
    if importlib.util.find_spec("fakesnow") is None:  # not imported: it makes a temp folder on import
        pytest.fail("fakesnow is not installed: pip install -e '.[dev]' (it installs fakesnow[server])", pytrace=False)
    port = _free_port()
    folder = tmp_path_factory.mktemp("fakesnow")
    log = folder / "fakesnow.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "fakesnow", "-s", "--host", SF_HOST, "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=folder,
            env={**os.environ, "TMPDIR": str(folder)},  # its internal stages live under TMPDIR
        )
    try:
        _wait_until_up(port, process, log)
        _FOLDERS[port] = folder
        yield port
    finally:
        _FOLDERS.pop(port, None)
        process.send_signal(signal.SIGINT)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _wait_until_up(port: int, process: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"fakesnow exited ({process.returncode}): {log.read_text(errors='replace')}", pytrace=False)
        try:
            with socket.create_connection((SF_HOST, port), timeout=1):
                pass
            sf_rows(port, "SELECT 1")
            return
        except Exception:
            time.sleep(0.1)
    process.kill()
    pytest.fail(f"fakesnow did not answer on {SF_HOST}:{port} within {timeout} s", pytrace=False)


@pytest.fixture
def snowflake_db(fakesnow_server: int) -> str:
    """A fresh database (upper-case name, as Snowflake folds it). fakesnow 0.12.1 cannot parse
    DROP DATABASE: the databases stay in the server's memory until the session ends."""
    name = f"T_{uuid.uuid4().hex[:12].upper()}"
    sf_rows(fakesnow_server, f"CREATE DATABASE {name}")
    return name
