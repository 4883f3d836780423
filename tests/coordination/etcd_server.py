"""A throw-away etcd for the tests, run through scripts/etcd.sh (which installs it if missing)."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "etcd.sh"
INSTALL_TIMEOUT_SECONDS = 600
START_TIMEOUT_SECONDS = 20


class EtcdNotInstallable(Exception):
    """etcd is missing and could not be installed here (the etcd tests fail with the reason)."""


def install_etcd() -> None:
    result = subprocess.run(
        ["bash", str(SCRIPT), "--install"],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_SECONDS,
        check=False,
    )
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise EtcdNotInstallable(f"could not install Debian's etcd-server with {SCRIPT}: {tail}")


class EtcdServer:
    """One etcd member on loopback with its data under `directory`; `start()` then `stop()`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.endpoint = ""
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        install_etcd()
        client_port, peer_port = _free_ports(2)
        self.endpoint = f"http://127.0.0.1:{client_port}"
        data_dir = self.directory / "data"
        log = (self.directory / "etcd.log").open("wb")
        self._process = subprocess.Popen(
            ["bash", str(SCRIPT), str(data_dir), str(client_port), str(peer_port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self._wait_until_healthy()

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    def _wait_until_healthy(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1) as answer:
                    if b'"true"' in answer.read():
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        log = (self.directory / "etcd.log").read_text(errors="replace")
        raise RuntimeError(f"etcd did not become healthy at {self.endpoint}; its log:\n{log[-2000:]}")


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
