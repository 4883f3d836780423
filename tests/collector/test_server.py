"""`eventspark serve` as a process: rotation, embedded defaults, shutdown, crashes, workers."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from eventspark.logs.incoming import parse_log_name
from tests.collector.conftest import child_pids, port_is_free

TOKEN = "tok-secret"
BASE: dict[str, Any] = {
    "api_keys": [{"id": "tok", "client_secret": TOKEN, "server_secret": "tok-s2s"}],
    "destinations": {"dw": {"type": "duckdb"}},
}


def config(**sections: Any) -> dict[str, Any]:
    merged = {**BASE, **sections}
    merged["log"] = {"rotation_min": 60, **sections.get("log", {})}
    return merged


def send(url: str, count: int, token: str = TOKEN, start: int = 0) -> list[int]:
    """Posts events `n = start..start+count-1`; returns the n of those answered 200."""
    acknowledged = []
    with httpx.Client(base_url=url, timeout=10) as client:
        for n in range(start, start + count):
            if client.post(f"/api/v1/event?token={token}", json={"n": n}).status_code == 200:
                acknowledged.append(n)
    return acknowledged


def logged(incoming: Path) -> list[dict[str, Any]]:
    """Every event in every incoming log (live and rotated); a partial line fails the parse."""
    return [orjson.loads(line) for path in sorted(incoming.glob("*.log")) for line in path.read_bytes().splitlines()]


def rotated_files(incoming: Path) -> list[Path]:
    return [p for p in sorted(incoming.glob("*.log")) if (n := parse_log_name(p.name)) and n.rotated_at]


def test_rotation_every_rotation_min(run_server: Any) -> None:
    server = run_server(config(log={"rotation_min": 0.01}))  # 0.6 s
    assert send(server.url, 3) == [0, 1, 2]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # a period may end between two posts: one rotated log or two
        rotated = rotated_files(server.incoming)
        if sum(len(path.read_bytes().splitlines()) for path in rotated) == 3:
            break
        time.sleep(0.1)
    assert rotated and len(rotated) <= 2, rotated
    for path in rotated:
        assert re.fullmatch(r"incoming\.tok=tok-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d{3}\.log", path.name)
    assert [e["n"] for e in logged(server.incoming)] == [0, 1, 2]
    time.sleep(1.5)  # further periods with nothing written rotate nothing
    assert rotated_files(server.incoming) == rotated
    assert not (server.incoming / "incoming.tok=tok.log").exists()
    assert server.stop() == 0


def test_sigterm_rotates_every_acknowledged_event(run_server: Any) -> None:
    server = run_server(config())
    acknowledged = send(server.url, 200)
    assert len(acknowledged) == 200
    assert server.stop(signal.SIGTERM) == 0
    [rotated] = rotated_files(server.incoming)
    assert [e["n"] for e in logged(server.incoming)] == acknowledged
    assert rotated.name.startswith("incoming.tok=tok-")
    assert "rotated 1 incoming log" in server.text()


# kill -9 under load: tests/faults/test_collector_kill.py


def test_restart_rotates_what_a_crash_left(run_server: Any, tmp_path: Path) -> None:
    first = run_server(config())
    send(first.url, 5)
    first.stop(signal.SIGKILL)
    assert (first.incoming / "incoming.tok=tok.log").exists()
    second = run_server(config())
    [rotated] = rotated_files(second.incoming)
    assert [e["n"] for e in logged(second.incoming)] == [0, 1, 2, 3, 4]
    assert rotated.read_bytes().count(b"\n") == 5
    second.stop()


def test_second_server_on_the_same_directory_refuses_to_start(run_server: Any, tmp_path: Path) -> None:
    run_server(config())
    with pytest.raises(RuntimeError, match="another eventspark server writes"):
        run_server(config())


def test_embedded_defaults(run_server: Any, tmp_path: Path) -> None:
    if not port_is_free(8001):
        pytest.skip("port 8001, the embedded default, is in use on this machine")
    server = run_server(None)
    match = re.search(r"generated one: (\S+)", server.text())
    assert match, server.text()
    token = match.group(1)
    assert send(server.url, 2, token=token) == [0, 1]
    assert server.stop() == 0
    incoming = tmp_path / "events" / "incoming"
    [rotated] = rotated_files(incoming)
    assert [e["api_key"] for e in logged(incoming)] == [token, token]
    assert parse_log_name(rotated.name).token_id  # type: ignore[union-attr]


def test_workers_write_their_own_files(run_server: Any) -> None:
    server = run_server(config(server={"workers": 2}))
    acknowledged = []
    for n in range(30):  # a new connection per request so that both workers get some
        with httpx.Client(base_url=server.url, timeout=10) as client:
            if client.post(f"/api/v1/event?token={TOKEN}", json={"n": n}).status_code == 200:
                acknowledged.append(n)
    assert server.stop() == 0
    files = rotated_files(server.incoming)
    workers = {parse_log_name(p.name).worker for p in files}  # type: ignore[union-attr]
    assert workers and workers <= {0, 1}
    assert all("|w=" in p.name for p in files)
    assert sorted(e["n"] for e in logged(server.incoming)) == acknowledged == list(range(30))


def test_sigterm_right_after_start_with_workers_exits_0(run_server: Any) -> None:
    # Workers answer /ping while the serving process still starts its background services: a
    # SIGTERM then used to kill it (exit -15) before it forwarded signals to the workers.
    live = {"type": "postgres", "mode": "stream", "datasource": {"host": "127.0.0.1", "port": 1, "db": "x"}}
    destinations = {**BASE["destinations"], "live": live}  # a stream worker to start in the background
    for _ in range(3):
        server = run_server(config(server={"workers": 2}, destinations=destinations, log={"uploader_period_sec": 3600}))
        assert server.stop(signal.SIGTERM) == 0, server.text()


def test_fsync_mode_answers_after_group_commit(run_server: Any) -> None:
    server = run_server(config(server={"fsync": True}))
    assert send(server.url, 20) == list(range(20))
    assert server.stop() == 0
    assert [e["n"] for e in logged(server.incoming)] == list(range(20))


def test_workers_stop_when_the_serving_process_is_killed(run_server: Any) -> None:
    # kill -9 of the parent must not leave workers taking events with nothing behind them.
    server = run_server(config(server={"workers": 2}))
    children = child_pids(server.process.pid)
    assert len(children) == 2
    server.process.kill()
    server.process.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(pid) for pid in children):
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in children)
    assert port_is_free(int(server.url.rsplit(":", 1)[1]))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
