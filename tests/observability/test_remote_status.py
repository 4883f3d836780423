"""`eventspark status` with `log.remote`: the logs waiting on the store (moto's S3 server) beside
this node's local logs not uploaded yet, and a store that never answers (a black-holed port)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventspark.config import load_config
from eventspark.logs.incoming import rotated_log_name
from eventspark.logs.remote import remote_filesystem
from eventspark.logs.status import PairStatus, status_to_json
from tests.collector.conftest import EVENTSPARK
from tests.emulators.s3 import S3_KEY_ID, S3_REGION, S3_SECRET

pytestmark = pytest.mark.timeout(120)

AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LINE = b'{"n": 1, "_timestamp": "2026-03-01T12:00:00.000000Z"}\n'


def write_config(tmp_path: Path, endpoint: str, bucket: str) -> Path:
    options = {
        "key": S3_KEY_ID,
        "secret": S3_SECRET,
        "client_kwargs": {"endpoint_url": endpoint, "region_name": S3_REGION},
    }
    raw = {
        "server": {"name": "node-a"},
        "api_keys": [{"id": "web", "client_secret": "js"}, {"id": "app", "server_secret": "s2s"}],
        "log": {
            "path": str(tmp_path / "events"),
            "remote": {"url": f"s3://{bucket}/events", "storage_options": options},
        },
        "coordination": {"type": "inmemory"},  # one node
        "destinations": {
            "dw": {"type": "duckdb", "duckdb": {"path": "w.duckdb"}},
            "web_only": {"type": "duckdb", "duckdb": {"path": "v.duckdb"}, "only_tokens": ["web"]},
            "live": {"type": "duckdb", "mode": "stream", "duckdb": {"path": "s.duckdb"}},
        },
    }
    path = tmp_path / "eventspark.json"
    path.write_bytes(orjson.dumps(raw))
    return path


def put(config: Path, key: str, data: bytes) -> None:
    remote = load_config(config).config.log.remote
    assert remote is not None
    fs, root = remote_filesystem(remote)
    fs.pipe_file(f"{root}/{key}", data)


def status(config: Path, *options: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    found = subprocess.run(
        [str(EVENTSPARK), "status", "-c", str(config), *options], capture_output=True, text=True, timeout=90
    )
    assert found.returncode == 0, found.stderr
    return found, time.monotonic() - started


def test_status_counts_the_store_and_the_logs_not_uploaded(moto_s3: str, s3_bucket: str, tmp_path: Path) -> None:
    config = write_config(tmp_path, moto_s3, s3_bucket)
    # On the store: a web log nobody loaded (3 lines), an app log loaded by dw, a web log loaded by
    # dw only, and a stray object (ignored, as the pass ignores it).
    waiting = rotated_log_name("web", AT, node="node-b")
    loaded = rotated_log_name("app", AT, node="node-b")
    half = rotated_log_name("web", AT.replace(minute=5), node="node-a")
    put(config, f"incoming/{waiting}", LINE * 3)
    put(config, f"incoming/{loaded}", LINE * 2)
    put(config, f"incoming/{half}", LINE)
    done = orjson.dumps(status_to_json({"dw": {"events": PairStatus(True)}}))
    put(config, f"incoming/{loaded}.status", done)
    put(config, f"incoming/{half}.status", done)
    put(config, "incoming/notes.txt", b"not a log")
    # This node's rotated log, not uploaded yet.
    local = tmp_path / "events" / "incoming" / rotated_log_name("web", AT.replace(minute=9))
    local.parent.mkdir(parents=True)
    local.write_bytes(LINE * 4)

    document = orjson.loads(status(config, "--json")[0].stdout)
    size = len(LINE)
    assert document["store"] == {
        "url": f"s3://{s3_bucket}/events",
        "destinations": {
            "dw": {"pending_logs": 1, "pending_bytes": 3 * size},
            "web_only": {"pending_logs": 2, "pending_bytes": 4 * size},
        },
        "held_logs": [],
    }
    by_id = {entry["destination"]: entry for entry in document["destinations"]}
    assert by_id["dw"]["pending_logs"] == 1 and by_id["dw"]["pending_log_events"] == 4  # local only

    lines = {line.split("\t")[0]: line.split("\t") for line in status(config)[0].stdout.splitlines()}
    assert "store_logs=1" in lines["dw"] and f"store_bytes={3 * size}" in lines["dw"]
    assert "store_logs=2" in lines["web_only"]
    assert not any(field.startswith("store") for field in lines["live"])  # a stream destination


@pytest.fixture
def black_hole() -> Iterator[str]:
    """An endpoint that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


def test_a_store_that_never_answers_is_named_within_the_timeout(black_hole: str, tmp_path: Path) -> None:
    config = write_config(tmp_path, black_hole, "es-black-hole")
    found, took = status(config, "--store-timeout", "2")
    assert "store unreachable: no answer from s3://es-black-hole/events within 2 s" in found.stderr
    lines = {line.split("\t")[0]: line.split("\t") for line in found.stdout.splitlines()}
    assert "store=unreachable" in lines["dw"] and set(lines) == {"dw", "web_only", "live"}
    assert took < 30, took  # start-up, 2 s of waiting, and an exit that does not wait for the store
    document: dict[str, Any] = orjson.loads(status(config, "--json", "--store-timeout", "1")[0].stdout)
    assert document["store"]["error"].startswith("store unreachable: no answer")
