"""Helpers the batch benchmarks share: generated incoming logs and a minimal config around them.

Scripts import it as `common` (they put bench/ on sys.path, as for `generate`).
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from eventspark.config import LoadedConfig
from eventspark.config.loading import validate_config
from eventspark.logs.incoming import rotated_log_name
from generate import generate_events

EVENTS_PER_FILE = 250_000


def generate_logs(folder: Path, n: int, seed: int, events_per_file: int = EVENTS_PER_FILE) -> list[Path]:
    """Writes `n` events as rotated-log-sized files; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    out = None
    for i, event in enumerate(generate_events(n, seed=seed)):
        if i % events_per_file == 0:
            if out is not None:
                out.close()
            paths.append(folder / f"part-{len(paths):04d}.log")
            out = paths[-1].open("wb")
        assert out is not None
        out.write(orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE))
    if out is not None:
        out.close()
    return paths


def stage_as_rotated(files: list[Path], incoming: Path) -> None:
    """Hard-links `files` into `incoming` under rotated-log names, one second apart, in order."""
    incoming.mkdir(parents=True, exist_ok=True)
    at = datetime(2026, 11, 1, tzinfo=UTC)
    for i, path in enumerate(files):
        os.link(path, incoming / rotated_log_name("bench", at + timedelta(seconds=i)))


def bench_config(root: Path, master: str, destinations: dict[str, Any]) -> LoadedConfig:
    """A config with one API key, the event logs under `root` and the given destinations."""
    raw = {
        "api_keys": [{"id": "bench", "client_secret": "bench-token", "server_secret": "bench-s2s"}],
        "log": {"path": str(root / "events")},
        "destinations": destinations,
        "spark": {"master": master},
    }
    return LoadedConfig(config=validate_config(raw))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
