"""Users recognition in the batch job (Spark): a pass killed between its commits and recognition
loses no ids (they wait under `log.path/state/recognition/`), and DuckDB takes it in batch mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eventspark.batch.process import run_pass
from eventspark.coordination import MemoryCoordination
from tests.batch.helpers import duck_rows, duckdb_destination, make_config, put_log
from tests.recognition.helpers import ANONYMOUS, EXPECTED, IDENTIFY, KEY, RECOGNITION


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
