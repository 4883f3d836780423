"""Fixtures of the live events page's tests: a headless Chromium per test (tests/ui/browser.py) and
one `eventspark serve` with a stream Postgres and a batch DuckDB destination."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.collector.conftest import Server, start_server
from tests.conftest import PG_DB, PG_HOST, PG_PORT, PG_USER, pg_conninfo

ADMIN = "ui-admin-secret"
CLIENT_SECRET = "ui-js-secret"
SERVER_SECRET = "ui-s2s-secret"
PG_PASSWORD = "ui-pg-password"
STREAM_TABLE = "ui_events"


def serve_config(schema: str) -> dict[str, Any]:
    """A stream Postgres destination (its own schema) and a batch DuckDB one, both for token `web`."""
    return {
        "server": {"name": "ui-node", "admin_token": ADMIN},
        "api_keys": [
            {"id": "web", "client_secret": CLIENT_SECRET, "server_secret": SERVER_SECRET},
            {"id": "other", "client_secret": "ui-other-js", "server_secret": "ui-other-s2s"},
        ],
        "log": {"rotation_min": 60},  # the batch destination keeps its events pending
        "destinations": {
            "pg": {
                "type": "postgres",
                "mode": "stream",
                "only_tokens": ["web"],
                "datasource": {
                    "host": PG_HOST,
                    "port": PG_PORT,
                    "db": PG_DB,
                    "schema": schema,
                    "username": PG_USER,
                    "password": PG_PASSWORD,
                },
                "data_layout": {"table_name_template": STREAM_TABLE},
            },
            "dw": {"type": "duckdb"},  # events/warehouse.duckdb
        },
    }


@pytest.fixture(scope="session")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One `eventspark serve` for the page's tests; its Postgres schema is dropped afterwards."""
    import psycopg

    schema = f"ui_{uuid.uuid4().hex[:12]}"
    directory = tmp_path_factory.mktemp("ui")
    server = start_server(directory, serve_config(schema))
    try:
        yield server
    finally:
        server.stop(signal.SIGTERM)
        with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
