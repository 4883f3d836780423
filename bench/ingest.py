"""Collector throughput: eventspark against a minimal baseline app, same server, same load, same run.

    .venv/bin/python bench/ingest.py [--rounds 6] [--duration 5] [--connections 50] [--pin]
    .venv/bin/python bench/ingest.py --in-process [--rounds 6] [--profile]

Starts `eventspark serve` (one token, one batch destination; the uploader's period is set beyond
the run, so no Spark pass takes the CPU) and a baseline app under the same uvicorn settings
(`eventspark.collector.server.uvicorn_config`) that parses the body with orjson and appends it,
re-serialised (the least a collector must do: a body may contain newlines), with `os.write`.
`base+enrich` is the baseline plus `enrich_context`, the step every accepted event needs. All get
the same POST of a 40-leaf web event with a browser's User-Agent and Origin at `--connections`
connections from wrk (installed with apt-get when missing; else a built-in asyncio generator).

For a shared, noisy machine: short rounds alternate between the servers (reversed every other
round, eventspark always next to the baseline), each round gives eventspark/baseline in req/s
and in server CPU time per request, and the medians over the rounds are reported. `--pin` runs
the servers on CPU 0 and wrk on CPU 1.

`--in-process` needs no sockets: each app runs under uvicorn's own HTTP protocol object with a
fake transport, fed the same request bytes in a loop: the CPU per request of everything in Python
(uvicorn, the app, `os.write`) without the kernel's TCP work or wrk. `--profile` adds cProfile's
busiest functions of eventspark in that loop.

Exits non-zero when a target (median req/s ratio >= 0.9, p99 < 10 ms, RSS < 150 MB, no errors)
is missed.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

VENV_BIN = Path(sys.executable).parent
TOKEN = "bench-js-secret"
TARGET_RATIO, TARGET_P99_MS, TARGET_RSS_MB = 0.9, 10.0, 150.0
SERVER_CPU, LOAD_CPU = 0, 1
USER_AGENT = (
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/120.0.0.0 Safari/537.36"
)
ORIGIN = "https://shop.example.com"
SERVERS = ("baseline", "base+enrich", "eventspark")
ROUND_ORDER = ("baseline", "eventspark", "base+enrich")
"""Every other round runs in reverse: eventspark always runs next to the baseline it is compared to."""


def web_event() -> bytes:
    """A JS SDK page view with 40 leaves, as a browser sends it."""
    event = {
        "event_id": "l2k4j5h6g7f8", "event_type": "pageview", "src": "jitsu", "api_key": TOKEN,
        "user": {"anonymous_id": "a8c2e7f1b3", "id": "u-1029", "email": "ann@example.com"},
        "ids": {"ga": "GA1.1.1.2", "fbp": "fb.1.1.2"},
        "user_agent": USER_AGENT, "utc_time": "2024-05-01T12:00:00.000000Z", "local_tz_offset": -120,
        "referer": "https://google.com/", "url": "https://shop.example.com/p/42?utm_source=news",
        "page_title": "Product 42", "doc_path": "/p/42", "doc_host": "shop.example.com",
        "doc_search": "?utm_source=news", "screen_resolution": "1920x1080", "vp_size": "1280x720",
        "user_language": "en-US", "doc_encoding": "UTF-8",
        "utm": {"source": "news", "medium": "email", "campaign": "may", "term": "", "content": "a"},
        "click_id": {"gclid": "x1"},
        "event_data": {
            "product": {"id": 42, "name": "Shoe", "price": 59.9, "currency": "EUR", "tags": ["red", "new"]},
            "cart": {"items": 2, "total": 119.8}, "consent": True, "experiment": "b",
        },
    }  # fmt: skip
    return orjson.dumps(event)


def raw_request(body: bytes) -> bytes:
    """The HTTP/1.1 request every load generator sends."""
    head = (
        f"POST /api/v1/event?token={TOKEN} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"User-Agent: {USER_AGENT}\r\nOrigin: {ORIGIN}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


# --- the baseline app -----------------------------------------------------------------------------


class Baseline:
    """The least a collector does: parse, (optionally) enrich, re-serialise, append, answer."""

    def __init__(self, path: Path, enrich: bool) -> None:
        from eventspark.steps.context import enrich_context, utc_timestamp

        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.enrich = enrich_context if enrich else None
        self.timestamp = utc_timestamp

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        event = orjson.loads(body)
        if self.enrich is not None:  # the floor: the baseline plus the step every accepted event needs
            agent = dict(scope["headers"]).get(b"user-agent", b"").decode()
            stamp = self.timestamp()  # as the collector does: one formatted `_timestamp` per request
            ip = scope["client"][0]
            self.enrich(event, token="t", source_ip=ip, user_agent=agent, server_side=False, timestamp=stamp)
        os.write(self.fd, orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE))
        headers = [(b"content-type", b"application/json"), (b"content-length", b"15")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"status":"ok"}'})


def serve_baseline(log: str, port: int, mode: str) -> None:
    """The baseline server process, under the same uvicorn settings as `eventspark serve`."""
    import uvicorn

    from eventspark.collector.server import uvicorn_config
    from eventspark.config.models import Config

    config = Config.model_validate({"server": {"host": "127.0.0.1", "port": port}})
    uvicorn.Server(uvicorn_config(Baseline(Path(log), mode == "enrich"), config)).run()  # type: ignore[arg-type]


# --- servers --------------------------------------------------------------------------------------


def eventspark_config(work: Path, port: int) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1", "port": port},
        "api_keys": [{"id": "bench", "client_secret": TOKEN, "server_secret": "bench-s2s"}],
        # No batch pass during the run: a Spark job would take the CPU from the server measured.
        "log": {"path": str(work / "events"), "rotation_min": 1, "uploader_period_sec": 86400},
        "destinations": {"warehouse": {"type": "duckdb"}},
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pinned(cpu: int | None) -> Callable[[], None] | None:
    """A `preexec_fn` that keeps the child (and every thread it starts) on one CPU."""
    return None if cpu is None else lambda: os.sched_setaffinity(0, {cpu})


def start_server(name: str, work: Path, port: int, cpu: int | None) -> subprocess.Popen[bytes]:
    if name == "eventspark":
        path = work / "eventspark.json"
        path.write_bytes(orjson.dumps(eventspark_config(work, port)))
        command = [str(VENV_BIN / "eventspark"), "serve", "-c", str(path)]
    else:
        mode = "enrich" if name == "base+enrich" else "plain"
        command = [sys.executable, __file__, "--serve-baseline", str(work / f"baseline-{mode}.log"), str(port), mode]
    quiet = subprocess.DEVNULL
    return subprocess.Popen(command, stdout=quiet, stderr=quiet, start_new_session=True, preexec_fn=pinned(cpu))


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
    rss_mb: float = 0.0


def ensure_wrk() -> str | None:
    found = shutil.which("wrk")
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    print("wrk not found: installing it with apt-get", file=sys.stderr)
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "wrk"]):
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return shutil.which("wrk")


def run_wrk(wrk: str, port: int, body: bytes, args: argparse.Namespace, duration: int, work: Path) -> Result:
    script = work / "post.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = [==[{body.decode()}]==]\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["User-Agent"] = "{USER_AGENT}"\n'
        f'wrk.headers["Origin"] = "{ORIGIN}"\n'
    )
    url = f"http://127.0.0.1:{port}/api/v1/event?token={TOKEN}"
    command = [wrk, "-t1", f"-c{args.connections}", f"-d{duration}s", "--latency", "-s", str(script), url]
    cpu = LOAD_CPU if args.pin else None
    out = subprocess.run(command, capture_output=True, text=True, check=True, preexec_fn=pinned(cpu)).stdout
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


async def _async_load(port: int, body: bytes, connections: int, duration: float) -> Result:
    """Fallback load generator: keep-alive HTTP/1.1 POSTs, one coroutine per connection."""
    request = raw_request(body)
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


def load(wrk: str | None, port: int, body: bytes, args: argparse.Namespace, duration: int, work: Path) -> Result:
    if wrk is not None:
        return run_wrk(wrk, port, body, args, duration, work)
    return asyncio.run(_async_load(port, body, args.connections, duration))


# --- over the network -----------------------------------------------------------------------------


def measure(
    wrk: str | None, body: bytes, args: argparse.Namespace, work: Path
) -> tuple[dict[str, Result], list[tuple[float, float]]]:
    """Alternating rounds; per server the medians; per round eventspark/baseline in req/s and in CPU."""
    ports = {name: free_port() for name in SERVERS}
    cpu = SERVER_CPU if args.pin else None
    servers = {name: start_server(name, work, ports[name], cpu) for name in SERVERS}
    rounds: dict[str, list[Result]] = {name: [] for name in servers}
    try:
        for name, process in servers.items():
            wait_ready(ports[name], process)
            load(wrk, ports[name], body, args, 2, work)  # warm-up
        for n in range(args.rounds):
            for name in ROUND_ORDER if n % 2 == 0 else reversed(ROUND_ORDER):
                rounds[name].append(_round(wrk, servers[name].pid, ports[name], body, args, work))
        summaries = {name: _summary(rounds[name], rss_mb(process.pid)) for name, process in servers.items()}
    finally:
        for process in servers.values():
            stop(process)
    pairs = zip(rounds["eventspark"], rounds["baseline"], strict=True)
    ratios = [(ours.rps / base.rps, base.cpu_us / ours.cpu_us) for ours, base in pairs]
    return summaries, ratios


def _round(wrk: str | None, pid: int, port: int, body: bytes, args: argparse.Namespace, work: Path) -> Result:
    before = cpu_seconds(pid)
    result = load(wrk, port, body, args, args.duration, work)
    result.cpu_us = (cpu_seconds(pid) - before) / max(result.requests, 1) * 1e6
    return result


def _summary(results: list[Result], rss: float) -> Result:
    """Medians over the rounds of one server; errors and requests summed."""

    def median(field: str) -> float:
        return statistics.median(getattr(r, field) for r in results)

    summary = Result(median("rps"), median("p50_ms"), median("p99_ms"), 0, 0, median("cpu_us"), rss)
    summary.errors, summary.requests = sum(r.errors for r in results), sum(r.requests for r in results)
    return summary


def check_logs(work: Path) -> None:
    """Sanity: eventspark wrote (and rotated on shutdown) one line per accepted event."""
    rotated = list((work / "events" / "incoming").glob("incoming.tok=bench-*.log"))
    lines = sum(path.read_bytes().count(b"\n") for path in rotated)
    print(f"eventspark wrote {lines} events to {len(rotated)} rotated log(s)")


def report(summaries: dict[str, Result], ratios: list[tuple[float, float]]) -> int:
    print(f"{'server':<12}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'CPU us/req':>12}{'RSS MB':>9}{'errors':>8}")
    for name, s in summaries.items():
        print(f"{name:<12}{s.rps:>9.0f}{s.p50_ms:>9.2f}{s.p99_ms:>9.2f}{s.cpu_us:>12.1f}{s.rss_mb:>9.1f}{s.errors:>8}")
    ours, base, floor = summaries["eventspark"], summaries["baseline"], summaries["base+enrich"]
    ratio = statistics.median(r for r, _ in ratios)
    print(f"eventspark/baseline req/s, per round: {', '.join(f'{r:.2f}' for r, _ in ratios)}; median {ratio:.3f}")
    cpu = statistics.median(c for _, c in ratios)
    print(
        f"baseline/eventspark CPU per request, per round: {', '.join(f'{c:.2f}' for _, c in ratios)}; median {cpu:.3f}"
    )
    print(f"base+enrich/baseline (the floor set by ContextEnrichment): req/s {floor.rps / base.rps:.3f}")
    print(f"load average after the run: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    checks = {
        f"req/s ratio {ratio:.3f} >= {TARGET_RATIO}": ratio >= TARGET_RATIO,
        f"p99 {ours.p99_ms:.2f} ms < {TARGET_P99_MS} ms": ours.p99_ms < TARGET_P99_MS,
        f"RSS {ours.rss_mb:.1f} MB < {TARGET_RSS_MB} MB": ours.rss_mb < TARGET_RSS_MB,
        f"errors {ours.errors} == 0": ours.errors == 0,
    }
    for text, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    return 0 if all(checks.values()) else 1


# --- in-process -----------------------------------------------------------------------------------


class FakeTransport:
    """What uvicorn's protocol needs of a transport; completes `done` on the response body."""

    def __init__(self) -> None:
        self.done: asyncio.Future[None] | None = None
        self.writes = 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8001)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.writes += 1
        if self.writes % 2 == 0 and self.done is not None:  # uvicorn writes the head, then the body
            self.done.set_result(None)

    def is_closing(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args: None  # close, pause_reading, resume_reading: nothing to do here


async def _cpu_per_request(app: Any, request: bytes, count: int) -> float:
    """CPU µs per request of `count` requests through uvicorn's HTTP protocol around `app`."""
    from email.utils import formatdate

    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvicorn.server import ServerState

    from eventspark.collector.server import uvicorn_config
    from eventspark.config.models import Config

    config = uvicorn_config(app, Config.model_validate({}))
    config.load()
    state = ServerState()
    state.default_headers = [(b"date", formatdate(usegmt=True).encode()), *config.encoded_headers]
    protocol = HttpToolsProtocol(config=config, server_state=state, app_state={})
    transport = FakeTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    started = time.process_time()
    for _ in range(count):
        transport.done = loop.create_future()
        protocol.data_received(request)
        await transport.done
    return (time.process_time() - started) / count * 1e6


def in_process(args: argparse.Namespace) -> int:
    """Rounds of each app in turn under uvicorn's protocol; medians of CPU µs per request and of ratios."""
    import uvloop

    from eventspark.collector.app import CollectorApp
    from eventspark.config.models import Config

    request = raw_request(web_event())
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        work = Path(tmp)
        eventspark = CollectorApp(Config.model_validate(eventspark_config(work, 8001)))  # never bound
        eventspark.open()
        apps = {
            "baseline": Baseline(work / "plain.log", enrich=False),
            "base+enrich": Baseline(work / "enrich.log", enrich=True),
            "eventspark": eventspark,
        }
        times: dict[str, list[float]] = {name: [] for name in apps}
        profiled: list[Any] = []

        async def rounds() -> None:
            for app in apps.values():
                await _cpu_per_request(app, request, 2000)  # warm-up
            for _ in range(args.rounds):
                for name, app in apps.items():
                    times[name].append(await _cpu_per_request(app, request, 20000))
            if args.profile:
                profiled.append(await _profile(eventspark, request))

        uvloop.run(rounds())
        eventspark.close()
    for name, values in times.items():
        ratio = statistics.median(base / us for base, us in zip(times["baseline"], values, strict=True))
        print(f"{name:<12}{statistics.median(values):8.1f} CPU us/request (median)   baseline/{name} {ratio:.3f}")
    for stats in profiled:
        stats.sort_stats(os.environ.get("BENCH_SORT", "tottime")).print_stats(int(os.environ.get("BENCH_TOP", "25")))
    return 0


async def _profile(app: Any, request: bytes) -> Any:
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    await _cpu_per_request(app, request, 20000)
    profile.disable()
    return pstats.Stats(profile)


# --- main -----------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds per measured round")
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--pin", action="store_true", help=f"servers on CPU {SERVER_CPU}, wrk on CPU {LOAD_CPU}")
    parser.add_argument("--in-process", action="store_true", help="CPU per request without sockets (see above)")
    parser.add_argument("--profile", action="store_true", help="with --in-process: cProfile of eventspark")
    parser.add_argument("--serve-baseline", nargs=3, metavar=("LOG", "PORT", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_baseline:
        log, port, mode = args.serve_baseline
        serve_baseline(log, int(port), mode)
        return 0
    if args.in_process:
        return in_process(args)
    args.pin = args.pin and hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2
    wrk = ensure_wrk()
    body = web_event()
    pin = f"servers on CPU {SERVER_CPU}, load on CPU {LOAD_CPU}" if args.pin else "not pinned"
    print(f"load generator: {wrk or 'built-in asyncio'}; body {len(body)} bytes; {args.connections} connections")
    print(f"{args.rounds} alternating rounds of {args.duration} s per server; {pin}")
    print(f"load average before the run: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        work = Path(tmp)
        summaries, ratios = measure(wrk, body, args, work)
        check_logs(work)
    return report(summaries, ratios)


if __name__ == "__main__":
    sys.exit(main())
