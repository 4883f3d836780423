"""Collector throughput: eventspark against a minimal baseline app, same server, same load, same run.

    .venv/bin/python bench/ingest.py [--duration 10] [--connections 50] [--rounds 2]

Starts `eventspark serve` on a temporary config (one token, one batch destination) and a
baseline ASGI app under the same uvicorn settings (uvloop, httptools, no access log) that parses
the body with orjson and appends it as a line with `os.write`; re-serialising is the least a
collector must do, since a body may contain newlines. Both get the same POST of a ~40-leaf web
event at `--connections` connections from wrk (installed with apt-get when missing), or from a
built-in asyncio load generator when wrk cannot be had. Rounds alternate baseline/eventspark and
the best round of each is kept. Prints req/s, p50/p99, RSS and the ratio eventspark/baseline;
exits non-zero when a target (ratio >= 0.9, p99 < 10 ms, RSS < 150 MB) is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
TOKEN = "bench-js-secret"
TARGET_RATIO, TARGET_P99_MS, TARGET_RSS_MB = 0.9, 10.0, 150.0
USER_AGENT = (
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/120.0.0.0 Safari/537.36"
)


def web_event() -> bytes:
    """A JS SDK page view with 40 leaves, as a browser sends it."""
    event = {
        "event_id": "l2k4j5h6g7f8",
        "event_type": "pageview",
        "src": "jitsu",
        "api_key": TOKEN,
        "user": {"anonymous_id": "a8c2e7f1b3", "id": "u-1029", "email": "ann@example.com"},
        "ids": {"ga": "GA1.1.1.2", "fbp": "fb.1.1.2"},
        "user_agent": USER_AGENT,
        "utc_time": "2024-05-01T12:00:00.000000Z",
        "local_tz_offset": -120,
        "referer": "https://google.com/",
        "url": "https://shop.example.com/p/42?utm_source=news",
        "page_title": "Product 42",
        "doc_path": "/p/42",
        "doc_host": "shop.example.com",
        "doc_search": "?utm_source=news",
        "screen_resolution": "1920x1080",
        "vp_size": "1280x720",
        "user_language": "en-US",
        "doc_encoding": "UTF-8",
        "utm": {"source": "news", "medium": "email", "campaign": "may", "term": "", "content": "a"},
        "click_id": {"gclid": "x1"},
        "event_data": {
            "product": {"id": 42, "name": "Shoe", "price": 59.9, "currency": "EUR", "tags": ["red", "new"]},
            "cart": {"items": 2, "total": 119.8},
            "consent": True,
            "experiment": "b",
        },
    }
    return orjson.dumps(event)


BASELINE_APP = """
import os, sys, orjson, uvicorn
from eventspark.collector.server import uvicorn_config
from eventspark.config.models import Config

class Baseline:
    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        os.write(self.fd, orjson.dumps(orjson.loads(body), option=orjson.OPT_APPEND_NEWLINE))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"15")]})
        await send({"type": "http.response.body", "body": b'{"status":"ok"}'})

if __name__ == "__main__":
    # The same uvicorn settings as `eventspark serve`.
    config = Config.model_validate({"server": {"host": "127.0.0.1", "port": int(sys.argv[2])}})
    uvicorn.Server(uvicorn_config(Baseline(sys.argv[1]), config)).run()
"""


# --- servers --------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_eventspark(work: Path, port: int) -> subprocess.Popen[bytes]:
    config = {
        "server": {"host": "127.0.0.1", "port": port},
        "api_keys": [{"id": "bench", "client_secret": TOKEN, "server_secret": "bench-s2s"}],
        "log": {"path": str(work / "events"), "rotation_min": 1},
        "destinations": {"warehouse": {"type": "duckdb"}},
    }
    path = work / "eventspark.json"
    path.write_bytes(orjson.dumps(config))
    return subprocess.Popen([str(VENV_BIN / "eventspark"), "serve", "-c", str(path)], **_quiet())


def start_baseline(work: Path, port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-c", BASELINE_APP, str(work / "baseline.log"), str(port)]
    return subprocess.Popen(command, **_quiet())


def _quiet() -> dict[str, object]:
    return {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "start_new_session": True}


def wait_ready(port: int, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server on port {port} did not start in {timeout} s")


def rss_mb(pid: int) -> float:
    """Peak resident set size (VmHWM) of a process, in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else float("nan")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- load -----------------------------------------------------------------------------------------


@dataclass
class Result:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


def ensure_wrk() -> str | None:
    found = shutil.which("wrk")
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    print("wrk not found: installing it with apt-get", file=sys.stderr)
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "wrk"]):
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return shutil.which("wrk")


