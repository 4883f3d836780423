"""S3 for the tests: moto's server (`moto[server]`, a dev dependency) on a free loopback port, once
per session; the real boto3 client talks to it. ../shared/emulators.md section 4 lists what was
verified (buckets, puts, ranged gets, multipart, listing, deletes).

`moto_s3` gives the endpoint URL; `s3_bucket` a fresh bucket per test (moto checks bucket names:
3-63 lower-case characters).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

S3_KEY_ID, S3_SECRET, S3_REGION = "testing", "testing", "us-east-1"
"""moto accepts any keys; these are what the tests configure."""


def _moto_server() -> str:
    """The `moto_server` entry point of the interpreter running the tests."""
    beside = Path(sys.executable).parent / "moto_server"
    found = str(beside) if beside.exists() else shutil.which("moto_server")
    if found is None:
        pytest.fail("moto_server is not installed: pip install -e '.[dev]' (it installs moto[server])", pytrace=False)
    return found


def _free_port() -> int:
    from tests.destinations.conftest import free_port

    return free_port()


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The endpoint URL (`http://127.0.0.1:PORT`) of a moto S3 server running for the session."""
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": S3_KEY_ID, "AWS_SECRET_ACCESS_KEY": S3_SECRET}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [_moto_server(), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(endpoint, process, log)
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _wait_until_up(endpoint: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"moto_server exited ({process.returncode}): {log.read_text(errors='replace')}", pytrace=False)
        try:
            httpx.get(f"{endpoint}/moto-api/", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    pytest.fail(f"moto_server did not answer on {endpoint} within {timeout} s", pytrace=False)


def s3_client(endpoint: str) -> Any:
    """A boto3 S3 client of the test server."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_KEY_ID,
        aws_secret_access_key=S3_SECRET,
        region_name=S3_REGION,
    )


@pytest.fixture
def s3_bucket(moto_s3: str) -> str:
    """A fresh, empty bucket on the session's moto server."""
    name = f"es-test-{uuid.uuid4().hex[:12]}"
    s3_client(moto_s3).create_bucket(Bucket=name)
    return name
