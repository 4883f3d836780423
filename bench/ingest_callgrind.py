"""Instructions per request of the collector, counted by valgrind's callgrind (deterministic).

Timings on a shared 2-core VM move by ±10 % from run to run; instruction counts do not. Each app
(`baseline` of bench/ingest.py and `eventspark`) runs under callgrind twice, with 0 and with N
in-process requests after the same warm-up; (Ir(N) − Ir(0)) / N is its cost per request, and the
ratio baseline/eventspark is printed like bench/ingest.py's. Needs `valgrind` (Debian package).

    python bench/ingest_callgrind.py [--requests 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
APPS = ("baseline", "eventspark")


def run_requests(app_name: str, count: int) -> None:
    """The measured program: `count` requests through one app (after 200 to warm up)."""
    sys.path.insert(0, str(HERE))
    import ingest
    from eventspark.collector.app import CollectorApp
    from eventspark.config.models import Config

    request = ingest.raw_request(ingest.web_event())
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmp:
        work = Path(tmp)
        if app_name == "eventspark":
            app = CollectorApp(Config.model_validate(ingest.eventspark_config(work, 8001)))
            app.open()
        else:
            app = ingest.Baseline(work / "plain.log", enrich=False)
        asyncio.run(ingest._cpu_per_request(app, request, 200))
        if count:
            asyncio.run(ingest._cpu_per_request(app, request, count))
        if app_name == "eventspark":
            app.close()


def instructions(app_name: str, count: int, out_dir: Path) -> int:
    out = out_dir / f"callgrind.{app_name}.{count}"
    command = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
        sys.executable, __file__, "--run", app_name, str(count),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--run", nargs=2, metavar=("APP", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run_requests(args.run[0], int(args.run[1]))
        return 0
    runs = [(app, count) for app in APPS for count in (0, args.requests)]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(2) as pool:
        counts = dict(zip(runs, pool.map(lambda run: instructions(*run, Path(tmp)), runs), strict=True))
    per_request = {app: (counts[app, args.requests] - counts[app, 0]) / args.requests for app in APPS}
    for app in APPS:
        ratio = per_request["baseline"] / per_request[app]
        print(f"{app:<12}{per_request[app]:12,.0f} instructions/request   baseline/{app} {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