def run_wrk(wrk: str, url: str, body: bytes, connections: int, duration: int, work: Path) -> Result:
    script = work / "post.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {_lua_string(body)}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["User-Agent"] = "{USER_AGENT}"\n'
        'wrk.headers["Origin"] = "https://shop.example.com"\n'
    )
    command = [wrk, "-t1", f"-c{connections}", f"-d{duration}s", "--latency", "-s", str(script), url]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return Result(
        rps=float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        p50_ms=_wrk_latency(out, "50%"),
        p99_ms=_wrk_latency(out, "99%"),
        errors=_wrk_errors(out),
    )


def _lua_string(data: bytes) -> str:
    return "[==[" + data.decode() + "]==]"


def _wrk_latency(out: str, label: str) -> float:
    value, unit = re.search(rf"^\s+{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def _wrk_errors(out: str) -> int:
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return errors + (int(non_2xx.group(1)) if non_2xx else 0)


async def _async_load(port: int, path: str, body: bytes, connections: int, duration: float) -> Result:
    """Fallback load generator: keep-alive HTTP/1.1 POSTs, one coroutine per connection."""
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"User-Agent: {USER_AGENT}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + duration

    async def connection() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
                await reader.readexactly(length)
                latencies.append(time.perf_counter() - started)
                errors += not head.startswith(b"HTTP/1.1 200")
        finally:
            writer.close()
            await writer.wait_closed()

    await asyncio.gather(*(connection() for _ in range(connections)))
    latencies.sort()
    return Result(
        rps=len(latencies) / duration,
        p50_ms=latencies[len(latencies) // 2] * 1000,
        p99_ms=latencies[int(len(latencies) * 0.99)] * 1000,
        errors=errors,
    )


def load(wrk: str | None, port: int, body: bytes, args: argparse.Namespace, work: Path) -> Result:
    path = f"/api/v1/event?token={TOKEN}"
    if wrk is not None:
        return run_wrk(wrk, f"http://127.0.0.1:{port}{path}", body, args.connections, args.duration, work)
    return asyncio.run(_async_load(port, path, body, args.connections, args.duration))


# --- main -----------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per measured round")
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    wrk = ensure_wrk()
    body = web_event()
    print(
        f"load generator: {wrk or 'built-in asyncio'}; body {len(body)} bytes; {args.connections} connections"
    )
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        work = Path(tmp)
        results = measure(wrk, body, args, work)
        check_logs(work)
    return report(results)


def measure(
    wrk: str | None, body: bytes, args: argparse.Namespace, work: Path
) -> dict[str, tuple[Result, float]]:
    ports = {"baseline": free_port(), "eventspark": free_port()}
    servers = {
        "baseline": start_baseline(work, ports["baseline"]),
        "eventspark": start_eventspark(work, ports["eventspark"]),
    }
    best: dict[str, Result] = {}
    try:
        for name, process in servers.items():
            wait_ready(ports[name], process)
            quick = argparse.Namespace(connections=args.connections, duration=2)
            load(wrk, ports[name], body, quick, work)  # warm-up
        for _ in range(args.rounds):
            for name in servers:
                result = load(wrk, ports[name], body, args, work)
                if name not in best or result.rps > best[name].rps:
                    best[name] = result
        return {name: (best[name], rss_mb(servers[name].pid)) for name in servers}
    finally:
        for process in servers.values():
            stop(process)


def check_logs(work: Path) -> None:
    """Sanity: eventspark wrote (and rotated on shutdown) one line per accepted event."""
    rotated = list((work / "events" / "incoming").glob("incoming.tok=bench-*.log"))
    lines = sum(path.read_bytes().count(b"\n") for path in rotated)
    print(f"eventspark wrote {lines} events to {len(rotated)} rotated log(s)")


def report(results: dict[str, tuple[Result, float]]) -> int:
    print(f"{'server':<12}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'RSS MB':>9}{'errors':>8}")
    for name, (r, rss) in results.items():
        print(f"{name:<12}{r.rps:>10.0f}{r.p50_ms:>9.2f}{r.p99_ms:>9.2f}{rss:>9.1f}{r.errors:>8}")
    ours, rss = results["eventspark"]
    ratio = ours.rps / results["baseline"][0].rps
    checks = {
        f"ratio {ratio:.3f} >= {TARGET_RATIO}": ratio >= TARGET_RATIO,
        f"p99 {ours.p99_ms:.2f} ms < {TARGET_P99_MS} ms": ours.p99_ms < TARGET_P99_MS,
        f"RSS {rss:.1f} MB < {TARGET_RSS_MB} MB": rss < TARGET_RSS_MB,
        f"errors {ours.errors} == 0": ours.errors == 0,
    }
    for text, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
