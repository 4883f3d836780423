"""kill -9 of a batch pass at each step, then a rerun: every event once in the warehouse (the
machine's Postgres, a fresh schema, and DuckDB), every failed event once in `failed/`.

The pass runs in a process of its own (tests/faults/batch_runner.py, its own Spark `local[1]`)
that is killed with SIGKILL, so no `finally` and no clean-up runs: (a) while a Spark task is in
progress, its rows staged; (b) between stage and commit (`fault("staged")`); (c) between a pair's
commit and the settling of its failed events (`fault("pair committed")`), right after the first of
Postgres's task commits (`fault("task committed")`: the other tasks' rows are not committed), and
between the commits and the status files (`fault("committed")`). The rerun is a pass in this process.

The logs hold events that load, events that fail the template, values that fail a column's cast,
and a table whose every event fails (no commit at all for it: only the status file knows it was
done, so a crash before that file must not write its failed lines twice).

An executor that writes Postgres splits directly (per-split markers) also kills itself around a
split's commit (`JobPlan.executor_fault`): the rerun writes every other split, once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eventspark.batch import splits
from eventspark.batch.process import run_pass
from eventspark.coordination import MemoryCoordination
from eventspark.logs.status import status_path
from tests.batch.helpers import MarkersAt, duck_rows, duckdb_destination, event, failed_lines, make_config, put_log
from tests.conftest import pg_conninfo

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = "{{.event_type}}{{if .broken}}{{.broken.deeper.Format}}{{end}}"
LAYOUT = {"mappings": {"keep_unmapped": True, "fields": [{"src": "/n", "action": "cast", "type": "bigint"}]}}
LOADED, MISFITS, TEMPLATE_FAILURES, ALL_FAILING = 40, 6, 4, 5
DESTINATIONS = ("dd", "pg")
RUNNER_TIMEOUT = 120


def log_events(part: int) -> list[dict[str, Any]]:
    """Half of the events (part 0 or 1): rows of table t, misfits of its bigint column n, template
    failures, and every event of table `only_failures` (all misfits)."""
    events = [event(f"ok-{i}", event_type="t", n=i) for i in range(part, LOADED, 2)]
    events += [event(f"misfit-{i}", event_type="t", n=f"seven-{i}") for i in range(part, MISFITS, 2)]
    events += [event(f"template-{i}", event_type="t", broken={"deeper": i}) for i in range(part, TEMPLATE_FAILURES, 2)]
    events += [event(f"only-{i}", event_type="only_failures", n=f"x{i}") for i in range(part, ALL_FAILING, 2)]
    return events


def expected_failures() -> Counter[str]:
    ids = [f"misfit-{i}" for i in range(MISFITS)] + [f"template-{i}" for i in range(TEMPLATE_FAILURES)]
    return Counter(ids + [f"only-{i}" for i in range(ALL_FAILING)])


def pg_ids(schema: str, table: str = "t") -> list[str]:
    """The event ids in a Postgres table; [] before it exists."""
    with psycopg.connect(pg_conninfo()) as conn:
        try:
            return [r[0] for r in conn.execute(f'SELECT eventn_ctx_event_id FROM "{schema}"."{table}"').fetchall()]
        except psycopg.errors.UndefinedTable:
            return []


def duck_ids(root: Path) -> list[str]:
    if not (root / "events" / "warehouse.duckdb").exists():
        return []
    found = duck_rows(root, "SELECT table_name FROM information_schema.tables WHERE table_name = 't'")
    return [r[0] for r in duck_rows(root, "SELECT eventn_ctx_event_id FROM t")] if found else []


def exactly_once(ids: list[str]) -> int:
    """How many ids occur exactly once."""
    return sum(1 for count in Counter(ids).values() if count == 1)


def start_runner(root: Path, step: str, split_bytes: int | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    """The pass's process, in a process group of its own (its Spark JVM and Python workers)."""
    signals = root / "signals"
    signals.mkdir()
    spark_env = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP")
    env = {k: v for k, v in os.environ.items() if k not in spark_env}
    env["PYTHONPATH"] = f"{REPO / 'src'}:{REPO}"
    if split_bytes is not None:
        env["SPLIT_BYTES"] = str(split_bytes)
    command = [sys.executable, "-m", "tests.faults.batch_runner", str(root / "eventspark.yaml"), step, str(signals)]
    output = (root / "runner.log").open("wb")
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
    )
    output.close()
    return process, signals


