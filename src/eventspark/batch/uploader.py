"""The serve-side uploader: every `log.uploader_period_sec`, one batch pass over the rotated logs.

The collector rotates its own logs; the uploader only loads what is rotated (with `log.remote`,
it uploads this node's rotated logs first; the pass runs on one node of the cluster at a time). Passes run on one
background thread, one at a time, with the SparkSession kept warm between them.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from eventspark.batch.job import JobResult
from eventspark.batch.process import PassBusy, run_pass, upload_local_logs
from eventspark.batch.session import stop_session
from eventspark.config import LoadedConfig
from eventspark.coordination import Coordination, build_coordination
from eventspark.logconfig import in_job
from eventspark.logs.retention import after_pass as retention_after_pass
from eventspark.ops.cache import events_cache_for
from eventspark.ops.cache_results import record_samples
from eventspark.ops.metrics import record_pass, record_pass_error
from eventspark.ops.passes import PassRequests

log = logging.getLogger(__name__)


class Uploader:
    """`start()` runs passes on a daemon thread until `stop()`; `run_once()` runs one pass now."""

    def __init__(self, loaded: LoadedConfig, coordination: Coordination | None = None) -> None:
        self.loaded = loaded
        self.period = loaded.config.log.uploader_period_sec
        self._own_coordination = coordination is None
        self.coordination = coordination or build_coordination(loaded.config.coordination, loaded.config.server.name)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="eventspark-uploader", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None, stop_spark: bool = True) -> None:
        """Asks the loop to end, waits for the pass in progress (if any) to finish, and stops the
        warm SparkSession (a cluster application left registered at exit relaunches executors)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._own_coordination:
            self.coordination.close()
        if stop_spark:
            stop_session()

    @in_job("pass")  # its log lines carry a job_id
    def run_once(self) -> JobResult | None:
        """One pass; None when another process of this node is running one."""
        log_path, started = Path(self.loaded.config.log.path), time.monotonic()
        try:
            upload_local_logs(self.loaded.config)  # with `log.remote`: whichever node runs the pass loads them
            result = run_pass(self.loaded, self.coordination)
        except PassBusy as exc:
            log.info("%s; skipping this round", exc)
            return None
        except Exception as exc:  # the metrics and `eventspark status` show it; the loop logs it
            batch = [d for d, dest in self.loaded.config.destinations.items() if dest.mode == "batch"]
            record_pass_error(log_path, batch, time.monotonic() - started, f"{type(exc).__name__}: {exc}")
            raise
        record_pass(log_path, result, time.monotonic() - started)
        retention_after_pass(log_path)  # on the retention thread: this pass does not wait for it
        record_samples(events_cache_for(self.loaded.config), result.samples)
        for (dest_id, table), pair in sorted(result.pairs.items()):
            level = logging.WARNING if pair.error else logging.INFO
            log.log(
                level,
                "batch %s/%s: %d rows, %d failed, %d skipped%s",
                dest_id,
                table or "-",
                pair.rows,
                pair.failed,
                pair.skipped,
                f", FAILED: {pair.error}" if pair.error else "",
            )
        return result

    def _loop(self) -> None:
        # A pass every period, or as soon as another process asks for one (`ops.passes`).
        requests = PassRequests(Path(self.loaded.config.log.path))
        busy = False
        try:
            requests.recover()  # taken by a pass that never answered (the node stopped during it)
        except OSError:
            log.exception("putting back unanswered pass requests failed")
        while requests.wait(self._stop, self.period, min_wait=1.0 if busy else 0.0):
            try:
                busy = self._pass_for(requests)
            except Exception:  # a pass, or a request file, must never kill the uploader
                log.exception("batch pass failed")
                busy = False

    def _pass_for(self, requests: PassRequests) -> bool:
        """One pass for the requests pending now (and the period); True when another process held
        the batch lock (the requests go back)."""
        taken, started = requests.take(), time.time()
        requests.wait_rotated(taken, self.loaded.config.server.workers)
        try:
            result = self.run_once()
        except Exception as exc:
            requests.answer(taken, None, f"the batch pass failed: {type(exc).__name__}: {exc}", started)
            raise
        if result is None:  # asked again a second later
            requests.release(taken)
            return True
        requests.answer(taken, result, started=started)
        return False
