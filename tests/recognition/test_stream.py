"""Users recognition in stream mode, on real warehouses through the stream worker (the same
`StreamWorkers.build` as `serve`): anonymous events first, then an identification; the earlier
rows of that anonymous id get the user id in every table, other ids stay anonymous."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

from tests.conftest import pg_conninfo
from tests.destinations import conftest as destination_fixtures
from tests.destinations.conftest import ClickHouseServer, mysql_connect
from tests.recognition.helpers import ANONYMOUS, EXPECTED, IDENTIFY, KEY, RECOGNITION, page, wait_for_mutations
from tests.stream.helpers import Harness, duckdb_stream, make_config, postgres_stream

clickhouse_server = destination_fixtures.clickhouse_server
clickhouse_db = destination_fixtures.clickhouse_db
mysql_db = destination_fixtures.mysql_db

TEMPLATE = "{{.event_type}}"
Reader = Callable[[str], dict[str, Any]]


def run(harness: Harness, read: Reader, flush: Callable[[], None] = lambda: None) -> None:
    harness.append(*ANONYMOUS)
    harness.drain()  # anonymous rows only: the tables have no user_id column yet
    harness.append(*IDENTIFY)
    harness.drain()
    flush()
    assert {table: read(table) for table in EXPECTED} == EXPECTED
    # Later anonymous events of a known id get the user too (the index remembers it).
    # ...and an identified pageview finds the user_id column recognition added (no second ADD).
    harness.append(page(6, "a1"), page(7, "a3"), page(8, "a1", id="u1"))
    harness.drain()
    flush()
    assert read("pageview") == {**EXPECTED["pageview"], "e0006": "u1", "e0007": None, "e0008": "u1"}
    assert harness.failed() == []


@pytest.fixture
def make_harness(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], Harness]]:
    made: list[Harness] = []

    def make(dest: dict[str, Any]) -> Harness:
        harness = Harness.build(make_config(tmp_path, {"dest": dest}, **RECOGNITION), "dest")
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()


def test_postgres(make_harness: Any, pg_datasource: dict[str, Any], pg_schema: str) -> None:
    harness = make_harness(postgres_stream(pg_datasource, TEMPLATE))

    def read(table: str) -> dict[str, Any]:
        with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
            rows = conn.execute(f'SELECT {KEY}, user_id FROM "{pg_schema}"."{table}"').fetchall()
        return dict(rows)

    run(harness, read)


def test_duckdb(make_harness: Any, tmp_path: Path) -> None:
    path = tmp_path / "warehouse.duckdb"
    harness = make_harness(duckdb_stream(path, TEMPLATE))

    def read(table: str) -> dict[str, Any]:
        harness.worker.delivery.adapter.close()  # one process may open the file at a time
        with duckdb.connect(str(path)) as conn:
            return dict(conn.execute(f"SELECT {KEY}, user_id FROM {table}").fetchall())

    run(harness, read)


def test_mysql(make_harness: Any, mysql_db: str) -> None:
    datasource = {"host": "127.0.0.1", "port": 3306, "db": mysql_db, "username": "root"}
    layout = {"table_name_template": TEMPLATE, "primary_key_fields": [KEY]}
    harness = make_harness({"type": "mysql", "mode": "stream", "datasource": datasource, "data_layout": layout})

    def read(table: str) -> dict[str, Any]:
        conn = mysql_connect(mysql_db)
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT {KEY}, user_id FROM `{table}`")
                return dict(cur.fetchall())
        finally:
            conn.close()

    run(harness, read)


def test_clickhouse_batches_its_mutations(
    make_harness: Any, clickhouse_server: ClickHouseServer, clickhouse_db: str
) -> None:
    dest = {
        "type": "clickhouse",
        "mode": "stream",
        "clickhouse": {"dsns": [f"{clickhouse_server.url}/{clickhouse_db}"], "db": clickhouse_db},
        "data_layout": {"table_name_template": TEMPLATE},
        "stream": {"min_insert_interval_sec": 0},
    }
    harness = make_harness(dest)
    recognition = harness.worker.recognition
    assert recognition is not None and recognition.interval > 0  # mutations are gathered, not per flush

    def flush() -> None:
        recognition.run_if_due(harness.worker.delivery.adapter, force=True)
        wait_for_mutations(clickhouse_server, clickhouse_db)

    def read(table: str) -> dict[str, Any]:
        rows = clickhouse_server.query(f"SELECT {KEY}, user_id FROM `{clickhouse_db}`.`{table}`")
        return {key: (user or None) for key, user in rows}

    run(harness, read, flush)
    mutations = clickhouse_server.query(
        f"SELECT table, count() FROM system.mutations WHERE database = '{clickhouse_db}' GROUP BY table"
    )
    # One mutation per table per run: pageview twice (identify, then e0006), click once.
    assert {table: int(count) for table, count in mutations} == {"pageview": 2, "click": 1}
