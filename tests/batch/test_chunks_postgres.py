"""Staged chunks into the machine's Postgres: what its text cannot hold fails one event, not the chunk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from eventspark.batch.chunks import chunk_buffer, text_holds_nul
from eventspark.batch.process import run_pass
from eventspark.coordination import MemoryCoordination
from eventspark.destinations.postgres.client import PostgresStageTarget
from eventspark.destinations.postgres.configuration import PostgresDestination
from eventspark.destinations.postgres.load import PostgresWarehouse
from tests.batch import test_direct
from tests.batch.helpers import event, failed_lines, make_config, pair_counts, pg_rows, postgres_destination, put_log
from tests.batch.test_direct import _counts, _done, _run
from tests.conftest import pg_conninfo

NUL_ERROR = "text cannot hold the character U+0000 (NUL)"
dest, warehouse = test_direct.dest, test_direct.warehouse  # its fixtures: tables "a" and "b" in `pg_schema`


def test_a_chunk_with_a_nul_event_left_out_is_staged(pg_schema: str) -> None:
    target = PostgresStageTarget(pg_conninfo(), pg_schema, "job1")
    buffer = chunk_buffer("t", None, (), target.json_lines, None, text_holds_nul(target))
    assert buffer.add({"a": "ok"}, {}) is None
    assert buffer.add({"a": "x\x00y"}, {}) == f"column 'a': {NUL_ERROR}"
    assert buffer.add({"a": "ok too"}, {}) is None
    columns, rows, _ = buffer.take()
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{pg_schema}"')  # the stage's schema
    writer = target.open()
    try:
        chunk = writer.write(columns, rows)
    finally:
        writer.close()
    assert pg_rows(pg_schema, f'SELECT a FROM "{chunk.ref}" ORDER BY a') == [("ok",), ("ok too",)]


@pytest.mark.spark
def test_staged_passes_fail_events_holding_nul_and_load_the_others(
    spark: Any, tmp_path: Path, pg_datasource: dict[str, Any], pg_schema: str
) -> None:
    loaded = make_config(tmp_path, {"pg": postgres_destination(pg_datasource, template="t")})
    coordination = MemoryCoordination("test")
    # No table yet: staged. Before, the COPY of the chunk failed, and the pair on every retry.
    put_log(tmp_path, [event("a0", note="ok"), event("a1", note="nul \x00 here"), event("a2", note="fine")])
    result = run_pass(loaded, coordination, session=spark)
    assert result.ok and pair_counts(result) == (2, 1)
    # The table exists; a new column stages the pass again.
    put_log(tmp_path, [event("b0", note="ok", extra="new"), event("b1", note="ok", extra="\x00")])
    result = run_pass(loaded, coordination, session=spark)
    assert result.ok and pair_counts(result) == (1, 1)

    assert pg_rows(pg_schema, "SELECT eventn_ctx_event_id, note, extra FROM t ORDER BY 1") == [
        ("a0", "ok", None),
        ("a2", "fine", None),
        ("b0", "ok", "new"),
    ]
    failed = {line["event_id"]: line["error"] for line in failed_lines(tmp_path, "pg")}
    assert failed == {"a1": f"column 'note': {NUL_ERROR}", "b1": f"column 'extra': {NUL_ERROR}"}


def test_a_done_split_checked_as_staging_fails_its_nul_event_again(
    tmp_path: Path, warehouse: PostgresWarehouse, dest: PostgresDestination
) -> None:
    """A split written directly failed its event holding U+0000 (`DirectBuffer`); when its table
    cannot be written directly any more, the rerun checks it as staging does: it fails again."""
    # Its stage (`RecordingStage`) does not say whether text holds U+0000.
    plan, splits = _done(tmp_path, warehouse, dest, [{"event_type": "a", "n": 1}, {"event_type": "a", "code": "\x00"}])
    plan.sql_types["pg"]["a"]["x"] = "jsonb"  # not checked here: the table is not written directly
    result = _run(plan, splits)
    assert _counts(result) == {"a": (0, 1)}
    (spool,) = [c.spool for c in result.counts if c.spool]
    assert orjson.loads(Path(spool).read_bytes())["error"] == f"column 'code': {NUL_ERROR}"
