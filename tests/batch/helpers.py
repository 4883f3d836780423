"""Building configs and rotated logs for the batch tests, and reading what got loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import orjson
import psycopg
import yaml

from eventspark.batch.job import JobResult
from eventspark.config import LoadedConfig, load_config
from eventspark.logs.incoming import rotated_log_name
from tests.conftest import pg_conninfo
from tests.shared_data import eventnative_data

FIXTURE_LOG = eventnative_data() / "fact_input_with_error_lines_1.0.log"
MONTHLY = '{{.event_type}}_{{._timestamp.Format "2006_01"}}'
SKIPPING = '{{if eq .event_type "skipped"}}{{else}}' + MONTHLY + "{{end}}"
# The same master and conf as the shared `spark` fixture, so get_session reuses that session.
SPARK = {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}}
TOKENS = [
    {"id": "web", "client_secret": "web-js", "server_secret": "web-s2s"},
    {"id": "app", "client_secret": "app-js", "server_secret": "app-s2s"},
]


def make_config(root: Path, destinations: dict[str, Any], **extra: Any) -> LoadedConfig:
    """Writes a YAML config under `root` (events in `root/events`) and loads it like the CLI does."""
    raw = {"api_keys": TOKENS, "log": {"path": str(root / "events")}, "destinations": destinations, "spark": SPARK}
    # Tests run passes back to back: a failed pair is retried by the next pass, not after the
    # retry policy's minute (tests/batch/test_retry.py sets policies of its own).
    raw["retry"] = {"base_sec": 0.001}
    raw.update(extra)
    path = root / "eventspark.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def duckdb_destination(template: str = MONTHLY, **layout: Any) -> dict[str, Any]:
    return {
        "type": "duckdb",
        "duckdb": {"path": "warehouse.duckdb"},
        "data_layout": {"table_name_template": template, **layout},
    }


def postgres_destination(datasource: dict[str, Any], template: str = MONTHLY, **layout: Any) -> dict[str, Any]:
    return {"type": "postgres", "datasource": datasource, "data_layout": {"table_name_template": template, **layout}}


_clock = [datetime(2020, 8, 2, 18, 0, tzinfo=UTC)]


class MarkersAt:
    """A pass's `fault` hook that calls `read` (the load markers, as a test reads them) when the pass
    reaches `step`: once the pass archives its logs, their markers are removed (nothing reads them
    again). `steps` lists every step the pass reached."""

    def __init__(self, read: Callable[[], Any], step: str = "committed") -> None:
        self.read = read
        self.step = step
        self.steps: list[str] = []
        self.seen: Any = None

    def __call__(self, at: str) -> None:
        self.steps.append(at)
        if at == self.step:
            self.seen = self.read()


def pair_counts(result: JobResult, dest_id: str = "pg", table: str = "t") -> tuple[int, int]:
    """(rows, failed) of one (destination, table) pair of a pass."""
    pair = result.pairs[dest_id, table]
    return pair.rows, pair.failed


def put_log(root: Path, lines: list[dict[str, Any]] | list[str] | Path, token: str = "web") -> Path:
    """Writes a rotated incoming log; every call gets a later rotation time than the previous one."""
    _clock[0] += timedelta(seconds=1)
    incoming = root / "events" / "incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    path = incoming / rotated_log_name(token, _clock[0])
    if isinstance(lines, Path):
        path.write_bytes(lines.read_bytes())
    else:
        text = [line if isinstance(line, str) else orjson.dumps(line).decode() for line in lines]
        path.write_text("".join(t + "\n" for t in text))
    return path


def duck_rows(root: Path, sql: str, schema: str = "main") -> list[tuple[Any, ...]]:
    with duckdb.connect(str(root / "events" / "warehouse.duckdb"), read_only=True) as conn:
        conn.execute(f"SET schema = '{schema}'")
        return conn.execute(sql).fetchall()


def pg_rows(schema: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_conninfo()) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        return conn.execute(sql).fetchall()


def failed_lines(root: Path, dest_id: str) -> list[dict[str, Any]]:
    path = root / "events" / "failed" / f"failed.dst={dest_id}.log"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def event(event_id: str, **fields: Any) -> dict[str, Any]:
    return {"eventn_ctx": {"event_id": event_id}, "_timestamp": "2020-08-02T18:23:56.291383Z", **fields}


def run_cli(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`eventspark <args> -c <root>/eventspark.yaml` in its own process, as a user runs it (its own
    Spark: the test session's Spark settings are left out of its environment)."""
    spark_env = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP")
    env = {k: v for k, v in os.environ.items() if k not in spark_env}
    command = [str(Path(sys.executable).with_name("eventspark")), *args, "-c", str(root / "eventspark.yaml")]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=root, check=False)
