"""Counters of every process of a node, whole on `/prometheus` whatever process answers.

With `server.workers > 1` each collector worker is a forked process with its own counters, and
the pipeline (batch uploader, stream workers) runs in the parent. So every process that counts
writes a *snapshot* of its counters, `<log.path>/metrics/<host>-<pid>-<start>_<nonce>.json`
(`<start>`: the process's start time in clock ticks since boot, from `/proc`), about once a second
(`Snapshots`, a daemon thread; replaced atomically when it changed, else touched). The process that
answers a scrape adds its own live counters to the snapshots of the others (`Snapshots.merged`).

Counters never go backwards:
- the snapshot of a process that ended (its pid is gone, or now belongs to a process that started
  at another time: pids are reused across restarts) is folded into `retired.json` under an
  `flock`, so its counts stay in the sums after it exits, and across restarts of the node. Folding
  is crash-safe: `retired.json` names the snapshots it holds, and a snapshot already named there is
  only deleted. Each process folds when it starts and every scrape folds, so `metrics/` holds one
  file per live process plus `retired.json` and `answered.json`;
- a snapshot lags its process by up to a second, so two scrapes answered by different workers could
  see different sums: every answer is at least the last one, per series (`answered.json`, read and
  written under the same `flock`). Each part of a sum is a count that has happened, so an answer is
  never more than the true total, and never less than an earlier answer.

Deleting the `metrics/` folder while the node is stopped resets every counter (Prometheus sees a
counter reset). Snapshots of other hosts (a `log.path` on a shared disk) are not read; one not
touched for `STALE_OTHER_HOST` seconds (its host's process is gone, e.g. a container that was
replaced) is deleted.

The pipeline's counters are `PipelineMetrics`, one per process (`pipeline_metrics()`; a fork gets a
fresh one), recorded by the uploader and the stream workers and written by the node's `Snapshots`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import threading
import time
import uuid
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from eventspark.ops.state import StateRecorder

if TYPE_CHECKING:
    from eventspark.batch.job import JobResult

log = logging.getLogger(__name__)

METRICS_DIR = "metrics"
RETIRED = "retired.json"
ANSWERED = "answered.json"
STALE_OTHER_HOST = 24 * 3600.0
"""Seconds after which another host's untouched snapshot is deleted (its writer touches it every period)."""
LOCK = ".lock"
SNAPSHOT_PERIOD = 1.0
PASS_BUCKETS = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)

Labels = tuple[str, ...]


class Histogram:
    """Counts per bucket (the last one is +Inf) and the sum of observed values."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...], counts: list[int] | None = None, total: float = 0.0) -> None:
        self.bounds = bounds
        self.counts = counts if counts is not None else [0] * (len(bounds) + 1)
        self.total = total

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus buckets: (upper bound, observations at or below it)."""
        running, buckets = 0, []
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            buckets.append((bound, running))
        return buckets

    def copy(self) -> Histogram:
        return Histogram(self.bounds, list(self.counts), self.total)

    def add(self, other: Histogram) -> None:
        if len(other.counts) != len(self.counts):
            return  # another version's buckets: not addable
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.total += other.total


