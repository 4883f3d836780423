"""Object stores for the files family's tests: moto S3 (`tests/emulators/s3.py`, via the root
conftest) and fake-gcs-server, started here alone (the binary and the wait of
`tests/emulators/bigquery.py`, without the BigQuery emulator this family does not need)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.emulators.bigquery import _fake_gcs_binary, _wait_http


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The endpoint URL of a fake-gcs-server (filesystem backend) running for the session."""
    from tests.destinations.conftest import free_port

    root = tmp_path_factory.mktemp("fake-gcs")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with open(root / "fake-gcs.log", "wb") as log:
        process = subprocess.Popen(
            [
                str(_fake_gcs_binary()),
                *("-scheme", "http", "-host", "127.0.0.1", "-port", str(port)),
                *("-backend", "filesystem", "-filesystem-root", str(root / "data")),
                *("-external-url", endpoint, "-log-level", "error"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_http(f"{endpoint}/storage/v1/b", process, "fake-gcs-server")
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def gcs_client(endpoint: str) -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint})


@pytest.fixture
def gcs_bucket(fake_gcs: str) -> str:
    """A fresh, empty bucket on the session's fake-gcs-server."""
    name = f"es-test-{uuid.uuid4().hex[:12]}"
    gcs_client(fake_gcs).create_bucket(name)
    return name
