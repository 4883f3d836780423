"""Users recognition in the batch job (Spark): a pass killed between its commits and recognition
loses no ids (they wait under `log.path/state/recognition/`), and DuckDB takes it in batch mode;
Redshift (its SQL on PostgreSQL), Snowflake (fakesnow) and BigQuery (bqemulator) over two passes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eventspark.batch.process import run_pass
from eventspark.coordination import MemoryCoordination
from tests.batch.helpers import (
    duck_rows,
    duckdb_destination,
    failed_lines,
    make_config,
    pg_rows,
    postgres_destination,
    put_log,
)
from tests.emulators.bigquery import BigQueryEmulator
from tests.emulators.snowflake import SF_HOST, sf_rows
from tests.recognition.helpers import ANONYMOUS, EXPECTED, IDENTIFY, KEY, RECOGNITION

LAYOUT = {"table_name_template": "{{.event_type}}"}


def read(root: Path) -> dict[str, dict[str, Any]]:
    return {table: dict(duck_rows(root, f"SELECT {KEY}, user_id FROM {table}")) for table in EXPECTED}


def test_a_crash_between_the_commits_and_recognition_loses_no_ids(spark: Any, tmp_path: Path) -> None:
    loaded = make_config(tmp_path, {"dd": duckdb_destination("{{.event_type}}")}, **RECOGNITION)
    put_log(tmp_path, ANONYMOUS)
    run_pass(loaded, MemoryCoordination("test"), session=spark)
    put_log(tmp_path, IDENTIFY)

    def crash(at: str) -> None:
        if at == "pair committed":
            raise SystemExit(f"crash at {at}")

    with pytest.raises(SystemExit):
        run_pass(loaded, MemoryCoordination("test"), fault=crash, session=spark)
    kept = tmp_path / "events" / "state" / "recognition" / "dst=dd.json"
    assert kept.exists()
    # The rerun skips the committed pair (its load marker): the ids come from the kept file.
    run_pass(loaded, MemoryCoordination("test"), session=spark)
    assert read(tmp_path) == EXPECTED
    assert not kept.exists()


def two_passes(spark: Any, root: Path, dest: dict[str, Any]) -> None:
    """Anonymous events in one pass, the identification in the next (the batch job as `serve` runs it)."""
    loaded = make_config(root, {"wh": dest}, **RECOGNITION)
    put_log(root, ANONYMOUS)
    run_pass(loaded, MemoryCoordination("test"), session=spark)
    put_log(root, IDENTIFY)
    run_pass(loaded, MemoryCoordination("test"), session=spark)
    assert failed_lines(root, "wh") == []


def test_redshift_batch(spark: Any, tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str) -> None:
    """Redshift's SQL on PostgreSQL (staging tables filled by INSERTs, no `s3`)."""
    dest = {**postgres_destination(pg_datasource, "{{.event_type}}"), "type": "redshift"}
    two_passes(spark, tmp_path, dest)
    assert {t: dict(pg_rows(pg_schema, f"SELECT {KEY}, user_id FROM {t}")) for t in EXPECTED} == EXPECTED


def test_snowflake_batch(spark: Any, tmp_path: Path, fakesnow_server: int, snowflake_db: str) -> None:
    block = {
        **{"account": "fakesnow", "db": snowflake_db, "schema": "events", "username": "fake", "password": "snow"},
        **{"warehouse": "test_wh", "host": SF_HOST, "port": fakesnow_server, "protocol": "http"},
    }
    two_passes(spark, tmp_path, {"type": "snowflake", "snowflake": block, "data_layout": LAYOUT})

    def read(table: str) -> dict[str, Any]:
        sql = f'SELECT "{KEY.upper()}", "USER_ID" FROM "EVENTS"."{table.upper()}"'
        return dict(sf_rows(fakesnow_server, sql, None, snowflake_db))

    assert {t: read(t) for t in EXPECTED} == EXPECTED


def test_bigquery_batch(spark: Any, tmp_path: Path, bigquery_emulator: BigQueryEmulator, bq_dataset: str) -> None:
    block = bigquery_emulator.google_block(bq_dataset)
    two_passes(spark, tmp_path, {"type": "bigquery", "google": block, "data_layout": LAYOUT})

    def read(table: str) -> dict[str, Any]:
        client = bigquery_emulator.bigquery()
        try:
            job = client.query(f"SELECT {KEY}, user_id FROM `{bq_dataset}`.`{table}`", job_retry=None)
            return dict(job.result(timeout=60))
        finally:
            client.close()

    assert {t: read(t) for t in EXPECTED} == EXPECTED
