"""kill -9 of `eventspark serve` under load (issue 18): no acknowledged event is lost.

Several keep-alive clients post numbered events to the JS, s2s and bulk endpoints; once enough
are acknowledged every collector process is killed with SIGKILL. A restarted server rotates what
the killed one left in its live files; then every line of every incoming log must parse (no torn
line), every acknowledged event must be there once, and in the stream destination's queue too.
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from eventspark.logs.incoming import parse_log_name
from tests.collector import conftest as collector_fixtures
from tests.collector.conftest import Server, child_pids, logged_numbers, post_numbered

run_server = collector_fixtures.run_server

JS, S2S = "kill-js", "kill-s2s"
THREADS = 6
ACKNOWLEDGED_BEFORE_KILL = 1_500
PAD = "x" * 200


def config(workers: int) -> dict[str, Any]:
    return {
        "server": {"workers": workers},
        "api_keys": [{"id": "kill", "client_secret": JS, "server_secret": S2S}],
        "log": {"rotation_min": 60, "uploader_period_sec": 3600},
        "destinations": {
            "dw": {"type": "duckdb"},
            # Its warehouse is down: the worker keeps every event in the queue, where they are counted.
            "live": {"type": "postgres", "mode": "stream", "datasource": {"host": "127.0.0.1", "port": 1, "db": "x"}},
        },
    }


class Load:
    """Keep-alive clients posting numbered events until the server is gone."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.acknowledged: list[int] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._post, args=(t,)) for t in range(THREADS)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=30)

    def running(self) -> bool:
        return any(thread.is_alive() for thread in self.threads)

    def _post(self, thread: int) -> None:
        with httpx.Client(base_url=self.url, timeout=5) as client:
            for n in range(thread * 1_000_000, thread * 1_000_000 + 50_000, 5):
                ids = list(range(n, n + (5 if thread % 3 == 2 else 1)))
                try:
                    status = post_numbered(client, thread % 3, ids, JS, S2S, PAD)
                except httpx.TransportError:
                    return  # the server is gone
                if status == 200:
                    with self.lock:
                        self.acknowledged.extend(ids)


def kill_9(server: Server) -> None:
    """SIGKILL to the serving process and its worker processes at once."""
    pids = [*child_pids(server.process.pid), server.process.pid]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    server.process.wait()


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_kill_9_under_load_loses_no_acknowledged_event(
    run_server: Callable[..., Server], figure: Callable[[str], None], workers: int
) -> None:
    server = run_server(config(workers))
    load = Load(server.url)
    load.start()
    deadline = time.monotonic() + 60
    while len(load.acknowledged) < ACKNOWLEDGED_BEFORE_KILL and load.running() and time.monotonic() < deadline:
        time.sleep(0.01)
    kill_9(server)
    load.join()
    acknowledged = list(load.acknowledged)
    assert len(acknowledged) >= ACKNOWLEDGED_BEFORE_KILL
    assert any(path.name.endswith(("|w=0.log", "|w=1.log", "kill.log")) for path in server.log_files())

    restarted = run_server(config(workers))  # rotates what the killed one left in live files
    assert restarted.stop() == 0
    assert all(parse_log_name(p.name).rotated_at for p in restarted.log_files())  # type: ignore[union-attr]
    written = collections.Counter(logged_numbers(restarted))
    queued = collections.Counter(e["n"] for e in restarted.queued_events("live"))
    lost = [n for n in acknowledged if written[n] == 0 or queued[n] == 0]
    duplicated = [n for n in acknowledged if written[n] > 1 or queued[n] > 1]
    assert not lost, f"{len(lost)} acknowledged events lost, e.g. {lost[:5]}"
    assert not duplicated, f"{len(duplicated)} events written twice, e.g. {duplicated[:5]}"
    figure(
        f"{'2 workers' if workers == 2 else '1 process'}, {THREADS} connections: acknowledged "
        f"{len(acknowledged):,} before kill -9, lost {len(lost)}, duplicated {len(duplicated)} "
        f"(incoming logs and stream queue; {sum(written.values()) - len(acknowledged)} more written but unanswered)"
    )