def wait_for(path: Path, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            pytest.fail(f"the batch runner ended ({process.returncode}) before {path.name}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {path.name} after {timeout} s")
        time.sleep(0.05)


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the runner's process group: whatever of it is still alive (JVM, workers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def kill_pass(root: Path, step: str, split_bytes: int | None = None) -> None:
    """Runs the pass in its own process until it is killed with SIGKILL at `step`."""
    process, signals = start_runner(root, step, split_bytes)
    try:
        if step == "executors":
            wait_for(signals / "task-staged", process, RUNNER_TIMEOUT)
            staged = [p for p in (root / "events" / "staging").rglob("*") if p.is_file()]
            assert staged, "a task reported its rows staged, yet no staging file exists"
            os.kill(process.pid, signal.SIGKILL)
        process.wait(RUNNER_TIMEOUT)
    finally:
        kill_group(process)
        process.wait()
    assert process.returncode == -signal.SIGKILL, (root / "runner.log").read_text()[-3000:]


@pytest.mark.parametrize("step", ["executors", "staged", "pair committed", "task committed", "committed"])
def test_a_pass_killed_at_each_step_then_rerun_leaves_every_event_once(
    spark: Any, tmp_path: Path, pg_datasource: dict[str, Any], figure: Any, step: str
) -> None:
    loaded = make_config(tmp_path, both_destinations(pg_datasource))
    logs = [put_log(tmp_path, log_events(part)) for part in (0, 1)]
    schema = pg_datasource["schema"]
    events = sum(len(log.read_bytes().splitlines()) for log in logs)

    # "task committed": Postgres's new table t is committed per task (`batch.commits`); small
    # splits make several tasks, and the pass dies right after the first one's commit.
    kill_pass(tmp_path, step, SMALL_SPLIT_BYTES if step == "task committed" else None)

    assert all(log.exists() and not status_path(log).exists() for log in logs)
    committed = {"pg": len(pg_ids(schema)), "dd": len(duck_ids(tmp_path))}
    if step in ("executors", "staged"):
        assert committed == {"pg": 0, "dd": 0}, "killed before any commit, yet rows are in the warehouse"
    elif step == "task committed":  # DuckDB's pair is committed by the driver first
        assert committed["dd"] == LOADED and 0 < committed["pg"] < LOADED, committed
    elif step == "committed":
        assert committed == {"pg": LOADED, "dd": LOADED}, "killed after the commits, yet rows are missing"
    else:  # the first pair in order, dd/t, was committed; its misfits wait, parked
        assert committed["dd"] == LOADED
        assert any((tmp_path / "events" / "failed" / "pending").iterdir())

    result = run_pass(loaded, MemoryCoordination("rerun"), session=spark)

    assert result.ok and not any(log.exists() for log in logs)
    once, failed_once = assert_every_event_once(tmp_path, schema)
    figure(
        f"killed at {step}: events {events} (each to Postgres and DuckDB), in the warehouse once {once}, "
        f"failed lines once {failed_once}"
    )


def both_destinations(pg_datasource: dict[str, Any]) -> dict[str, Any]:
    return {
        "dd": duckdb_destination(template=TEMPLATE, **LAYOUT),
        "pg": {
            "type": "postgres",
            "datasource": pg_datasource,
            "data_layout": {"table_name_template": TEMPLATE, **LAYOUT},
        },
    }


def assert_every_event_once(root: Path, schema: str, before: Counter[str] | None = None) -> tuple[int, int]:
    """Every loadable event once in both warehouses (besides the rows `before`), every failed
    event once in each destination's failed log, nothing left parked; (rows once, failed lines once)."""
    expected_rows = Counter(f"ok-{i}" for i in range(LOADED)) + (before or Counter())
    assert Counter(pg_ids(schema)) == expected_rows
    assert Counter(duck_ids(root)) == expected_rows
    assert pg_ids(schema, "only_failures") == []
    for dest_id in DESTINATIONS:
        written = Counter(line["event_id"] for line in failed_lines(root, dest_id))
        twice = sorted(event_id for event_id, count in written.items() if count > 1)
        assert twice == [], f"{dest_id}: failed lines written more than once: {twice}"
        assert written == expected_failures(), dest_id
    assert list((root / "events" / "failed" / "pending").glob("*")) == []
    once = min(exactly_once(pg_ids(schema)), exactly_once(duck_ids(root)))
    failed_once = min(exactly_once([line["event_id"] for line in failed_lines(root, d)]) for d in DESTINATIONS)
    return once, failed_once


SMALL_SPLIT_BYTES = 700
"""Splits of a few events: a log of the test is cut into several (`batch.splits.SPLIT_BYTES`)."""
WARM_UP = 3


def split_markers(schema: str) -> list[str]:
    """The per-split load markers of table t in Postgres (`<log>@<start>-<end>`)."""
    with psycopg.connect(pg_conninfo()) as conn:
        rows = conn.execute(
            f"SELECT file FROM \"{schema}\"._eventspark_loads WHERE table_name = 't' AND file LIKE '%@%'"
        ).fetchall()
    return [r[0] for r in rows]


@pytest.mark.parametrize(
    ("fault", "rerun_split_bytes"),
    [
        ("kill-before-commit:1", SMALL_SPLIT_BYTES),
        ("kill-after-commit:1", SMALL_SPLIT_BYTES),
        ("kill-after-commit:1", 1000),
    ],
)
def test_an_executor_killed_around_a_split_commit_then_rerun_leaves_every_event_once(
    spark: Any,
    tmp_path: Path,
    pg_datasource: dict[str, Any],
    figure: Any,
    monkeypatch: Any,
    fault: str,
    rerun_split_bytes: int,
) -> None:
    """The executor writing Postgres splits directly SIGKILLs itself (a) after writing the rows of
    its first split, before the commit, (b) right after that commit. Local Spark does not retry a
    lost task: the pass fails. The rerun skips the committed split (its marker), writes the
    others, and loads every event once (DuckDB beside it, staged, too). A rerun whose split size
    differs (an upgrade) keeps the committed split's boundaries."""
    monkeypatch.setattr(splits, "SPLIT_BYTES", SMALL_SPLIT_BYTES)
    loaded = make_config(tmp_path, both_destinations(pg_datasource))
    schema = pg_datasource["schema"]
    # A first pass creates table t with every column: the next one writes it directly.
    put_log(tmp_path, [event(f"warm-{i}", event_type="t", n=i) for i in range(WARM_UP)])
    assert run_pass(loaded, MemoryCoordination("warm-up"), session=spark).ok
    warm = Counter(f"warm-{i}" for i in range(WARM_UP))
    warm_markers = split_markers(schema)  # its staged rows were committed per task, with a split marker
    logs = [put_log(tmp_path, log_events(part)) for part in (0, 1)]
    events = sum(len(log.read_bytes().splitlines()) for log in logs)
    assert all(log.stat().st_size > 3 * SMALL_SPLIT_BYTES for log in logs)

    process, _signals = start_runner(tmp_path, f"executor:{fault}", SMALL_SPLIT_BYTES)
    try:
        process.wait(RUNNER_TIMEOUT)
    finally:
        kill_group(process)
        process.wait()
    output = (tmp_path / "runner.log").read_text()
    assert process.returncode == 1, output[-3000:]  # the pass failed: its Spark job lost a task

    assert all(log.exists() and not status_path(log).exists() for log in logs)
    written = Counter(pg_ids(schema)) - warm
    markers = [marker for marker in split_markers(schema) if marker not in warm_markers]
    if fault.startswith("kill-before-commit"):
        assert (written, markers) == (Counter(), []), "killed before its commit, yet a split is in Postgres"
    else:
        # Usually one split: Spark may start the next task on a fresh Python worker before it
        # aborts the job, and that worker's first commit kills it too (seen once under load).
        assert markers and 0 < sum(written.values()) < LOADED, (markers, written)
        assert max(written.values()) == 1
    assert Counter(duck_ids(tmp_path)) == warm, "DuckDB is staged: nothing of the failed pass is committed"

    monkeypatch.setattr(splits, "SPLIT_BYTES", rerun_split_bytes)
    rerun = MarkersAt(lambda: split_markers(schema))  # read before the archive removes them
    result = run_pass(loaded, MemoryCoordination("rerun"), session=spark, fault=rerun)

    assert result.ok and not any(log.exists() for log in logs)
    once, failed_once = assert_every_event_once(tmp_path, schema, warm)
    assert set(markers) <= set(rerun.seen)
    assert len(rerun.seen) >= len(markers) + 2, "the rerun wrote its splits directly"
    assert split_markers(schema) == []  # the logs archived: their markers removed
    figure(
        f"executor {fault}, rerun cutting {rerun_split_bytes} B: events {events} in "
        f"{len(rerun.seen)} direct splits, "
        f"{sum(written.values())} rows committed before the kill; in the warehouse once {once}, "
        f"failed lines once {failed_once}"
    )
