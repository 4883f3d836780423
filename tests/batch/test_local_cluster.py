"""`eventspark process` in a fresh process on `local-cluster[2,1,1024]`: separate executor JVMs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.batch.helpers import (
    FIXTURE_LOG,
    duck_rows,
    duckdb_destination,
    make_config,
    pg_rows,
    postgres_destination,
    put_log,
    run_cli,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_process_command_on_local_cluster(tmp_path: Path, pg_datasource: dict[str, Any]) -> None:
    make_config(
        tmp_path,
        {"dd": duckdb_destination(), "pg": postgres_destination(pg_datasource)},
        spark={"master": "local-cluster[2,1,1024]", "conf": {"spark.sql.files.maxPartitionBytes": "600"}},
    )
    put_log(tmp_path, FIXTURE_LOG)  # ~1 kB: split into two tasks, one per executor
    put_log(tmp_path, FIXTURE_LOG, token="app")
    done = run_cli(tmp_path, "process", timeout=240)

    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "user_2020_08" in done.stdout and "2 log(s) archived" in done.stdout
    assert duck_rows(tmp_path, 'SELECT count(*) FROM "user_2020_08"') == [(6,)]
    assert pg_rows(pg_datasource["schema"], 'SELECT count(*) FROM "user_2020_08"') == [(6,)]