@dataclass(slots=True)
class Sample:
    """Counters and histograms by family name and label values: what a snapshot holds."""

    counters: dict[str, dict[Labels, float]] = field(default_factory=dict)
    histograms: dict[str, dict[Labels, Histogram]] = field(default_factory=dict)

    def count(self, family: str, labels: Labels, value: float = 1) -> None:
        series = self.counters.setdefault(family, {})
        series[labels] = series.get(labels, 0) + value

    def add(self, other: Sample) -> None:
        for family, series in other.counters.items():
            for labels, value in series.items():
                self.count(family, labels, value)
        for family, histograms in other.histograms.items():
            into = self.histograms.setdefault(family, {})
            for labels, histogram in histograms.items():
                if labels in into:
                    into[labels].add(histogram)
                else:
                    into[labels] = histogram.copy()

    def at_least(self, floor: Sample) -> None:
        """Raises every series to at least its value in `floor` (series only in `floor` are added)."""
        for family, series in floor.counters.items():
            own = self.counters.setdefault(family, {})
            for labels, value in series.items():
                if value > own.get(labels, 0):
                    own[labels] = value
        for family, histograms in floor.histograms.items():
            into = self.histograms.setdefault(family, {})
            for labels, histogram in histograms.items():
                mine = into.get(labels)
                if mine is None:
                    into[labels] = histogram.copy()
                elif len(mine.counts) == len(histogram.counts):
                    mine.counts = [max(a, b) for a, b in zip(mine.counts, histogram.counts, strict=True)]
                    mine.total = max(mine.total, histogram.total)

    def to_json(self) -> dict[str, Any]:
        return {
            "counters": {f: [[*labels, value] for labels, value in s.items()] for f, s in self.counters.items()},
            "histograms": {
                f: [[list(labels), list(h.bounds), h.counts, h.total] for labels, h in s.items()]
                for f, s in self.histograms.items()
            },
        }

    @classmethod
    def from_json(cls, raw: Any) -> Sample:
        """The sample a snapshot holds; entries of an unexpected shape are ignored."""
        sample = cls()
        if not isinstance(raw, dict):
            return sample
        for family, rows in _items(raw.get("counters")):
            for row in rows if isinstance(rows, list) else ():
                if isinstance(row, list) and row and isinstance(row[-1], int | float):
                    sample.count(family, tuple(map(str, row[:-1])), row[-1])
        for family, rows in _items(raw.get("histograms")):
            for row in rows if isinstance(rows, list) else ():
                with contextlib.suppress(TypeError, ValueError):
                    labels, bounds, counts, total = row
                    histogram = Histogram(tuple(map(float, bounds)), [int(c) for c in counts], float(total))
                    sample.add(cls(histograms={family: {tuple(map(str, labels)): histogram}}))
        return sample


def _items(raw: Any) -> Iterable[tuple[str, Any]]:
    return raw.items() if isinstance(raw, dict) else ()


# --- the pipeline's counters ----------------------------------------------------------------------


class PipelineMetrics:
    """Batch passes and stream deliveries of this process (thread-safe; cheap: once per pass or micro-batch)."""

    def __init__(self) -> None:
        self._sample = Sample()
        self._lock = threading.Lock()
        self.states = StateRecorder()
        """Last load time and error per destination (`ops.state`), flushed with the snapshots."""

    def batch_pass(self, seconds: float, ok: bool) -> None:
        with self._lock:
            histograms = self._sample.histograms.setdefault("batch_pass_duration_seconds", {})
            histograms.setdefault((), Histogram(PASS_BUCKETS)).observe(seconds)
            self._sample.count("batch_passes", ("ok" if ok else "failed",))

    def batch_pair(self, dest_id: str, table: str, loaded: int, failed: int, skipped: int, error: bool) -> None:
        """One destination/table of a pass: rows loaded, events sent to `failed/`, skipped; a failed load."""
        with self._lock:
            for family, value in (
                ("batch_rows_loaded", loaded),
                ("batch_rows_failed", failed),
                ("batch_rows_skipped", skipped),
                ("batch_load_errors", int(error)),
            ):
                self._sample.count(family, (dest_id, table), value)

    def stream_batch(self, dest_id: str, delivered: int, failed: int, skipped: int) -> None:
        """One micro-batch (or held batch) of a stream destination, decided."""
        with self._lock:
            self._sample.count("stream_events_delivered", (dest_id,), delivered)
            self._sample.count("stream_events_failed", (dest_id,), failed)
            self._sample.count("stream_events_skipped", (dest_id,), skipped)

    def stream_insert(self, dest_id: str) -> None:
        with self._lock:
            self._sample.count("stream_inserts", (dest_id,))

    def stream_retry(self, dest_id: str) -> None:
        with self._lock:
            self._sample.count("stream_retries", (dest_id,))

    def retention_removed(self, directory: str, files: int, size: int) -> None:
        """One retention run over `archive` or `failed` (`logs.retention`): files and bytes removed."""
        with self._lock:
            self._sample.count("retention_removed_files", (directory,), files)
            self._sample.count("retention_removed_bytes", (directory,), size)

    def retry_gave_up(self, dest_id: str, events: int) -> None:
        """Events sent to `failed/` because the retry policy's maximum age was over (batch and stream)."""
        with self._lock:
            self._sample.count("retry_gave_up_events", (dest_id,), events)

    def sample(self) -> Sample:
        with self._lock:
            copy = Sample()
            copy.add(self._sample)
            return copy


