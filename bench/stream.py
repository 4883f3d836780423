"""Stream mode into the machine's Postgres: latency at a fixed rate, and the highest sustained rate.

    .venv/bin/python bench/stream.py [--rate 100] [--seconds 20] [--events 60000] [--baseline-events 3000]

(a) Latency: a collector (the `serve` ASGI app under uvicorn) and the stream workers run in a
    child process; this process POSTs ~40-leaf web events to `/api/v1/event` at `--rate` per
    second, one connection, and a poller thread watches the table. Latency = from the HTTP 200 to
    the first poll that sees the row (polls every 1 ms). Targets: p50 < 50 ms, p99 < 250 ms.
(b) Throughput: `--events` events are queued, then one worker delivers them; the rate is events
    over the time until the queue is drained (queue reads, chain, inserts, archive, acks). The
    baseline is the same worker whose adapter runs one INSERT (and one transaction) per event, as
    EventNative's stream mode does, over `--baseline-events` events in the same run. Target: ratio >= 10.

Each part uses a fresh schema in database `test` (127.0.0.1:5432, trust), dropped at the end.
Exits non-zero when a target is missed.
"""

from __future__ import annotations

import argparse
import http.client
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "bench")]

from eventspark.config import LoadedConfig, load_config  # noqa: E402
from eventspark.coordination import MemoryCoordination  # noqa: E402
from eventspark.stream.manager import StreamWorkers  # noqa: E402
from eventspark.stream.queue import QueueWriter, queue_dir  # noqa: E402
from eventspark.stream.worker import StreamSettings  # noqa: E402
from generate import generate_events  # noqa: E402

CONNINFO = "host=127.0.0.1 port=5432 dbname=test user=postgres"
TOKEN = "bench-js"
TARGET_P50_MS, TARGET_P99_MS, TARGET_RATIO = 50.0, 250.0, 10.0


def write_config(root: Path, schema: str, port: int) -> Path:
    raw = {
        "server": {"port": port, "host": "127.0.0.1"},
        "api_keys": [{"id": "bench", "client_secret": TOKEN, "server_secret": "bench-s2s"}],
        "log": {"path": str(root / "events")},
        "destinations": {
            "pg": {
                "type": "postgres",
                "mode": "stream",
                "datasource": {
                    "host": "127.0.0.1",
                    "port": 5432,
                    "db": "test",
                    "schema": schema,
                    "username": "postgres",
                },
                "data_layout": {"table_name_template": "events", "primary_key_fields": ["eventn_ctx_event_id"]},
            }
        },
    }
    path = root / "eventspark.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def drop_schema(schema: str) -> None:
    with psycopg.connect(CONNINFO, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# --- (a) latency ----------------------------------------------------------------------------------


def serve(config_path: str) -> None:
    """The child process: `eventspark serve`, collector and stream workers."""
    from eventspark.collector.server import run_server
    from eventspark.node import NodeServices

    logging.basicConfig(level=logging.WARNING, format="serve: %(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("eventspark.stream").setLevel(logging.INFO)
    loaded = load_config(config_path)
    run_server(loaded, NodeServices(loaded))


class Poller(threading.Thread):
    """Stamps the time each `seq` first becomes visible in the table."""

    def __init__(self, schema: str) -> None:
        super().__init__(daemon=True)
        self.schema = schema
        self.seen: dict[int, float] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        with psycopg.connect(CONNINFO, autocommit=True) as conn:
            last = -1
            while not self.halt.is_set():
                try:
                    rows = conn.execute(f'SELECT seq FROM "{self.schema}".events WHERE seq > %s', (last,)).fetchall()
                except psycopg.errors.UndefinedTable:
                    rows = []
                now = time.perf_counter()
                for (seq,) in rows:
                    self.seen.setdefault(seq, now)
                    last = max(last, seq)
                time.sleep(0.001)


def measure_latency(rate: float, seconds: float) -> tuple[float, float, int]:
    schema = f"bench_stream_{uuid.uuid4().hex[:8]}"
    port = _free_port()
    events = list(generate_events(int(rate * seconds) + 50, seed=7))
    with tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp:
        config = write_config(Path(tmp), schema, port)
        child = subprocess.Popen([sys.executable, __file__, "--serve", str(config)], cwd=ROOT)
        poller = Poller(schema)
        try:
            conn = _connect(port)
            acked = _send(conn, events[:50], 0, rate)  # warm-up: table creation, first connections
            time.sleep(1.0)
            poller.start()
            acked = _send(conn, events[50:], 50, rate)
            deadline = time.perf_counter() + 10
            while not acked.keys() <= poller.seen.keys() and time.perf_counter() < deadline:
                time.sleep(0.01)
        finally:
            poller.halt.set()
            child.send_signal(signal.SIGTERM)
            child.wait(30)
            drop_schema(schema)
    latencies = sorted(poller.seen[s] - t for s, t in acked.items() if s in poller.seen)
    missing = len(acked) - len(latencies)
    return _pct(latencies, 0.5) * 1000, _pct(latencies, 0.99) * 1000, missing


def _send(conn: http.client.HTTPConnection, events: list[dict[str, Any]], first: int, rate: float) -> dict[int, float]:
    acked: dict[int, float] = {}
    start = time.perf_counter()
    for i, event in enumerate(events):
        seq = first + i
        time.sleep(max(0.0, start + i / rate - time.perf_counter()))
        body = orjson.dumps({**event, "seq": seq})
        conn.request("POST", f"/api/v1/event?token={TOKEN}", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        if response.status == 200:
            acked[seq] = time.perf_counter()
    return acked


def _connect(port: int) -> http.client.HTTPConnection:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))] if values else float("nan")


