"""One batch pass over the rotated logs, for `eventspark process` and the serve-side uploader.

A node runs one pass at a time: a thread lock inside the process and an `flock` on
`incoming/.batch.lock` across processes (so `eventspark process` and `serve` do not load the same
logs twice at once).
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable

from eventspark.batch.job import BatchJob, JobResult
from eventspark.batch.load import Fault
from eventspark.batch.plan import DEFAULT_CHUNK_ROWS
from eventspark.batch.session import get_session, stop_session
from eventspark.config import LoadedConfig
from eventspark.coordination import Coordination, build_coordination
from eventspark.logconfig import in_job
from eventspark.logs.incoming import rotate_incoming_logs
from eventspark.logs.rotated import rotated_logs
from eventspark.progress import spark_tasks

log = logging.getLogger(__name__)

BATCH_LOCK_FILE = ".batch.lock"
_pass_lock = threading.Lock()


class PassBusy(RuntimeError):
    """Another process of this node is running a batch pass over the same directory."""


@contextmanager
def batch_lock(incoming_dir: Path) -> Iterator[None]:
    """Holds this node's batch lock; PassBusy when another process holds it."""
    incoming_dir.mkdir(parents=True, exist_ok=True)
    with _pass_lock:
        fd = os.open(incoming_dir / BATCH_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise PassBusy(f"another process runs a batch pass over {incoming_dir}") from None
            yield
        finally:
            os.close(fd)


def run_pass(
    loaded: LoadedConfig,
    coordination: Coordination,
    fault: Fault | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    session: Any = None,
) -> JobResult:
    """Loads every rotated log waiting in `incoming/` (no rotation here); one Spark job.

    `session` defaults to the process's warm session for `config.spark`.
    """
    incoming = Path(loaded.config.log.path) / "incoming"
    with batch_lock(incoming):
        logs = rotated_logs(incoming)
        if not logs:
            return JobResult()
        session = session or get_session(loaded.config.spark)
        return BatchJob(loaded, coordination, fault, chunk_rows).run(session, logs)


@in_job("pass")  # its log lines carry a job_id
def process_once(loaded: LoadedConfig, console: Console, keep_session: bool = False) -> bool:
    """Rotates the incoming logs now, runs one pass, prints a summary; False if any pair failed.

    The SparkSession is stopped at the end unless `keep_session`: a cluster whose application
    is still registered when the JVM exits keeps relaunching executors for a while.
    """
    config = loaded.config
    rotate_incoming_logs(Path(config.log.path) / "incoming")
    coordination = build_coordination(config.coordination, config.server.name)
    try:
        with spark_tasks("batch pass"):  # a bar on a terminal, log lines otherwise
            result = run_pass(loaded, coordination)
    except PassBusy as exc:
        console.print(f"[red]{exc}[/]")
        return False
    except Exception as exc:  # a failed Spark job: the logs stay for the next pass
        log.exception("the batch pass failed")
        console.print(f"[red]the batch pass failed, logs kept for the next one: {_first_line(exc)}[/]")
        return False
    finally:
        coordination.close()
        if not keep_session:
            stop_session()
    print_summary(result, console)
    return result.ok


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def print_summary(result: JobResult, console: Console) -> None:
    if not result.pairs:
        console.print("nothing to load", highlight=False)
    else:
        table = RichTable("destination", "table", "rows", "failed", "skipped", "status")
        for (dest_id, name), pair in sorted(result.pairs.items()):
            status = f"[red]FAILED: {pair.error}[/]" if pair.error else "[green]OK[/]"
            table.add_row(dest_id, name or "-", str(pair.rows), str(pair.failed), str(pair.skipped), status)
        console.print(table)
    console.print(
        f"{len(result.archived)} log(s) archived, {len(result.kept)} kept for retry, "
        f"{len(result.deleted_empty)} empty deleted",
        highlight=False,
    )
