"""`process_once` (the CLI's `process`) and the serve-side Uploader, on the shared session."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from eventspark.batch.process import process_once
from eventspark.batch.uploader import Uploader
from eventspark.logs.incoming import live_log_name
from tests.batch.helpers import duck_rows, duckdb_destination, event, make_config, postgres_destination, put_log

pytestmark = pytest.mark.spark


def test_process_rotates_loads_and_prints_a_summary(spark: Any, tmp_path: Path) -> None:
    loaded = make_config(tmp_path, {"dd": duckdb_destination(template="{{.event_type}}")})
    incoming = tmp_path / "events" / "incoming"
    incoming.mkdir(parents=True)
    lines = [event("1", event_type="click"), event("2", event_type="click"), event("3", event_type="")]
    (incoming / live_log_name("web")).write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in lines))
    console = Console(record=True, width=200)

    assert process_once(loaded, console, keep_session=True)

    text = console.export_text()
    assert "│ dd          │ click │ 2    │ 0      │ 0       │ OK" in text
    assert "│ dd          │ -     │ 0    │ 0      │ 1       │ OK" in text
    assert "1 log(s) archived" in text
    assert duck_rows(tmp_path, "SELECT count(*) FROM click") == [(2,)]
    assert not any(incoming.glob("*.log"))


def test_process_reports_a_failed_pair(spark: Any, tmp_path: Path, pg_datasource: dict[str, Any]) -> None:
    loaded = make_config(tmp_path, {"pg": postgres_destination({**pg_datasource, "port": 1}, template="t")})
    put_log(tmp_path, [event("1")])
    console = Console(record=True, width=300)

    assert not process_once(loaded, console, keep_session=True)
    text = console.export_text()
    assert "FAILED: postgres: connecting" in text and "1 kept for retry" in text


def test_uploader_loads_rotated_logs_every_period(spark: Any, tmp_path: Path) -> None:
    loaded = make_config(tmp_path, {"dd": duckdb_destination(template="t")}, log={"uploader_period_sec": 0.2})
    loaded.config.log.path = str(tmp_path / "events")
    uploader = Uploader(loaded)
    uploader.start()
    try:
        log = put_log(tmp_path, [event(str(i)) for i in range(10)])
        deadline = time.monotonic() + 60
        while log.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        uploader.stop(stop_spark=False)  # the session is shared by the whole test run
    assert not log.exists()
    assert duck_rows(tmp_path, "SELECT count(*) FROM t") == [(10,)]
    assert uploader.run_once() is not None  # nothing left: an empty pass
