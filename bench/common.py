"""Helpers the batch benchmarks share: generated incoming logs and a minimal config around them.

Scripts import it as `common` (they put bench/ on sys.path, as for `generate`).
"""

from __future__ import annotations

import os
import socket
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from eventspark.config import LoadedConfig
from eventspark.config.loading import validate_config
from eventspark.logs.incoming import rotated_log_name
from generate import generate_events

EVENTS_PER_FILE = 250_000


def generate_logs(folder: Path, n: int, seed: int, events_per_file: int = EVENTS_PER_FILE) -> list[Path]:
    """Writes `n` events as rotated-log-sized files; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    out = None
    for i, event in enumerate(generate_events(n, seed=seed)):
        if i % events_per_file == 0:
            if out is not None:
                out.close()
            paths.append(folder / f"part-{len(paths):04d}.log")
            out = paths[-1].open("wb")
        assert out is not None
        out.write(orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE))
    if out is not None:
        out.close()
    return paths


def stage_as_rotated(files: list[Path], incoming: Path, first: int = 0) -> None:
    """Hard-links `files` into `incoming` under rotated-log names, one second apart, in order,
    the first `first` seconds after the start of the bench's day (later than earlier logs)."""
    incoming.mkdir(parents=True, exist_ok=True)
    at = datetime(2026, 11, 1, tzinfo=UTC) + timedelta(seconds=first)
    for i, path in enumerate(files):
        os.link(path, incoming / rotated_log_name("bench", at + timedelta(seconds=i)))


def bench_config(
    root: Path, master: str, destinations: dict[str, Any], remote: dict[str, Any] | None = None
) -> LoadedConfig:
    """A config with one API key, the event logs under `root` (and on `remote`, a `log.remote`
    section, when given) and the given destinations."""
    raw = {
        "api_keys": [{"id": "bench", "client_secret": "bench-token", "server_secret": "bench-s2s"}],
        "log": {"path": str(root / "events"), **({"remote": remote} if remote else {})},
        "destinations": destinations,
        "spark": {"master": master},
    }
    return LoadedConfig(config=validate_config(raw))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PeakRss:
    """The peak resident memory of this process and all its descendants (the JVM, Spark's Python
    workers) while in a `with` block: /proc sampled every `interval` seconds on a thread.

    The sum of each process's RSS: pages shared between forked Python workers count once per
    process, so this is an upper bound, as `ps` or a container's per-process view would show.
    """

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.peak = 0
        self.before = 0
        """This process's own RSS on entry: what the bench held already (rows of a floor...)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="peak-rss", daemon=True)

    def __enter__(self) -> PeakRss:
        self.before = _rss(os.getpid())
        self.peak = tree_rss(os.getpid())
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def __str__(self) -> str:
        return f"peak RSS {self.peak / 1e9:.2f} GB, {self.before / 1e9:.2f} GB of it the bench process's before"

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, tree_rss(os.getpid()))


def tree_rss(root: int) -> int:
    """Bytes resident in `root` and its descendants, now (processes that end meanwhile count 0)."""
    return sum(_rss(pid) for pid in _tree(root))


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) used so far by `root` and its descendants, with the children
    they reaped: Spark's Python workers and a cluster's executor JVMs, which `time.process_time`
    of the driver misses (processes that end unreaped meanwhile are lost)."""
    return sum(_cpu_ticks(pid) for pid in _tree(root)) / CLOCK_TICKS


def _tree(root: int) -> list[int]:
    """`root` and its descendants, now."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            parent = _parent_pid(entry.name)
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _cpu_ticks(pid: int) -> int:
    """utime + stime + cutime + cstime of `pid` (fields 14-17 of /proc/PID/stat), 0 once gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
            return sum(int(f) for f in fields[11:15])
    except (OSError, IndexError, ValueError):
        return 0


def _parent_pid(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # The command name (2nd field) may hold spaces and parentheses: split after its last ")".
            return int(stat.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
