"""The serve-side uploader: every `log.uploader_period_sec`, one batch pass over the rotated logs.

The collector rotates its own logs; the uploader only loads what is rotated. Passes run on one
background thread, one at a time, with the SparkSession kept warm between them.
"""

from __future__ import annotations

import logging
import threading

from eventspark.batch.job import JobResult
from eventspark.batch.process import PassBusy, run_pass
from eventspark.batch.session import stop_session
from eventspark.config import LoadedConfig
from eventspark.coordination import Coordination, build_coordination

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

    def run_once(self) -> JobResult | None:
        """One pass; None when another process of this node is running one."""
        try:
            result = run_pass(self.loaded, self.coordination)
        except PassBusy as exc:
            log.info("%s; skipping this round", exc)
            return None
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
        while not self._stop.wait(self.period):
            try:
                self.run_once()
            except Exception:  # a pass must never kill the uploader: log it, try again next period
                log.exception("batch pass failed")
