"""Locks between separate processes (the situation of several nodes), on Redis and etcd."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from eventspark.coordination import LockTimeout
from tests.coordination import contender
from tests.coordination.conftest import Backend

CONTENDER = Path(contender.__file__)


def _start(backend: Backend, node: str, **spec: Any) -> subprocess.Popen[str]:
    payload = json.dumps({"backend": backend.spec(), "node": node, "lock": "dest_events", **spec})
    return subprocess.Popen(
        [sys.executable, str(CONTENDER), payload],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_line(process: subprocess.Popen[str], seconds: float) -> str:
    """The next line the process prints, waiting at most `seconds` (never blocks the suite)."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], seconds)
    return process.stdout.readline().strip() if ready else ""


def _finish(process: subprocess.Popen[str], seconds: float) -> tuple[int, str]:
    try:
        out, err = process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    return process.returncode, out + err


def test_two_processes_never_hold_the_lock_together(shared_backend: Backend, tmp_path: Path) -> None:
    counter = tmp_path / "counter"
    counter.write_text("0")
    spec = {"mode": "count", "counter": str(counter), "rounds": 12}
    processes = [_start(shared_backend, f"node-{i}", **spec) for i in range(2)]
    results = [_finish(process, 60) for process in processes]
    assert results == [(0, ""), (0, "")]
    assert counter.read_text() == "24"


def test_lock_of_a_killed_holder_expires_with_its_lease(shared_backend: Backend) -> None:
    lease = shared_backend.lease_seconds
    holder = _start(shared_backend, "node-doomed", mode="hold", hold_seconds=60)
    try:
        assert _read_line(holder, 20) == "locked", _finish(holder, 1)
        os.kill(holder.pid, signal.SIGKILL)
        killed = time.monotonic()
        survivor = shared_backend.node("node-survivor")
        with survivor.lock("dest_events", timeout=lease + 5):
            waited = time.monotonic() - killed
    finally:
        holder.kill()
        holder.communicate()
    # The lock was not released by the dead holder: it stayed taken for what remained of its lease
    # (renewed every third of it, so at least about two thirds), then expired.
    # Room above: etcd finds expired leases on its own timer (~0.5 s), its revoke is a disk write.
    assert lease * 0.5 <= waited <= lease + 3, f"waited {waited:.2f} s for a {lease} s lease"


def test_holder_in_another_process_makes_contender_time_out_then_releases(shared_backend: Backend) -> None:
    lease = shared_backend.lease_seconds
    hold_seconds = lease * 2  # longer than the lease: only renewal keeps the lock held
    holder = _start(shared_backend, "node-holder", mode="hold", hold_seconds=hold_seconds)
    try:
        assert _read_line(holder, 20) == "locked", _finish(holder, 1)
        contender_node = shared_backend.node("node-contender")
        time.sleep(lease * 1.1)
        with pytest.raises(LockTimeout) as caught, contender_node.lock("dest_events", timeout=lease * 0.3):
            pytest.fail("the lock was taken while another process held it")
        assert caught.value.holder == "node-holder"
        with contender_node.lock("dest_events", timeout=lease + 5):
            assert _read_line(holder, 5) == "released"
    finally:
        code, output = _finish(holder, 10)
    assert code == 0, output
