"""One batch pass over the rotated logs, for `eventspark process` and the serve-side uploader.

A node runs one pass at a time: a thread lock inside the process and an `flock` on
`incoming/.batch.lock` across processes (so `eventspark process` and `serve` do not load the same
logs twice at once). With `log.remote`, the nodes sharing it run one pass at a time between
them: the coordination lock named after the URL, taken without waiting (`remote_pass_lock`).
The pass checks that lock before each step that changes shared state (`pass_fence`): a holder
whose lease lapsed mid-pass stops there, and the next pass takes over.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable

from eventspark.batch.job import BatchJob, JobResult
from eventspark.batch.load import Fault
from eventspark.batch.plan import DEFAULT_CHUNK_ROWS
from eventspark.batch.session import get_session, release_after_pass, stop_session
from eventspark.config import LoadedConfig
from eventspark.config.models import Config, RemoteLogs
from eventspark.coordination import Coordination, LockHandle, LockLost, LockTimeout, build_coordination
from eventspark.destinations.sql import debug_log
from eventspark.logconfig import in_job
from eventspark.logs.incoming import rotate_incoming_logs
from eventspark.logs.store import log_store, remote_lock_name
from eventspark.ops.cache import events_cache_for
from eventspark.ops.cache_results import record_samples
from eventspark.ops.metrics import Snapshots, pipeline_metrics, process_snapshots, record_pass, record_pass_error
from eventspark.progress import spark_tasks

log = logging.getLogger(__name__)

BATCH_LOCK_FILE = ".batch.lock"
_pass_lock = threading.Lock()


class PassBusy(RuntimeError):
    """Another process of this node is running a batch pass over the same directory, or another
    node one over the same `log.remote`."""


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


@contextmanager
def remote_pass_lock(coordination: Coordination, remote: RemoteLogs) -> Iterator[Callable[[str], None]]:
    """Holds the cluster's pass lock of `remote`; PassBusy at once when another node holds it (its
    pass loads every node's logs: this node's wait for the next round). Yields the pass's fence
    (`pass_fence`)."""
    name = remote_lock_name(remote)
    try:
        with coordination.lock(name, timeout=0) as handle:
            yield pass_fence(handle)
    except LockTimeout as exc:
        if exc.name != name:  # a table's lock, inside the pass
            raise
        holder = exc.holder or "holder unknown"
        raise PassBusy(f"another node runs the batch pass over {remote.shown_url} ({holder})") from None


def pass_fence(handle: LockHandle) -> Callable[[str], None]:
    """`BatchJob`'s fence: called before each step that changes shared state (a commit, the status
    files and failed events, the archive), it raises `LockLost` once the cluster's pass lock is no
    longer this pass's, since another node may be running a pass over the same logs by then. What
    is not done yet stays for the next pass (commits carry load markers: nothing loads twice)."""

    def fence(step: str) -> None:
        if handle.lost:
            message = f"the cluster's pass lock was lost mid-pass: stopped before {step}; the next pass takes over"
            raise LockLost(handle.name, step, message)

    return fence


def upload_local_logs(config: Config) -> None:
    """With `log.remote`: this node's rotated logs go up first (`logs.upload`), so that the pass,
    here or on another node, loads them. A failed upload keeps them here for the next round."""
    if config.log.remote is None:
        return
    from eventspark.logs.upload import upload_rotated

    uploaded = upload_rotated(config)
    if uploaded:
        log.info("%d rotated log(s) uploaded to %s", len(uploaded), config.log.remote.shown_url)


def run_pass(
    loaded: LoadedConfig,
    coordination: Coordination,
    fault: Fault | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    session: Any = None,
) -> JobResult:
    """Loads every rotated log waiting in `incoming/` (no rotation here); one Spark job.

    `session` defaults to the process's warm session for `config.spark`. With `log.remote`, the
    pass reads every node's logs from there, under the cluster's pass lock (the callers upload
    this node's first: `upload_local_logs`).
    """
    config = loaded.config
    incoming = Path(config.log.path) / "incoming"
    remote = config.log.remote
    cluster_lock = nullcontext() if remote is None else remote_pass_lock(coordination, remote)
    with batch_lock(incoming), cluster_lock as fence:
        store = log_store(config)
        logs = store.rotated()
        job = BatchJob(loaded, coordination, fault, chunk_rows, store=store, fence=fence)
        if not logs:
            job.recover_failed()  # a pass cut short is repaired without waiting for new logs
            store.publish_failed(Path(config.log.path) / "failed")
            return JobResult()
        if session is not None:
            return job.run(session, logs)
        try:
            return job.run(get_session(config.spark), logs)
        finally:  # `spark.keep_session`: on a cluster, an idle session must not hold its cores
            release_after_pass(config.spark)


@in_job("pass")  # its log lines carry a job_id
def process_once(loaded: LoadedConfig, console: Console, keep_session: bool = False) -> bool:
    """Rotates the incoming logs now, runs one pass, prints a summary; False if any pair failed.

    The SparkSession is stopped at the end unless `keep_session`: a cluster whose application
    is still registered when the JVM exits keeps relaunching executors for a while.
    """
    config = loaded.config
    debug_log.configure(config.sql_debug_log)  # the driver's statements (executors only stage)
    rotate_incoming_logs(Path(config.log.path) / "incoming")
    coordination = build_coordination(config.coordination, config.server.name)
    try:
        upload_local_logs(config)
        with spark_tasks("batch pass"):  # a bar on a terminal, log lines otherwise
            result = run_recorded(loaded, coordination)
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


def run_recorded(loaded: LoadedConfig, coordination: Coordination) -> JobResult:
    """`run_pass`, recorded as the serve-side uploader records its passes (`batch/uploader.py`
    `run_once`): each destination's last load and error (`eventspark status`), the pass's counters
    (`/prometheus`, through this process's snapshot file) and the events cache's sample."""
    config = loaded.config
    log_path, started = Path(config.log.path), time.monotonic()
    snapshots = _publish_counters(log_path)
    try:
        result = run_pass(loaded, coordination)
    except PassBusy:
        raise
    except Exception as exc:
        batch = [dest_id for dest_id, dest in config.destinations.items() if dest.mode == "batch"]
        record_pass_error(log_path, batch, time.monotonic() - started, f"{type(exc).__name__}: {exc}")
        snapshots.write()  # now: this process may exit right after the pass
        raise
    record_pass(log_path, result, time.monotonic() - started)
    snapshots.write()
    _record_samples(loaded, result)
    return result


def _publish_counters(log_path: Path) -> Snapshots:
    """This process's pipeline counters go to its snapshot under `log_path` (`ops.metrics`), which
    a serving node adds to `/prometheus` (and keeps in `retired.json` once this process ended).
    A node registers its own; a process whose snapshots are already written (a node, a collector
    in this process) is left as it is, so nothing is counted twice."""
    snapshots = process_snapshots(log_path)
    if not snapshots.running:
        pipeline = pipeline_metrics()
        snapshots.add_source(pipeline.sample, pipeline.states.flush)
    return snapshots


def _record_samples(loaded: LoadedConfig, result: JobResult) -> None:
    """The pass's sample into the events cache, when its store outlives this process (SQLite with
    `server.workers > 1`, Redis): a memory store here would be seen by nobody."""
    cache = events_cache_for(loaded.config)
    if cache is None or cache.local or not result.samples:
        return
    try:
        record_samples(cache, result.samples)
    finally:
        cache.close()  # writes them now and stops its thread
        cache.store.close()  # reopened on next use


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
    if result.waiting:
        console.print(
            f"{len(result.waiting)} log(s) not read: their failed pairs are not due for a retry yet "
            "(retry policy, docs/reliability.md)",
            highlight=False,
        )
    for name, why in sorted(result.held.items()):
        console.print(f"[yellow]{name} kept, not loaded: {why}[/]", highlight=False)
