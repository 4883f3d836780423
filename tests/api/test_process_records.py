"""`eventspark process` in its own process records its pass as the serve-side uploader does: each
destination's last load and error (`eventspark status`), the counters a node's `/prometheus` sums
(a snapshot file under log.path/metrics), and the events cache's sample (a store shared across
processes: SQLite with `server.workers > 1`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eventspark.ops.cache import build_store
from eventspark.ops.cache_results import SAMPLE_LINES
from eventspark.ops.metrics import METRICS_DIR, Snapshots
from eventspark.ops.state import read_state
from tests.batch.helpers import duckdb_destination, event, make_config, postgres_destination, put_log, run_cli


def test_process_records_state_counters_and_the_cache_sample(tmp_path: Path, pg_datasource: dict[str, Any]) -> None:
    loaded = make_config(
        tmp_path,
        {
            "dd": duckdb_destination(template="t"),
            "pg": postgres_destination({**pg_datasource, "port": 1}, template="t"),  # nothing listens: fails
        },
        server={"workers": 2},
    )
    log_path = Path(loaded.config.log.path)
    put_log(tmp_path, [event(str(n)) for n in range(8)])

    done = run_cli(tmp_path, "process")

    assert done.returncode == 1, done.stderr  # the pg pair failed
    good, bad = read_state(log_path, "dd"), read_state(log_path, "pg")
    assert good.last_load_at is not None and good.last_load_events == 8 and not good.last_error
    assert bad.last_load_at is None and "connecting" in bad.last_error

    counters = Snapshots(log_path / METRICS_DIR).merged().counters
    assert counters["batch_rows_loaded"][("dd", "t")] == 8
    assert counters["batch_load_errors"][("pg", "")] == 1  # failed before it knew a table
    assert counters["batch_passes"] == {("failed",): 1}

    store, local = build_store(loaded.config)
    try:
        assert not local
        total, entries = store.query(["dd"], None, None, set(), 100)
    finally:
        store.close()
    # A sample (the first lines of each split), not a copy of every event.
    assert total == len(entries) == SAMPLE_LINES
    assert {e.status for e in entries} == {"success"}
    assert all(e.success and e.success["table"] == "t" for e in entries)