_pipeline: tuple[int, PipelineMetrics] | None = None
_pipeline_lock = threading.Lock()


def pipeline_metrics() -> PipelineMetrics:
    """This process's pipeline counters; a forked process starts from zero (its parent counts its own)."""
    global _pipeline
    with _pipeline_lock:
        if _pipeline is None or _pipeline[0] != os.getpid():
            _pipeline = (os.getpid(), PipelineMetrics())
        return _pipeline[1]


# --- snapshots ------------------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _start_ticks(pid: int | str) -> str:
    """When the process started, in clock ticks since boot (Linux `/proc/<pid>/stat`); '' if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
        return fields[19].decode() if len(fields) > 19 and fields[19].isdigit() else ""
    except (OSError, IndexError):
        return ""


def _snapshot_parts(name: str) -> tuple[str, int, str] | None:
    """(host, pid, start ticks or '') of `<host>-<pid>-<start>_<nonce>.json` (or the older
    `<host>-<pid>-<nonce>.json`); None for other files."""
    stem, dot, ext = name.rpartition(".")
    parts = stem.rsplit("-", 2)
    if not dot or ext != "json" or len(parts) != 3 or not parts[1].isdigit():
        return None
    start, underscore, _nonce = parts[2].partition("_")
    return parts[0], int(parts[1]), start if underscore and start.isdigit() else ""


def _snapshot_pid(name: str, host: str) -> int | None:
    """The pid in a snapshot's name when its host is `host`; None for other files."""
    parts = _snapshot_parts(name)
    return parts[1] if parts is not None and parts[0] == host else None


def _ended(name: str, host: str) -> bool:
    """Whether the snapshot is this host's and its process is gone (its pid ended, or is another
    process's now: the start time differs)."""
    parts = _snapshot_parts(name)
    if parts is None or parts[0] != host:
        return False
    _host, pid, start = parts
    if not _pid_alive(pid):
        return True
    return bool(start) and _start_ticks(pid) not in ("", start)


def _read_json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class Snapshots:
    """This process's snapshot in `directory` and the sum of every process's (module docstring).

    `sources` are functions returning a Sample of live counters (the collector's, the pipeline's);
    `start()` writes the snapshot every `period` seconds on a daemon thread, `stop()` writes a last one.
    """

    def __init__(self, directory: Path, period: float = SNAPSHOT_PERIOD) -> None:
        self.directory = directory
        self.period = period
        self.host = socket.gethostname().replace("-", "_").replace("/", "_") or "host"
        self.name = f"{self.host}-{os.getpid()}-{_start_ticks('self')}_{uuid.uuid4().hex[:8]}.json"
        self._sources: list[Callable[[], Sample]] = []
        self._frozen = Sample()
        self._on_write: list[Callable[[], None]] = []
        self._written = b""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._io_lock = threading.Lock()

    def add_source(self, source: Callable[[], Sample], on_write: Callable[[], None] | None = None) -> None:
        """Adds live counters and starts the thread; `on_write` runs before every write (e.g. flushing
        state records)."""
        with self._lock:
            self._sources.append(source)
            if on_write is not None:
                self._on_write.append(on_write)
        self.start()

    def release(self, source: Callable[[], Sample], on_write: Callable[[], None] | None = None) -> None:
        """Keeps the source's last counts (a counter must not drop when its component stops) and
        removes it; the last one out stops the thread and writes the final snapshot."""
        if on_write is not None:
            on_write()
        with self._lock:
            if source in self._sources:
                self._frozen.add(source())
                self._sources.remove(source)
            if on_write in self._on_write:
                self._on_write.remove(on_write)
            last = not self._sources
        if last:
            self.stop()
        else:
            self.write()

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self._thread is not None:
            return
        fold_ended(self.directory, self.host)  # what earlier runs left (no scrape may come)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="eventspark-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread and writes the last snapshot."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.write()

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.write()
            except Exception:  # a bug must not end the thread: the next period tries again
                log.exception("writing the metrics snapshot failed")

    def live(self) -> Sample:
        """This process's counters: its sources' and those of sources it released."""
        with self._lock:
            sources = list(self._sources)
            total = Sample()
            total.add(self._frozen)
        for source in sources:
            total.add(source())
        return total

    def write(self) -> None:
        """Writes the snapshot when it changed; runs the `on_write` hooks. Errors are logged, not raised."""
        for hook in list(self._on_write):
            try:
                hook()
            except Exception:  # a hook's bug must not stop the metrics
                log.exception("metrics hook failed")
        with self._io_lock:  # one write at a time, so an older snapshot never replaces a newer one
            data = orjson.dumps(self.live().to_json())
            if data == self._written and self._touched():
                return
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                _replace(self.directory / self.name, data)
                self._written = data
            except OSError as exc:
                log.warning("cannot write the metrics snapshot %s: %s", self.directory / self.name, exc)

    def _touched(self) -> bool:
        """Marks the unchanged snapshot as alive (mtime); False when it is gone (to be written again)."""
        try:
            os.utime(self.directory / self.name)
            return True
        except OSError:
            return False

    def merged(self) -> Sample:
        """Live counters of this process + the snapshots of this host's other processes + retired
        ones; each series at least as high as in the last answer (module docstring)."""
        return merge_snapshots(self.directory, self.host, exclude=self.name, live=self.live())


