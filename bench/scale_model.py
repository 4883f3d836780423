"""The cost model of a batch pass (`bench/scale.py` measures its inputs; docs/scaling.md explains it).

A pass = the driver's part, run once per pass whatever the executors (listing, plan, load, settle:
each fitted as fixed + per event + per log), plus the Spark stage: a fixed job cost, a cost per
wave of tasks, and the events spread over the executors that have a split to read, each
executor's COPY taking a share of the destination's cores; then the archive. On a cluster master
the executors gzip the logs (`LocalStore.archive`, `RemoteStore.archive`: a second Spark job, at
most a task per core) from 256 MiB a pass; on a `local...` master, or below that size, the driver
does (its fitted `archive` phase). Pure
arithmetic, no Spark, no I/O, so that tests/bench/test_scale_model.py can check it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

EXECUTOR_ARCHIVE_BYTES = 256 * 1024 * 1024
"""As `eventspark.logs.store.EXECUTOR_ARCHIVE_BYTES` (not imported: this module is plain arithmetic)."""
DRIVER_PHASES = ("list", "plan", "load", "settle", "archive")
"""`JobResult.timings` phases run once per pass on the driver (`list`: the pass's wall time less
its phases: listing incoming/, the node's lock, recovering failed/)."""
TASKS_PER_CORE = 4
"""As `batch.job.TASKS_PER_CORE`: a job has at most this many tasks per executor core."""
SPLIT_BYTES = 16 * 1024 * 1024
"""As `batch.splits.SPLIT_BYTES`: a log is cut into ceil(size / 16 MiB) splits, one task reads each."""
DAY_SECONDS = 86_400
DELETES_PER_REQUEST = 1_000
"""S3's DeleteObjects limit: `RemoteStore._delete_all` removes a pass's logs, then their statuses,
in bulk requests of at most this many keys."""


@dataclass(frozen=True, slots=True)
class Linear:
    """seconds = fixed + per_event × events + per_log × logs (a least-squares fit over passes)."""

    fixed: float
    per_event: float = 0.0
    per_log: float = 0.0

    def at(self, events: float, logs: float) -> float:
        """The fitted seconds; a negative coefficient (noise around zero) counts as zero, so that
        extrapolating to a billion events never makes a phase take less than no time."""
        return max(0.0, self.fixed) + max(0.0, self.per_event) * events + max(0.0, self.per_log) * logs


def solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """x with matrix·x = vector (Gaussian elimination with partial pivoting); ValueError when the
    system is singular (the passes do not tell the terms apart)."""
    size = len(vector)
    rows = [[*matrix[i], vector[i]] for i in range(size)]
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) < 1e-12:
            raise ValueError("singular system: the passes do not separate the model's terms")
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(size):
            if r != col:
                factor = rows[r][col] / rows[col][col]
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col], strict=True)]
    return [rows[i][size] / rows[i][i] for i in range(size)]