# --- (b) throughput -------------------------------------------------------------------------------


class OneInsertPerEvent:
    """The baseline's adapter: every row is its own INSERT statement and transaction."""

    def __init__(self, adapter: Any) -> None:
        self._adapter = adapter

    def insert(self, table: Any, rows: Any) -> None:
        for row in rows:
            self._adapter.insert(table, [row])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._adapter, name)


def measure_throughput(count: int, one_insert_per_event: bool) -> float:
    """Events per second one worker delivers from a queue holding `count` events."""
    schema = f"bench_stream_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp:
        loaded = load_config(write_config(Path(tmp), schema, _free_port()))
        settings = StreamSettings(batch_events=1000, batch_wait_ms=20)
        worker = StreamWorkers(loaded, MemoryCoordination("bench"), settings).build(
            "pg", loaded.config.destinations["pg"]
        )
        if one_insert_per_event:
            worker.delivery.adapter = OneInsertPerEvent(worker.delivery.adapter)  # type: ignore[assignment]
        worker.open()
        try:
            # Warm-up: the table is created and the lookups' parsers are built before timing.
            _enqueue(loaded, 200, seed=1, writer=1)
            while worker.run_once() is not None:
                pass
            _enqueue(loaded, count, seed=11, writer=2)
            started = time.perf_counter()
            while worker.delivered + worker.failed < count + 200:
                worker.run_once()
            elapsed = time.perf_counter() - started
            assert worker.failed == 0, f"{worker.failed} events failed"
        finally:
            worker.close()
            drop_schema(schema)
    return count / elapsed


def _enqueue(loaded: LoadedConfig, count: int, seed: int, writer: int) -> None:
    queue = QueueWriter(queue_dir(Path(loaded.config.log.path), "pg"), worker=writer)
    events = generate_events(count, seed=seed)
    for chunk_start in range(0, count, 1000):
        chunk = [next(events) for _ in range(min(1000, count - chunk_start))]
        queue.append(b"".join(orjson.dumps(e) + b"\n" for e in chunk), len(chunk))
    queue.close()


# --- main -----------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=100.0, help="events per second for the latency run")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the latency run")
    parser.add_argument("--events", type=int, default=60000, help="events for the micro-batch throughput run")
    parser.add_argument("--baseline-events", type=int, default=3000, help="events for the baseline run")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    p50, p99, missing = measure_latency(args.rate, args.seconds)
    print(
        f"(a) latency HTTP 200 -> row visible at {args.rate:.0f} events/s: p50 {p50:.1f} ms, p99 {p99:.1f} ms"
        f"{f', {missing} never seen' if missing else ''}"
    )
    baseline = measure_throughput(args.baseline_events, one_insert_per_event=True)
    batched = measure_throughput(args.events, one_insert_per_event=False)
    ratio = batched / baseline
    print(
        f"(b) one INSERT per event: {baseline:,.0f} events/s; micro-batches of up to 1,000: "
        f"{batched:,.0f} events/s; ratio {ratio:.1f}x"
    )
    ok = p50 < TARGET_P50_MS and p99 < TARGET_P99_MS and ratio >= TARGET_RATIO and not missing
    print(
        "targets:",
        "met" if ok else "MISSED",
        f"(p50 < {TARGET_P50_MS:.0f} ms, p99 < {TARGET_P99_MS:.0f} ms, ratio >= {TARGET_RATIO:.0f}x)",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
