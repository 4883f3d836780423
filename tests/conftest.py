"""Shared fixtures: one SparkSession for the whole run, and a private Postgres schema per test.

Postgres is the machine's server at 127.0.0.1:5432 (trust auth, database `test`). It is shared with
everyone on the machine and stays up: a test that stops or kills a server uses `private_postgres`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.private_postgres import PostgresServer

pytest_plugins = [
    "tests.emulators.snowflake",
    "tests.emulators.bigquery",
    "tests.emulators.s3",
    "tests.ui.browser",  # the browser fixtures of tests/ui and tests/static
]

PG_HOST = "127.0.0.1"
PG_PORT = 5432
PG_DB = "test"
PG_USER = "postgres"


def pytest_configure(config: pytest.Config) -> None:
    # pyspark 4.3 warns on every import that it does not fully support pandas 3; eventspark does
    # not use pyspark's pandas layer, so the warning says nothing about this code.
    config.addinivalue_line("filterwarnings", "ignore:PySpark does not yet fully support pandas:FutureWarning")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The SparkSession every batch test shares (`local[2]`); starting one costs 10-15 s."""
    from eventspark.batch.session import get_session, stop_session
    from eventspark.config.models import SparkConfig

    session = get_session(SparkConfig(master="local[2]", conf={"spark.sql.shuffle.partitions": "2"}))
    yield session
    stop_session()


def pg_conninfo(dbname: str = PG_DB) -> str:
    return f"host={PG_HOST} port={PG_PORT} dbname={dbname} user={PG_USER}"


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A fresh schema name in database `test`, dropped (with everything in it) after the test."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def pg_datasource(pg_schema: str) -> dict[str, Any]:
    """The `datasource` section of a postgres destination writing into `pg_schema`."""
    return {"host": PG_HOST, "port": PG_PORT, "db": PG_DB, "schema": pg_schema, "username": PG_USER}


@pytest.fixture(scope="session")
def private_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of the tests' own (tests/private_postgres.py) with an empty database `test`, on
    a free port, that a test may stop, kill and start again; stopped and deleted after the session.
    A test that takes it down brings it back up before it ends."""
    from tests.destinations.conftest import free_port
    from tests.private_postgres import PostgresServer

    server = PostgresServer.initialise(free_port())
    try:
        server.start()
        server.create_database(PG_DB)
        yield server
    finally:
        server.destroy()