def least_squares(xs: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Coefficients c (intercept first) minimising Σ (y − c0 − Σ c_j x_j)², by the normal
    equations. The x columns are scaled to their largest value first: events (10^5) and logs
    (10^1) side by side would leave the system badly conditioned."""
    width = len(xs[0]) + 1
    scales = [1.0] + [max(abs(row[j]) for row in xs) or 1.0 for j in range(width - 1)]
    design = [[1.0] + [row[j] / scales[j + 1] for j in range(width - 1)] for row in xs]
    normal = [[sum(d[i] * d[j] for d in design) for j in range(width)] for i in range(width)]
    right = [sum(d[i] * y for d, y in zip(design, ys, strict=True)) for i in range(width)]
    return [c / s for c, s in zip(solve(normal, right), scales, strict=True)]


def fit_events_logs(points: Sequence[tuple[int, int, float]]) -> Linear:
    """Linear fitted to (events, logs, seconds): needs passes that vary events and logs apart."""
    fixed, per_event, per_log = least_squares([(e, n) for e, n, _s in points], [s for _e, _n, s in points])
    return Linear(fixed, per_event, per_log)


def fit_events(points: Sequence[tuple[int, float]]) -> Linear:
    """Linear fitted to (events, seconds), no per-log term."""
    fixed, per_event = least_squares([(e,) for e, _s in points], [s for _e, s in points])
    return Linear(fixed, per_event)


def median_by(points: Sequence[tuple[tuple[int, ...], float]]) -> list[tuple[tuple[int, ...], float]]:
    """The median of the repeats of each key, in key order: one point per pass configuration,
    so that one slow repeat (another helper's tests) does not pull the fit."""
    groups: dict[tuple[int, ...], list[float]] = {}
    for key, value in points:
        groups.setdefault(key, []).append(value)
    return [(key, statistics.median(values)) for key, values in sorted(groups.items())]


@dataclass(frozen=True, slots=True)
class Workload:
    """One pass of a deployment: `rate` events a day, a pass every `period` seconds."""

    rate: float
    period: float
    nodes: int
    """Collector nodes: each rotates one log per pass (`log.rotation_min` ≤ the period)."""
    bytes_per_event: float

    @property
    def events(self) -> int:
        return math.ceil(self.rate * self.period / DAY_SECONDS)

    @property
    def logs(self) -> int:
        return self.nodes

    @property
    def splits(self) -> int:
        """Splits of the pass: each log cut in 16 MiB pieces (`plan_splits`)."""
        per_log = self.events * self.bytes_per_event / self.nodes
        return self.nodes * max(1, math.ceil(per_log / SPLIT_BYTES))


@dataclass(frozen=True, slots=True)
class Costs:
    """What one pass costs, measured (bench/scale.py)."""

    driver: dict[str, Linear]
    """Phase → its fit, for DRIVER_PHASES."""
    event_core_seconds: float
    """Executor seconds per event on one core (the stage's slope on `local[1]`)."""
    job_seconds: float
    """The stage's fixed part: one Spark job and its first wave of tasks, whatever its size."""
    task_seconds: float
    """Seconds of one (empty) task on one executor: paid again for each further wave of tasks."""
    copy_rate: float
    """Rows per second one destination core takes by COPY (one backend per executor's COPY)."""
    destination_cores: int
    archive_core_seconds: float = 0.0
    """Seconds per event one executor core spends archiving (gzip) on a cluster master."""
    archive_log_seconds: float = 0.0
    """Seconds per log of the archive's task beside the gzip (open, fsync, rename)."""
    archive_job_seconds: float = 0.0
    """The archive job's fixed cost on a cluster master: an empty one-task Spark job."""
    request_seconds: float = 0.0
    """One request to the log store on the driver's side (0: `log.path`, a local disk)."""


@dataclass(frozen=True, slots=True)
class Prediction:
    executors: int
    driver: float
    stage: float
    executor_bound: float
    """Seconds of the events' part if the destination kept up."""
    destination_bound: float
    """Seconds the destination needs for the events with min(executors, cores) COPYs at once."""
    archive: float = 0.0
    """Seconds of the archive's Spark job (a cluster master; on a local one it is in `driver`)."""

    @property
    def total(self) -> float:
        return self.driver + self.stage + self.archive

    @property
    def driver_share(self) -> float:
        return self.driver / self.total if self.total else 0.0


def driver_seconds(costs: Costs, events: float, logs: float, archive_on_driver: bool = False) -> float:
    """The driver's fitted phases, the archive among them only where the driver gzips (`local...`
    masters), plus the archive's deletes on the log store."""
    phases = [p for p in DRIVER_PHASES if p in costs.driver and (archive_on_driver or p != "archive")]
    return sum(costs.driver[p].at(events, logs) for p in phases) + costs.request_seconds * delete_requests(logs)


def delete_requests(logs: float) -> int:
    """Requests that remove a pass's archived logs from the store: the logs, then their statuses,
    in bulk (two a pass up to 1,000 logs; before, two per log, one after the other)."""
    return 2 * math.ceil(logs / DELETES_PER_REQUEST)


def archive_seconds(costs: Costs, events: float, logs: int, executors: int) -> float:
    """The archive as a Spark job on a cluster master: the logs in at most one task per core
    (`logs.store._on_executors`), so the gzip of the pass's events spreads over
    min(executors, logs) cores (the logs of a pass are of a size: one per node) in one wave, plus
    the job's fixed cost."""
    if logs <= 0:
        return 0.0
    spread = (events * costs.archive_core_seconds + logs * costs.archive_log_seconds) / min(executors, logs)
    return costs.archive_job_seconds + spread


def predict(
    costs: Costs,
    work: Workload,
    executors: int,
    archive_on_driver: bool = False,
    executor_archive_bytes: float = EXECUTOR_ARCHIVE_BYTES,
) -> Prediction:
    """The pass of `work` on `executors` executors of one core each. The events' part is the
    slower of the executors (only those with a split to read help) and the destination (one COPY
    per executor, at most one per destination core at full speed). The archive is a Spark job
    of the executors (a cluster master), or with `archive_on_driver` the driver's fitted phase
    (what a `local...` master still does)."""
    splits = work.splits
    tasks = min(splits, TASKS_PER_CORE * executors)
    waves = math.ceil(tasks / executors)
    executor_bound = work.events * costs.event_core_seconds / min(executors, splits)
    writers = min(executors, splits, costs.destination_cores)
    destination_bound = work.events / (writers * costs.copy_rate) if costs.copy_rate > 0 else 0.0
    stage = costs.job_seconds + (waves - 1) * costs.task_seconds + max(executor_bound, destination_bound)
    # Below `executor_archive_bytes` a pass over `log.path` keeps the gzip on the driver
    # (`LocalStore.archive`); `log.remote` archives on the executors at every size: pass 0.
    archive_on_driver = archive_on_driver or work.events * work.bytes_per_event < executor_archive_bytes
    driver = driver_seconds(costs, work.events, work.logs, archive_on_driver)
    archive = 0.0 if archive_on_driver else archive_seconds(costs, work.events, work.logs, executors)
    return Prediction(executors, driver, stage, executor_bound, destination_bound, archive)


def speedup(costs: Costs, work: Workload, executors: int) -> float:
    """Pass time on one executor over pass time on `executors`."""
    return predict(costs, work, 1).total / predict(costs, work, executors).total


def _count(value: float) -> str:
    """10M, 1B: the rates as the issue spells them."""
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


def prediction_table(costs: Costs, works: Sequence[Workload], executors: Sequence[int]) -> list[str]:
    """The lines of the table `bench/scale.py` prints: one per workload and executor count."""
    lines = [
        f"{'events/day':>11} {'events/pass':>11} {'logs':>4} {'splits':>6} {'exec':>4} {'pass s':>8} "
        f"{'speed-up':>8} {'keeps up':>8} {'driver':>7} {'exec-bound s':>12} {'dest-bound s':>12} {'archive s':>9}"
    ]
    for work in works:
        for n in executors:
            p = predict(costs, work, n)
            lines.append(
                f"{_count(work.rate):>11} {work.events:>11,} {work.logs:>4} {work.splits:>6} {n:>4} {p.total:>8.2f} "
                f"{speedup(costs, work, n):>7.1f}x {('yes' if p.total <= work.period else 'NO'):>8} "
                f"{p.driver_share:>6.0%} {p.executor_bound:>12.2f} {p.destination_bound:>12.2f} {p.archive:>9.2f}"
            )
    return lines
