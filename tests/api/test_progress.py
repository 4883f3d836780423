"""Progress displays (`eventspark.progress`): plain lines, a terminal bar, Spark's tasks, and
`eventspark process` with JSON logs (job ids and progress lines)."""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from eventspark import progress
from tests.batch.helpers import duckdb_destination, event, make_config, put_log, run_cli


def test_counted_logs_plain_lines_off_a_terminal(caplog: pytest.LogCaptureFixture, monkeypatch: Any) -> None:
    monkeypatch.setattr(progress, "PLAIN_INTERVAL", 0)
    quiet = Console(file=io.StringIO(), force_terminal=False)
    with (
        caplog.at_level(logging.INFO, "eventspark.progress"),
        progress.counted("replay f", 3, console=quiet) as advance,
    ):
        advance(2)
        advance(1)
    messages = [r.getMessage() for r in caplog.records if r.name == "eventspark.progress"]
    assert messages == ["replay f: 0/3 events", "replay f: 2/3 events", "replay f: 3/3 events"]


def test_counted_draws_a_bar_on_a_terminal(caplog: pytest.LogCaptureFixture) -> None:
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=100)
    with (
        caplog.at_level(logging.INFO, "eventspark.progress"),
        progress.counted("replay f", 3, console=terminal) as advance,
    ):
        advance(3)
    assert "3/3" in screen.getvalue() and "replay f" in screen.getvalue()
    assert not [r for r in caplog.records if r.name == "eventspark.progress"]


@pytest.mark.spark
def test_spark_tasks_counts_the_tasks_of_the_jobs_inside(spark: Any) -> None:
    spark.sparkContext.parallelize(range(10), 2).count()  # before: not counted
    quiet = Console(file=io.StringIO(), force_terminal=False)
    with progress.spark_tasks("pass", console=quiet) as display:
        spark.sparkContext.parallelize(range(100), 5).count()
        spark.sparkContext.parallelize(range(100), 3).count()
    assert (display.done, display.total) == (8, 8)


def test_process_logs_json_lines_with_a_job_id_and_progress(tmp_path: Path) -> None:
    make_config(
        tmp_path,
        {"dd": duckdb_destination(template="t")},
        server={"log": {"format": "json"}},
    )
    put_log(tmp_path, [event(str(n)) for n in range(50)])

    done = run_cli(tmp_path, "process")

    assert done.returncode == 0, done.stderr
    ours = [orjson.loads(line) for line in done.stderr.splitlines() if line.startswith('{"time"')]
    eventspark = [line for line in ours if line["logger"].startswith("eventspark.")]
    jobs = {line.get("job_id") for line in eventspark}
    assert len(jobs) == 1 and next(iter(jobs)).startswith("pass-"), eventspark
    final = [line["message"] for line in eventspark if line["logger"] == "eventspark.progress"][-1]
    done_tasks, total_tasks = final.removeprefix("batch pass: ").removesuffix(" tasks").split("/")
    assert done_tasks == total_tasks and int(total_tasks) > 0, final
    assert "1 log(s) archived" in done.stdout
