"""Starting `eventspark serve` as a subprocess on a free port, and reading what it wrote."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from eventspark.stream.segments import MAGIC, parse_records
from tests.shared_data import eventnative_data

EVENTSPARK = Path(sys.executable).parent / "eventspark"
TESTDATA = eventnative_data()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@dataclass
class Server:
    """A running `eventspark serve` and its directories."""

    process: subprocess.Popen[bytes]
    url: str
    events_dir: Path
    output: Path
    offsets: dict[Path, int] = field(default_factory=dict)

    @property
    def incoming(self) -> Path:
        return self.events_dir / "incoming"

    def log_files(self, directory: Path | None = None) -> list[Path]:
        directory = directory or self.incoming
        return sorted(p for p in directory.glob("*.log")) if directory.is_dir() else []

    def mark(self) -> None:
        """Remembers where every log ends, for `new_events`."""
        self.offsets = {p: p.stat().st_size for p in self.log_files()}
        for queue in self.events_dir.glob("queue.dst=*"):
            self.offsets.update({p: p.stat().st_size for p in self.log_files(queue)})

    def new_lines(self, directory: Path | None = None) -> list[bytes]:
        lines = []
        for path in self.log_files(directory):
            data = path.read_bytes()[self.offsets.get(path, 0) :]
            lines.extend(data.splitlines())
        return lines

    def new_events(self, directory: Path | None = None) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self.new_lines(directory)]

    def queued_events(self, dest_id: str) -> list[dict[str, Any]]:
        """Every event in the persistent queue of a stream destination (read from its segment files)."""
        records: list[bytes] = []
        for segment in sorted((self.events_dir / f"queue.dst={dest_id}").glob("*.dque")):
            parse_records(segment.read_bytes()[len(MAGIC) :], records, limit=1_000_000)
        return [orjson.loads(record) for record in records]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)

    def text(self) -> str:
        return self.output.read_text(errors="replace")


def write_config(directory: Path, config: dict[str, Any]) -> Path:
    path = directory / "eventspark.json"
    path.write_bytes(orjson.dumps(config))
    return path


def start_server(directory: Path, config: dict[str, Any] | None, port: int | None = None) -> Server:
    """`eventspark serve -c <config>` in `directory` (no -c when config is None); waits for /ping."""
    if config is not None:
        port = port or free_port()
        config = {**config, "server": {"host": "127.0.0.1", **config.get("server", {}), "port": port}}
        config.setdefault("log", {}).setdefault("path", str(directory / "events"))
        args = ["-c", str(write_config(directory, config))]
        events_dir = Path(config["log"]["path"])
    else:
        args, events_dir = [], directory / "events"
    output = directory / f"serve-{time.monotonic_ns()}.out"
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [str(EVENTSPARK), "serve", *args], cwd=directory, stdout=sink, stderr=subprocess.STDOUT
        )
    server = Server(process, f"http://127.0.0.1:{port or 8001}", events_dir, output)
    wait_ready(server)
    return server


def wait_ready(server: Server, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"eventspark serve exited with {server.process.returncode}:\n{server.text()}")
        try:
            if httpx.get(f"{server.url}/ping", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"eventspark serve did not answer /ping in {timeout} s:\n{server.text()}")


@pytest.fixture
def run_server(tmp_path: Path) -> Iterator[Any]:
    """Starts servers for one test and makes sure none outlives it."""
    started: list[Server] = []

    def run(config: dict[str, Any] | None, port: int | None = None) -> Server:
        server = start_server(tmp_path, config, port)
        started.append(server)
        return server

    yield run
    kill_all(started)


def kill_all(servers: list[Server]) -> None:
    """SIGKILLs the servers still running (fixtures' teardown: a test's own stop came first)."""
    for server in servers:
        if server.process.poll() is None:
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait()


def child_pids(parent: int) -> list[int]:
    """The processes whose parent is `parent` (a serving process's collector workers)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


def post_numbered(client: httpx.Client, kind: int, ids: list[int], js: str, s2s: str, pad: str) -> int:
    """Posts events `{"n": id, "pad": pad}` (load of the fault tests); the status. `kind` 0: one
    event to the JS endpoint (token `js`), 1: one to the s2s endpoint, 2: all `ids` as a bulk upload."""
    if kind == 0:
        return client.post(f"/api/v1/event?token={js}", json={"n": ids[0], "pad": pad}).status_code
    if kind == 1:
        headers = {"X-Auth-Token": s2s}
        return client.post("/api/v1/s2s/event", json={"n": ids[0], "pad": pad}, headers=headers).status_code
    body = b"".join(orjson.dumps({"n": n, "pad": pad}) + b"\n" for n in ids)
    return client.post(f"/api/v1/events/bulk?token={s2s}", content=body).status_code


def logged_numbers(server: Server) -> list[int]:
    """The `n` of every line of every incoming log (a torn line fails the parse)."""
    return [orjson.loads(line)["n"] for path in server.log_files() for line in path.read_bytes().splitlines()]


def fixture_json(name: str) -> Any:
    return orjson.loads((TESTDATA / name).read_bytes())
