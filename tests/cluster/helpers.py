"""Running applications on the test cluster in subprocesses: the probe app (tests/cluster/app.py)
held idle in the background, and bounded waits."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_app(master: str, *args: str, timeout: float = 120) -> dict[str, Any]:
    """Runs the probe app to the end; its JSON report."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.cluster.app", master, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[0])
    return report


class IdleApp:
    """The probe app started in the background: runs its job, then holds its session, idle, until
    `close()` (which closes its stdin and waits for it to stop its session)."""

    def __init__(self, master: str, *args: str, hold_sec: float = 300) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster.app", master, "--hold", str(hold_sec), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        self.report: dict[str, Any] = {}

    def wait_idle(self, timeout: float = 120) -> dict[str, Any]:
        """Blocks until the app's job is done and it idles; its report."""
        lines: list[str] = []
        reader = threading.Thread(target=self._read_until_idle, args=(lines,), daemon=True)
        reader.start()
        reader.join(timeout)
        if not lines or lines[-1] != "idle":
            self.close()
            raise AssertionError(f"the app did not reach idle in {timeout:g} s: {lines}\n{self.stderr_tail()}")
        self.report = json.loads(lines[0])
        return self.report

    def _read_until_idle(self, lines: list[str]) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            lines.append(line.strip())
            if line.strip() == "idle":
                return

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self, timeout: float = 60) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()  # its gateway JVM exits when its stdin (a pipe from this process) closes
            self.process.wait(10)

    def stderr_tail(self) -> str:
        if self.alive() or self.process.stderr is None:
            return ""
        return self.process.stderr.read()[-3000:]


def wait_until(condition: Callable[[], bool], timeout: float, period: float = 0.5) -> float:
    """Seconds until `condition()` held; AssertionError after `timeout`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not true after {timeout:g} s: {condition.__name__}")
        time.sleep(period)
    return time.monotonic() - started
