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
from tests.emulators.bigquery import BigQueryEmulator
from tests.emulators.snowflake import SF_HOST, sf_rows
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
    later = {**EXPECTED["pageview"], "e0006": "u1", "e0007": None, "e0008": "u1"}
    assert read("pageview") == later
    # The default nodes fall back to `hashed_anonymous_id` (md5 of address and user agent: shared by
    # every visitor behind one address and browser). An identification through it reaches the rows
    # without an anonymous id of their own, never the rows of another visitor with the same hash.
    harness.append(hashed(page(9, "")), hashed(page(10, "a4")))
    harness.drain()
    harness.append(hashed(page(11, "x" * 600, "identify", id="u9")))  # past MAX_ID_LENGTH: the hash is used
    harness.drain()
    flush()
    assert read("pageview") == {**later, "e0009": "u9", "e0010": None}
    assert harness.failed() == []


def hashed(event: dict[str, Any]) -> dict[str, Any]:
    """`event` with a hashed anonymous id shared with others (and no anonymous id when it is '')."""
    user = {**event["user"], "hashed_anonymous_id": "h-shared"}
    if not user["anonymous_id"]:
        del user["anonymous_id"]
    return {**event, "user": user}


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
    # One mutation per table and anonymous id column per run: pageview three times (identify,
    # e0006, the hashed id's rows), click once.
    assert {table: int(count) for table, count in mutations} == {"pageview": 3, "click": 1}


def test_a_table_with_rows_of_both_sdks(make_harness: Any, pg_datasource: dict[str, Any], pg_schema: str) -> None:
    """JS SDK 1.x rows (`eventn_ctx_user_anonymous_id`) and 2.x rows (`user_anonymous_id`) in one
    table: each gets its user in its own SDK's column (`eventn_ctx_user_id`, `user_id`)."""
    harness = make_harness(postgres_stream(pg_datasource, TEMPLATE))
    old = {"_timestamp": "2026-11-01T10:00:00.000000Z", "event_type": "pageview"}
    harness.append(
        page(1, "a1"),
        {**old, "eventn_ctx": {"event_id": "e0002", "user": {"anonymous_id": "b1"}}},
        page(3, "a2"),
    )
    harness.drain()
    harness.append(
        page(4, "a1", "identify", id="u1"),
        {
            **old,
            "event_type": "identify",
            "eventn_ctx": {"event_id": "e0005", "user": {"anonymous_id": "b1", "id": "v1"}},
        },
    )
    harness.drain()
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        sql = f'SELECT {KEY}, user_id, eventn_ctx_user_id FROM "{pg_schema}".pageview'
        rows = {key: (flat, nested) for key, flat, nested in conn.execute(sql).fetchall()}
    assert rows == {"e0001": ("u1", None), "e0002": (None, "v1"), "e0003": (None, None)}
    assert harness.failed() == []


def test_redshift(make_harness: Any, pg_datasource: dict[str, Any], pg_schema: str) -> None:
    """Redshift's SQL on the machine's PostgreSQL (as tests/destinations run it: no emulator)."""
    harness = make_harness({**postgres_stream(pg_datasource, TEMPLATE), "type": "redshift"})

    def read(table: str) -> dict[str, Any]:
        with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
            rows = conn.execute(f'SELECT {KEY}, user_id FROM "{pg_schema}"."{table}"').fetchall()
        return dict(rows)

    run(harness, read)


def test_snowflake(make_harness: Any, fakesnow_server: int, snowflake_db: str) -> None:
    """On fakesnow's server (tests/emulators/snowflake.py), through the real Snowflake driver."""
    block = {
        **{"account": "fakesnow", "db": snowflake_db, "schema": "events", "username": "fake", "password": "snow"},
        **{"warehouse": "test_wh", "host": SF_HOST, "port": fakesnow_server, "protocol": "http"},
    }
    layout = {"table_name_template": TEMPLATE, "primary_key_fields": [KEY]}
    harness = make_harness({"type": "snowflake", "mode": "stream", "snowflake": block, "data_layout": layout})

    def read(table: str) -> dict[str, Any]:
        sql = f'SELECT "{KEY.upper()}", "USER_ID" FROM "EVENTS"."{table.upper()}"'
        return dict(sf_rows(fakesnow_server, sql, None, snowflake_db))

    run(harness, read)


def test_bigquery(make_harness: Any, bigquery_emulator: BigQueryEmulator, bq_dataset: str) -> None:
    """On bqemulator (tests/emulators/bigquery.py), with a key: keyed stream rows are written by
    MERGE, not the streaming buffer (whose rows BigQuery cannot update for 30-90 minutes)."""
    layout = {"table_name_template": TEMPLATE, "primary_key_fields": [KEY]}
    block = bigquery_emulator.google_block(bq_dataset)
    harness = make_harness({"type": "bigquery", "mode": "stream", "google": block, "data_layout": layout})

    def read(table: str) -> dict[str, Any]:
        client = bigquery_emulator.bigquery()
        try:
            job = client.query(f"SELECT {KEY}, user_id FROM `{bq_dataset}`.`{table}`", job_retry=None)
            return {key: user for key, user in job.result(timeout=60)}
        finally:
            client.close()

    run(harness, read)
