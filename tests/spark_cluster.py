"""A Spark standalone cluster on 127.0.0.1 for the tests and the benchmarks: one master and N workers
started from the pip `pyspark` package, each JVM in a process group of its own so that stopping the
cluster leaves nothing running (a worker's executors are its children, in its group).

The pip package has the deploy classes but not sbin/start-master.sh or start-worker.sh, so the JVMs
are started with `bin/spark-class` directly (../shared/emulators.md). Usage:

    with StandaloneCluster(workers=2) as cluster:
        SparkConfig(master=cluster.master_url)  # spark://127.0.0.1:PORT

Applications on it must ask for at most the workers' memory per executor (1 GiB by default, which is
Spark's default `spark.executor.memory`) and run their executors with the driver's Python, which
`eventspark.batch.session.prepare_environment` sets (PYSPARK_PYTHON = the venv's python).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any

START_TIMEOUT_SEC = 90.0
"""Master and workers are ALIVE in ~2-5 s each on an idle machine; a loaded 2-core box needs more."""
STOP_GRACE_SEC = 10.0
DAEMON_MEMORY = "512m"
"""Heap of the master and worker JVMs themselves (Spark's default is 1g); executors are separate."""


class ClusterError(RuntimeError):
    """The cluster did not come up; the message holds the end of the JVMs' logs."""


def spark_home() -> Path:
    """The pyspark package directory: it has bin/spark-class and the jars."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class StandaloneCluster:
    """A standalone master and `workers` workers (`cores` cores, `memory` each) on loopback."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g", root: Path | None = None) -> None:
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="spark-cluster-")) if root is None else root
        self.master_port = 0
        self.webui_port = 0
        self._processes: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._logs: list[IO[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def webui_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}"

    def __enter__(self) -> StandaloneCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self, timeout: float = START_TIMEOUT_SEC) -> None:
        """Starts the master, then the workers; returns once the master lists them all ALIVE."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.master_port, self.webui_port = free_port(), free_port()
        try:
            self._spawn("master", self._master_args())
            self._wait(lambda: self.state().get("status") == "ALIVE", timeout, "the master to be ALIVE")
            for number in range(self.workers):
                self._spawn(f"worker-{number}", self._worker_args(number))
            self._wait(lambda: self.workers_alive() == self.workers, timeout, f"{self.workers} ALIVE workers")
        except BaseException:
            self.stop()
            raise

    def state(self) -> dict[str, Any]:
        """The master's JSON status (`/json/`): workers, active and completed applications; {} when
        the master does not answer."""
        try:
            with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=5) as response:
                state: dict[str, Any] = json.load(response)
                return state
        except (urllib.error.URLError, OSError, ValueError):
            return {}

    def workers_alive(self) -> int:
        return sum(1 for worker in self.state().get("workers", []) if worker.get("state") == "ALIVE")

    def active_apps(self) -> list[dict[str, Any]]:
        """Running applications as the master sees them (`cores` is what each holds now)."""
        apps: list[dict[str, Any]] = self.state().get("activeapps", [])
        return apps

    def stop(self) -> None:
        """Stops every JVM started here (SIGTERM to each group, SIGKILL after a grace period)."""
        for _name, process in reversed(self._processes):
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SEC
        for _name, process in reversed(self._processes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            # The group may still hold a worker's executors after the worker's JVM is gone.
            _signal_group(process, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        self._processes = []
        for handle in self._logs:
            handle.close()
        self._logs = []
        if self._own_root:
            _remove_tree(self.root)

    def log_tail(self, chars: int = 3000) -> str:
        """The end of every JVM's log, for failure messages."""
        parts = []
        for path in sorted(self.root.glob("*.log")):
            text = path.read_text(errors="replace")
            parts.append(f"--- {path.name} ---\n{text[-chars:]}")
        return "\n".join(parts)

    def _master_args(self) -> list[str]:
        return [
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(self.master_port), "--webui-port", str(self.webui_port)),
        ]

    def _worker_args(self, number: int) -> list[str]:
        work_dir = self.root / f"worker-{number}"
        work_dir.mkdir(exist_ok=True)
        return [
            "org.apache.spark.deploy.worker.Worker",
            *("--host", "127.0.0.1", "--port", str(free_port()), "--webui-port", str(free_port())),
            *("--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work_dir)),
            self.master_url,
        ]

    def _spawn(self, name: str, args: list[str]) -> None:
        log = (self.root / f"{name}.log").open("wb")
        self._logs.append(log)
        process = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            env=self._environment(),
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() signals the JVM and its executors
        )
        self._processes.append((name, process))

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        conf_dir = self.root / "conf"  # empty: no spark-defaults or spark-env of the machine's
        conf_dir.mkdir(exist_ok=True)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_CONF_DIR=str(conf_dir),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
            PYSPARK_PYTHON=sys.executable,
        )
        return env

    def _wait(self, ready: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [name for name, process in self._processes if process.poll() is not None]
            if dead:
                raise ClusterError(f"{', '.join(dead)} exited while waiting for {what}\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise ClusterError(f"no {what} after {timeout:g} s\n{self.log_tail()}")
            time.sleep(0.25)


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":  # python -m tests.spark_cluster: start one, print its URL, stop on Ctrl-C
    with StandaloneCluster() as cluster:
        print(cluster.master_url, cluster.webui_url, f"{cluster.workers_alive()} workers", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
