"""Progress of long CLI work (`eventspark process`, `replay`): a rich bar on a terminal, plain log
lines every `PLAIN_INTERVAL` seconds otherwise (and one at the end).

Two sources of counts:
- `spark_tasks(description)`: the tasks done / total of the Spark jobs started inside the block,
  polled on a thread from the driver's status tracker (it never starts Spark itself);
- `counted(description, total)`: work the caller counts with `advance(n)` (events replayed into a
  stream queue, files...).

    with spark_tasks("batch pass"):
        result = run_pass(loaded, coordination)

    with counted("replay failed.dst=pg.log", total=len(lines)) as advance:
        for chunk in chunks:
            ...
            advance(len(chunk))
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

log = logging.getLogger(__name__)

PLAIN_INTERVAL = 5.0
"""Seconds between two plain progress lines."""
POLL_INTERVAL = 0.5
"""Seconds between two looks at Spark's status tracker."""


class Display:
    """Shows `done / total <unit>` for one piece of work (see the module doc)."""

    def __init__(self, description: str, unit: str, console: Console | None = None) -> None:
        self.description, self.unit = description, unit
        self.console = console or Console(stderr=True)
        self.done, self.total = 0, 0
        self._bar: Progress | None = None
        self._task: Any = None
        self._last_line = time.monotonic()
        self._logged: tuple[int, int] | None = None

    def start(self) -> None:
        if self.console.is_terminal:
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(self.unit),
                TimeElapsedColumn(),
                console=self.console,
            )
            self._task = self._bar.add_task(self.description, total=None)
            self._bar.start()

    def show(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total or None)
        elif total and time.monotonic() - self._last_line >= PLAIN_INTERVAL:
            self._line()

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self.total and self._logged != (self.done, self.total):
            self._line()

    def _line(self) -> None:
        self._last_line = time.monotonic()
        self._logged = (self.done, self.total)
        log.info("%s: %d/%d %s", self.description, self.done, self.total, self.unit)


@contextmanager
def counted(
    description: str, total: int, unit: str = "events", console: Console | None = None
) -> Iterator[Callable[[int], None]]:
    """A progress display that the caller advances by `n` with the function it yields."""
    display = Display(description, unit, console)
    display.start()
    display.show(0, total)

    def advance(n: int) -> None:
        display.show(display.done + n, max(total, display.done + n))

    try:
        yield advance
    finally:
        display.finish()


@contextmanager
def spark_tasks(description: str, console: Console | None = None) -> Iterator[Display]:
    """Tasks done / total of the Spark jobs that start while inside, shown until the block ends."""
    display = Display(description, "tasks", console)
    tracker = SparkTasks()
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(POLL_INTERVAL):
            counts = tracker.counts()
            if counts is not None:
                display.show(*counts)

    display.start()
    # In a copy of this context: its lines carry the job id of the work it shows.
    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(poll,), name="eventspark-progress", daemon=True)
    thread.start()
    try:
        yield display
    finally:
        stop.set()
        thread.join()
        counts = tracker.counts()  # jobs shorter than a poll interval are counted too
        if counts is not None:
            display.show(*counts)
        display.finish()


class SparkTasks:
    """Counts the tasks of the Spark jobs started after it was made, in this process's driver."""

    def __init__(self) -> None:
        try:
            self._before = self._job_ids() or set()
        except Exception:  # a JVM going away: count every job seen later
            self._before = set()

    @staticmethod
    def _context() -> Any:
        from pyspark import SparkContext

        return SparkContext._active_spark_context

    def _job_ids(self) -> set[int] | None:
        context = self._context()
        if context is None:
            return None
        tracker = context.statusTracker()
        return {*tracker.getJobIdsForGroup(None), *tracker.getActiveJobsIds()}

    def counts(self) -> tuple[int, int] | None:
        """(tasks done, tasks in all) so far; None before Spark runs or when it cannot answer."""
        try:
            jobs = self._job_ids()
            if jobs is None:
                return None
            tracker = self._context().statusTracker()
            done = total = 0
            for job_id in sorted(jobs - self._before):
                job = tracker.getJobInfo(job_id)
                for stage_id in job.stageIds if job is not None else ():
                    stage = tracker.getStageInfo(stage_id)
                    if stage is not None:
                        done, total = done + stage.numCompletedTasks, total + stage.numTasks
            return done, total
        except Exception:  # the JVM going away at the end of a pass: nothing to show
            return None