def merge_snapshots(directory: Path, host: str, exclude: str = "", live: Sample | None = None) -> Sample:
    """The sum of `live`, the snapshots in `directory` (but `exclude`) and `retired.json`; folds the
    snapshots of ended processes into `retired.json` first. With `live` (an answer to a scrape), no
    series is lower than in the last answer, which is then this one (`answered.json`)."""
    total = Sample()
    if live is not None:
        total.add(live)
    if not directory.is_dir():
        return total
    with _locked(directory) as locked:
        if locked:
            _fold_quietly(directory, host)
        retired = _read_json(directory / RETIRED)
        if isinstance(retired, dict):
            total.add(Sample.from_json(retired.get("sample")))
            folded = set(retired.get("folded") or ())
        else:
            folded = set()
        for name in sorted(os.listdir(directory)):
            if name == exclude or name in folded or _snapshot_pid(name, host) is None:
                continue
            total.add(Sample.from_json(_read_json(directory / name)))
        if locked and live is not None:
            _at_least_answered(directory, total)
    return total


def _at_least_answered(directory: Path, total: Sample) -> None:
    """Raises `total` to the last answer and records it as the new one (caller holds the lock)."""
    total.at_least(Sample.from_json(_read_json(directory / ANSWERED)))
    try:
        _replace(directory / ANSWERED, orjson.dumps(total.to_json()))
    except OSError as exc:  # a full disk: this answer is still right, the next may go back
        log.warning("cannot record the metrics answer in %s: %s", directory, exc)


def fold_ended(directory: Path, host: str) -> None:
    """Folds the snapshots of this host's ended processes into `retired.json` (best effort)."""
    if directory.is_dir():
        with _locked(directory) as locked:
            if locked:
                _fold_quietly(directory, host)


def _fold_quietly(directory: Path, host: str) -> None:
    try:
        _fold_ended(directory, host)
    except OSError as exc:  # a full disk: the sums still hold (a snapshot not folded is read as it is)
        log.warning("cannot fold ended metrics snapshots in %s: %s", directory, exc)


@contextlib.contextmanager
def _locked(directory: Path) -> Any:
    """The folder's lock, exclusive: folding and reading never interleave (no double counts)."""
    try:
        fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)


