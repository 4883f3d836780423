"""Collector throughput: eventspark against a minimal baseline app, same server, same load, same run.

    .venv/bin/python bench/ingest.py [--duration 10] [--connections 50] [--rounds 3]

Starts `eventspark serve` on a temporary config (one token, one batch destination) and a
baseline ASGI app under the same uvicorn settings (`eventspark.collector.server.uvicorn_config`:
uvloop, httptools, no access log) that parses the body with orjson and appends it as a line
with `os.write`; re-serialising is the least a collector must do, since a body may contain
newlines. A third server, `base+enrich`, is the baseline plus `enrich_context`: the floor that
the mandatory ContextEnrichment step sets. All get the same POST of a 40-leaf web event, with a
browser's User-Agent and Origin, at `--connections` connections from wrk (installed with apt-get
when missing), or from a built-in asyncio load generator when wrk cannot be had. Rounds
alternate between the servers; per server the round with the best req/s is shown, with the
median server CPU time per request (steadier than req/s when other work shares the machine).
Exits non-zero when a target (req/s ratio >= 0.9, p99 < 10 ms, RSS < 150 MB, no errors) is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

VENV_BIN = Path(sys.executable).parent
TOKEN = "bench-js-secret"
TARGET_RATIO, TARGET_P99_MS, TARGET_RSS_MB = 0.9, 10.0, 150.0
USER_AGENT = (
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/120.0.0.0 Safari/537.36"
)
ORIGIN = "https://shop.example.com"


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
from datetime import UTC, datetime
from eventspark.collector.server import uvicorn_config
from eventspark.config.models import Config
from eventspark.steps.context import enrich_context

class Baseline:
    def __init__(self, path, enrich):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.enrich = enrich

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
        event = orjson.loads(body)
        if self.enrich:  # the floor: the baseline plus the one step every accepted event needs
            agent = dict(scope["headers"]).get(b"user-agent", b"").decode()
            enrich_context(event, token="t", source_ip=scope["client"][0], user_agent=agent,
                           server_side=False, now=datetime.now(UTC))
        os.write(self.fd, orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"15")]})
        await send({"type": "http.response.body", "body": b'{"status":"ok"}'})

if __name__ == "__main__":
    # The same uvicorn settings as `eventspark serve`.
    config = Config.model_validate({"server": {"host": "127.0.0.1", "port": int(sys.argv[2])}})
    app = Baseline(sys.argv[1], enrich=sys.argv[3] == "enrich")
    uvicorn.Server(uvicorn_config(app, config)).run()
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


def start_baseline(work: Path, port: int, mode: str = "plain") -> subprocess.Popen[bytes]:
    command = [sys.executable, "-c", BASELINE_APP, str(work / f"baseline-{mode}.log"), str(port), mode]
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """Peak resident set size (VmHWM) of a process, in MB."""
    match = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
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
    requests: int
    cpu_us: float = 0.0
    """Server CPU time (user + system) per request."""


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
        f"wrk.body = [==[{body.decode()}]==]\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["User-Agent"] = "{USER_AGENT}"\n'
        f'wrk.headers["Origin"] = "{ORIGIN}"\n'
    )
    command = [wrk, "-t1", f"-c{connections}", f"-d{duration}s", "--latency", "-s", str(script), url]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return Result(
        rps=float(_search(r"Requests/sec:\s+([\d.]+)", out)),
        p50_ms=_wrk_latency(out, "50%"),
        p99_ms=_wrk_latency(out, "99%"),
        errors=_wrk_errors(out),
        requests=int(_search(r"(\d+) requests in", out)),
    )


def _search(pattern: str, text: str) -> str:
    match = re.search(pattern, text, re.M)
    if match is None:
        raise RuntimeError(f"unexpected wrk output:\n{text}")
    return match.group(1)


def _wrk_latency(out: str, label: str) -> float:
    match = re.search(rf"^\s+{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    if match is None:
        raise RuntimeError(f"no {label} latency in wrk output:\n{out}")
    return float(match.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[match.group(2)]


def _wrk_errors(out: str) -> int:
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return errors + (int(non_2xx.group(1)) if non_2xx else 0)


async def _async_load(port: int, path: str, body: bytes, connections: int, duration: float) -> Result:
    """Fallback load generator: keep-alive HTTP/1.1 POSTs, one coroutine per connection."""
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"User-Agent: {USER_AGENT}\r\nOrigin: {ORIGIN}\r\nContent-Length: {len(body)}\r\n\r\n"
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
                length = re.search(rb"content-length: (\d+)", head, re.I)
                await reader.readexactly(int(length.group(1)) if length else 0)
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
        requests=len(latencies),
    )


def load(wrk: str | None, port: int, body: bytes, connections: int, duration: int, work: Path) -> Result:
    path = f"/api/v1/event?token={TOKEN}"
    if wrk is not None:
        return run_wrk(wrk, f"http://127.0.0.1:{port}{path}", body, connections, duration, work)
    return asyncio.run(_async_load(port, path, body, connections, duration))


# --- main -----------------------------------------------------------------------------------------


def measure(wrk: str | None, body: bytes, args: argparse.Namespace, work: Path) -> dict[str, tuple[Result, float]]:
    """Alternating rounds; per server the round with the best req/s, and the median CPU per request."""
    ports = {name: free_port() for name in ("baseline", "base+enrich", "eventspark")}
    servers = {
        "baseline": start_baseline(work, ports["baseline"]),
        "base+enrich": start_baseline(work, ports["base+enrich"], "enrich"),
        "eventspark": start_eventspark(work, ports["eventspark"]),
    }
    rounds: dict[str, list[Result]] = {name: [] for name in servers}
    try:
        for name, process in servers.items():
            wait_ready(ports[name], process)
            load(wrk, ports[name], body, args.connections, 2, work)  # warm-up
        for _ in range(args.rounds):
            for name, process in servers.items():
                before = cpu_seconds(process.pid)
                result = load(wrk, ports[name], body, args.connections, args.duration, work)
                result.cpu_us = (cpu_seconds(process.pid) - before) / max(result.requests, 1) * 1e6
                rounds[name].append(result)
        results = {}
        for name, process in servers.items():
            best = max(rounds[name], key=lambda r: r.rps)
            best.cpu_us = statistics.median(r.cpu_us for r in rounds[name])
            results[name] = (best, rss_mb(process.pid))
        return results
    finally:
        for process in servers.values():
            stop(process)


def check_logs(work: Path) -> None:
    """Sanity: eventspark wrote (and rotated on shutdown) one line per accepted event."""
    rotated = list((work / "events" / "incoming").glob("incoming.tok=bench-*.log"))
    lines = sum(path.read_bytes().count(b"\n") for path in rotated)
    print(f"eventspark wrote {lines} events to {len(rotated)} rotated log(s)")


def report(results: dict[str, tuple[Result, float]]) -> int:
    print(f"{'server':<12}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'CPU us/req':>12}{'RSS MB':>9}{'errors':>8}")
    for name, (r, rss) in results.items():
        print(f"{name:<12}{r.rps:>10.0f}{r.p50_ms:>9.2f}{r.p99_ms:>9.2f}{r.cpu_us:>12.1f}{rss:>9.1f}{r.errors:>8}")
    ours, rss = results["eventspark"]
    base = results["baseline"][0]
    ratio = ours.rps / base.rps
    print(f"eventspark/baseline: req/s {ratio:.3f}; CPU per request {base.cpu_us / ours.cpu_us:.3f}")
    floor = results["base+enrich"][0]
    print(f"base+enrich/baseline (the floor set by ContextEnrichment): req/s {floor.rps / base.rps:.3f}")
    checks = {
        f"req/s ratio {ratio:.3f} >= {TARGET_RATIO}": ratio >= TARGET_RATIO,
        f"p99 {ours.p99_ms:.2f} ms < {TARGET_P99_MS} ms": ours.p99_ms < TARGET_P99_MS,
        f"RSS {rss:.1f} MB < {TARGET_RSS_MB} MB": rss < TARGET_RSS_MB,
        f"errors {ours.errors} == 0": ours.errors == 0,
    }
    for text, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    return 0 if all(checks.values()) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per measured round")
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    wrk = ensure_wrk()
    body = web_event()
    print(f"load generator: {wrk or 'built-in asyncio'}; body {len(body)} bytes; {args.connections} connections")
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        work = Path(tmp)
        results = measure(wrk, body, args, work)
        check_logs(work)
    return report(results)


if __name__ == "__main__":
    sys.exit(main())
