"""Configs, events and a worker harness for the stream tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from eventspark.config import LoadedConfig, load_config
from eventspark.coordination import MemoryCoordination
from eventspark.stream.manager import StreamWorkers
from eventspark.stream.queue import QueueWriter, queue_dir
from eventspark.stream.worker import StreamSettings, StreamWorker

TOKENS = [{"id": "web", "client_secret": "web-js", "server_secret": "web-s2s"}]
KEY = "eventn_ctx_event_id"
FAST = StreamSettings(batch_wait_ms=20, retry_min_sec=0.2, retry_max_sec=1.0, poll_ms=5)


def make_config(root: Path, destinations: dict[str, Any], **extra: Any) -> LoadedConfig:
    """Writes a YAML config under `root` (events in `root/events`) and loads it like the CLI does."""
    raw = {"api_keys": TOKENS, "log": {"path": str(root / "events")}, "destinations": destinations, **extra}
    path = root / "eventspark.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def postgres_stream(datasource: dict[str, Any], template: str = "events", **layout: Any) -> dict[str, Any]:
    layout = {"table_name_template": template, "primary_key_fields": [KEY], **layout}
    return {"type": "postgres", "mode": "stream", "datasource": datasource, "data_layout": layout}


def duckdb_stream(path: Path, template: str = "events", **layout: Any) -> dict[str, Any]:
    layout = {"table_name_template": template, "primary_key_fields": [KEY], **layout}
    return {"type": "duckdb", "mode": "stream", "duckdb": {"path": str(path)}, "data_layout": layout}


def event(n: int, **fields: Any) -> dict[str, Any]:
    """A small enriched event with id `e<n>`."""
    return {
        "_timestamp": "2026-11-01T10:00:00.000000Z",
        "event_type": "pageview",
        "eventn_ctx": {"event_id": f"e{n:06d}"},
        "n": n,
        **fields,
    }


def line(value: dict[str, Any]) -> bytes:
    return orjson.dumps(value) + b"\n"


@dataclass
class Harness:
    """One stream destination's worker driven step by step, and a writer for its queue."""

    loaded: LoadedConfig
    dest_id: str
    worker: StreamWorker
    writer: QueueWriter

    @classmethod
    def build(cls, loaded: LoadedConfig, dest_id: str, settings: StreamSettings = FAST) -> Harness:
        workers = StreamWorkers(loaded, MemoryCoordination("test"), settings)
        worker = workers.build(dest_id, loaded.config.destinations[dest_id])
        worker.open()
        writer = QueueWriter(queue_dir(Path(loaded.config.log.path), dest_id))
        return cls(loaded, dest_id, worker, writer)

    @property
    def events_dir(self) -> Path:
        return Path(self.loaded.config.log.path)

    def append(self, *events: dict[str, Any]) -> None:
        self.writer.append(b"".join(line(e) for e in events), len(events))

    def drain(self) -> None:
        """Runs micro-batches until the queue is empty."""
        while self.worker.run_once() is not None:
            pass

    def failed(self) -> list[dict[str, Any]]:
        path = self.events_dir / "failed" / f"failed.dst={self.dest_id}.log"
        if not path.exists():
            return []
        return [orjson.loads(x) for x in path.read_bytes().splitlines()]

    def archived(self) -> list[dict[str, Any]]:
        path = self.events_dir / "archive" / f"streaming-archive.dst={self.dest_id}.log"
        if not path.exists():
            return []
        return [orjson.loads(x) for x in path.read_bytes().splitlines()]

    def close(self) -> None:
        self.writer.close()
        self.worker.close()