def _fold_ended(directory: Path, host: str) -> None:
    """Adds the snapshots of ended processes to `retired.json`, then deletes them (caller holds the lock)."""
    raw = _read_json(directory / RETIRED)
    raw = raw if isinstance(raw, dict) else {}
    retired = Sample.from_json(raw.get("sample"))
    folded = [name for name in raw.get("folded") or () if isinstance(name, str)]
    names = sorted(os.listdir(directory))
    ended = [name for name in names if _ended(name, host)]
    _delete_stale_other_hosts(directory, host, names)
    fresh = [name for name in ended if name not in folded]
    if fresh:
        for name in fresh:
            retired.add(Sample.from_json(_read_json(directory / name)))
        # Names still on disk stay listed, so a crash before their deletion cannot count them twice.
        folded = [name for name in folded if (directory / name).exists()] + fresh
        _replace(directory / RETIRED, orjson.dumps({"sample": retired.to_json(), "folded": folded}))
    for name in ended:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(directory / name)


def _delete_stale_other_hosts(directory: Path, host: str, names: list[str]) -> None:
    now = time.time()
    for name in names:
        parts = _snapshot_parts(name)
        if parts is None or parts[0] == host:
            continue
        with contextlib.suppress(OSError):
            if now - os.stat(directory / name).st_mtime > STALE_OTHER_HOST:
                os.unlink(directory / name)


_snapshots: dict[tuple[int, Path], Snapshots] = {}
_snapshots_lock = threading.Lock()


def process_snapshots(log_path: Path) -> Snapshots:
    """This process's `Snapshots` for `<log_path>/metrics` (one per process and folder)."""
    directory = (log_path / METRICS_DIR).absolute()
    key = (os.getpid(), directory)
    with _snapshots_lock:
        found = _snapshots.get(key)
        if found is None:
            found = _snapshots[key] = Snapshots(directory)
        return found


# --- recording a batch pass -----------------------------------------------------------------------


def record_pass(log_path: Path, result: JobResult, seconds: float) -> None:
    """Counts a pass over at least one log (rows per destination and table) and records each
    destination's last load and error (`ops.state`), written at once."""
    read = len(result.kept) > len(result.waiting)  # `waiting`: logs whose retries are not due (not read)
    if not (result.pairs or result.archived or read or result.deleted_empty):
        return  # nothing was waiting, or nothing due: not a pass worth a histogram sample
    metrics = pipeline_metrics()
    metrics.batch_pass(seconds, ok=result.ok)
    for dest_id, events in sorted(result.gave_up.items()):
        metrics.retry_gave_up(dest_id, events)
    loaded: dict[str, int] = {}
    for (dest_id, table), pair in sorted(result.pairs.items()):
        rows = 0 if pair.error else pair.rows
        metrics.batch_pair(dest_id, table, rows, 0 if pair.error else pair.failed, pair.skipped, bool(pair.error))
        loaded[dest_id] = loaded.get(dest_id, 0) + rows
        if pair.error:
            metrics.states.failed(log_path, dest_id, f"{table or '-'}: {pair.error}")
    for dest_id, rows in loaded.items():
        if rows:
            metrics.states.loaded(log_path, dest_id, rows)
    metrics.states.flush()


def record_pass_error(log_path: Path, dest_ids: Iterable[str], seconds: float, error: str) -> None:
    """A pass that raised (the Spark job failed): every batch destination's last error."""
    metrics = pipeline_metrics()
    metrics.batch_pass(seconds, ok=False)
    for dest_id in dest_ids:
        metrics.states.failed(log_path, dest_id, error)
    metrics.states.flush()


# --- recording stream deliveries ------------------------------------------------------------------


def record_stream_batch(log_path: Path, dest_id: str, delivered: list[bytes], failed: int, skipped: int) -> None:
    """A decided micro-batch: counts, and the last load with the newest delivered event's `_timestamp`
    (its record is written by the node's metrics thread within a second)."""
    metrics = pipeline_metrics()
    metrics.stream_batch(dest_id, len(delivered), failed, skipped)
    if delivered:
        metrics.states.loaded(log_path, dest_id, len(delivered), _timestamp_of(delivered[-1]))


def record_stream_retry(log_path: Path, dest_id: str, error: str) -> None:
    metrics = pipeline_metrics()
    metrics.stream_retry(dest_id)
    metrics.states.failed(log_path, dest_id, error)


def _timestamp_of(line: bytes) -> str:
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        return ""
    found = event.get("_timestamp") if isinstance(event, dict) else None
    return found if isinstance(found, str) else ""
