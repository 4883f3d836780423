"""The cost model of a batch pass, measured on this machine and extrapolated to a cluster.

    .venv/bin/python bench/scale.py [--sizes 50000,200000] [--repeats 3]
        [--masters local[1],local[2],local-cluster[2,1,1024],standalone] [--no-staged] [--staged-on MASTERS]
        [--keyed]
        [--remote MASTER] [--rates 1e7,1e9] [--nodes 2,16] [--executors 1,4,16,64]
        [--destination-cores 2] [--json FILE] [--from-json FILE]

1. generates web events (bench/generate.py) once, as several rotated logs per pass (12,500 events,
   ~14 MB, a log: what a collector node rotates): each size in --sizes, plus small passes of
   --small-events events in a few and in many logs, so that the fit tells a per-log cost from a
   per-event one;
2. for each Spark master, in a subprocess of its own (one SparkSession per process; `standalone`
   is a master and two 1-core workers started here, tests/spark_cluster.py): an empty Spark job of
   1 and of 8×cores tasks (Spark's own per-job and per-task costs), then passes into Postgres in the
   steady state (the table exists: executors write straight into it), each configuration
   --repeats times, interleaved; `JobResult.timings` gives the phases of each pass, /proc the CPU
   of the pass's processes and of the machine; on the first master (or those of --staged-on), also
   passes into a new table (every row staged, then committed per task on as many connections as
   the master has cores: what a pass that adds a column does), and with --keyed into a new table
   with a primary key (`eventn_ctx_event_id`: every row staged, upserted per key bucket); with
   --remote, MASTER's passes again with `log.remote` on a moto S3 server started here;
3. fits each driver phase (list, plan, load, settle, archive) as fixed + per event + per log, and
   the stage and the CPU as fixed + per event, on the medians of the repeats; prints the ratios
   between masters (does local[2] do the executors' part twice as fast as local[1]?), checks the
   model against each master's largest pass, then predicts passes of 4, 16 and 64 one-core
   executors at --rates events a day (bench/scale_model.py), with the destination's COPY capacity
   as a separate bound (the COPY floor of bench/batch.py, per destination core).

docs/scaling.md records a run and what it means.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))  # tests.spark_cluster, for `standalone`

import batch
import common
from common import CLOCK_TICKS, generate_logs, stage_as_rotated, tree_cpu
from scale_report import report

EVENTS_PER_LOG = 12_500
MODE_OFFSETS = {"steady": 0, "staged": 50_000, "remote": 100_000, "keyed": 150_000}
"""Seconds into the bench's day of each mode's first log: no two passes share a log name."""
CLUSTER_CONF = {"spark.executor.memory": "512m", "spark.dynamicAllocation.enabled": "false"}
"""local-cluster and standalone executors: within the 1 GiB each worker offers. Executors kept for
the whole run (a spark:// master otherwise gets dynamic allocation, eventspark.batch.session, and
a pass after an idle gap would pay for starting executors: not a per-event cost)."""


# --- the measuring subprocess (one per master) ------------------------------------------------


def measure_master(job: dict[str, Any]) -> dict[str, Any]:
    """Runs in its own process: Spark's overheads and the timed passes on one master."""
    from eventspark.batch.session import get_session, stop_session
    from eventspark.config.models import SparkConfig
    from eventspark.logs import store

    conf = {} if job["master"].startswith("local[") else CLUSTER_CONF
    started = time.perf_counter()
    session = get_session(SparkConfig(master=job["master"], conf=conf))
    cores = session.sparkContext.defaultParallelism
    out: dict[str, Any] = {"master": job["master"], "cores": cores, "session_seconds": time.perf_counter() - started}
    # As `LocalStore.archive` decides: a cluster master's executors gzip the logs (a Spark job),
    # here at every size (below `EXECUTOR_ARCHIVE_BYTES` a pass keeps it on the driver: the model
    # needs the job's costs at the bench's sizes too).
    store.EXECUTOR_ARCHIVE_BYTES = 0
    out["archive_on"] = "driver" if job["master"].startswith("local") else "executors"
    out["job_seconds"], out["task_seconds"] = spark_overheads(session.sparkContext, cores)
    schema = job["schema"]
    work = Path(job["work"])
    loaded = batch.bench_config(work / "runs", schema, job["master"])
    batch.drop_schema(schema)
    try:
        timed_pass(loaded, session, [Path(p) for p in job["warm"]], 0)  # creates the table, warms the workers
        out["types"] = batch.table_types(schema)
        out["passes"] = run_passes(loaded, session, job, "steady")
        out["staged"] = run_passes(loaded, session, job, "staged") if job["staged"] else []
        if job["staged"] and job.get("keyed"):
            keyed = common.bench_config(work / "keyed", job["master"], pg_destination(schema, ["eventn_ctx_event_id"]))
            out["keyed"] = run_passes(keyed, session, job, "keyed")
        if job.get("remote"):
            remote = common.bench_config(work / "remote", job["master"], pg_destination(schema), job["remote"])
            out["remote"] = run_passes(remote, session, job, "remote")
    finally:
        batch.drop_schema(schema)
        stop_session()  # a cluster's application ends with its driver, not when the cluster stops
    return out


def pg_destination(schema: str, keys: list[str] | None = None) -> dict[str, Any]:
    layout: dict[str, Any] = {"table_name_template": "events", **({"primary_key_fields": keys} if keys else {})}
    return {"pg": {"type": "postgres", "datasource": {**batch.PG, "schema": schema}, "data_layout": layout}}


def spark_overheads(context: Any, cores: int, repeats: int = 5) -> tuple[float, float]:
    """(seconds of a 1-task empty job, seconds one more empty task costs a core). Medians."""

    def job(tasks: int) -> float:
        started = time.perf_counter()
        context.parallelize(range(tasks), tasks).map(lambda x: x).collect()
        return time.perf_counter() - started

    many = 8 * cores
    job(many)  # starts the Python workers
    one = statistics.median(job(1) for _ in range(repeats))
    wide = statistics.median(job(many) for _ in range(repeats))
    return one, max(0.0, wide - one) * cores / (many - 1)


def run_passes(loaded: Any, session: Any, job: dict[str, Any], mode: str) -> list[dict[str, Any]]:
    """Each configuration `repeats` times, interleaved (a burst of load elsewhere hits all sizes)."""
    runs = []
    configs = job["configs"]
    if mode in ("staged", "keyed"):  # the small passes add nothing to a per-event commit cost
        configs = [c for c in configs if c["events"] >= job["staged_min"]]
    for repeat in range(job["repeats"]):
        for number, config in enumerate(configs):
            if mode in ("staged", "keyed"):  # every row staged, then committed per task (or key bucket)
                drop_table(job["schema"])
            offset = 1_000 + (repeat * len(configs) + number) * 100 + MODE_OFFSETS[mode]
            run = timed_pass(loaded, session, [Path(p) for p in config["files"]], offset)
            runs.append({**run, "events": config["events"], "logs": len(config["files"]), "mode": mode})
    return runs


def timed_pass(loaded: Any, session: Any, files: list[Path], offset: int) -> dict[str, Any]:
    """One pass over `files` (hard-linked in as rotated logs named `offset` seconds into the day,
    so no two passes share a log name and its load markers); checks every event landed."""
    from eventspark.batch.job import TASKS_PER_CORE
    from eventspark.batch.process import run_pass
    from eventspark.batch.splits import group_splits, plan_splits
    from eventspark.coordination import MemoryCoordination

    events_dir = Path(loaded.config.log.path)
    schema = loaded.config.destinations["pg"].datasource.schema_
    remote = loaded.config.log.remote
    if remote is None:
        stage_as_rotated(files, events_dir / "incoming", first=offset)
    else:
        upload_as_rotated(remote, files, offset)
    splits = plan_splits(files)  # a function of the logs' sizes alone
    tasks = len(group_splits(splits, session.sparkContext.defaultParallelism, TASKS_PER_CORE))
    events = sum(1 for f in files for _ in f.open("rb"))
    batch.checkpoint()
    before = batch.pg_count(schema)
    # The parent's tree: this process, its JVM and Python workers, and a standalone cluster's JVMs.
    cpu, busy, started = tree_cpu(os.getppid()), machine_busy(), time.perf_counter()
    result = run_pass(loaded, MemoryCoordination("bench"), session=session)
    total = time.perf_counter() - started
    cpu, busy = tree_cpu(os.getppid()) - cpu, machine_busy() - busy
    landed = batch.pg_count(schema) - before
    if not result.ok or landed != events:
        raise SystemExit(f"pass over {len(files)} logs is wrong: ok={result.ok}, {landed} rows for {events} events")
    shutil.rmtree(events_dir, ignore_errors=True)
    if remote is not None:
        clear_remote(remote)
    phases = dict(result.timings)
    phases["list"] = total - sum(phases.values())
    return {"total": total, "phases": phases, "splits": len(splits), "tasks": tasks, "cpu": cpu, "busy": busy}


def machine_busy() -> float:
    """CPU seconds every core of the machine spent busy so far (/proc/stat: all but idle and
    iowait): Postgres and the other work on the machine too."""
    with open("/proc/stat") as stat:
        ticks = [int(x) for x in stat.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / CLOCK_TICKS


def upload_as_rotated(remote: Any, files: list[Path], offset: int) -> None:
    """`files` put into the store's incoming/ as a collector node uploads them (untimed)."""
    from eventspark.logs.incoming import rotated_log_name
    from eventspark.logs.remote import remote_filesystem

    fs, root = remote_filesystem(remote)
    at = datetime(2026, 11, 1, tzinfo=UTC) + timedelta(seconds=offset)
    for number, path in enumerate(files):
        fs.put_file(str(path), f"{root}/incoming/{rotated_log_name('bench', at + timedelta(seconds=number))}")


def clear_remote(remote: Any) -> None:
    """Removes what the pass left on the store (its archive), so no pass lists another's files."""
    from eventspark.logs.remote import remote_filesystem

    fs, root = remote_filesystem(remote)
    fs.invalidate_cache()
    if fs.exists(root):
        fs.rm(root, recursive=True)


def drop_table(schema: str) -> None:
    import psycopg

    with psycopg.connect(batch.PG_CONNINFO, autocommit=True) as conn:
        conn.execute(f'DROP TABLE IF EXISTS "{schema}".events')


# --- the parent: data, subprocesses, the floor; scale_report.py prints------------------------------------------


def make_data(work: Path, args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[Path], float]:
    """The pass configurations (events, their log files), the warm-up logs, bytes per event."""
    shapes = [(args.small_events, n) for n in args.small_logs]
    shapes += [(n, max(1, n // args.events_per_log)) for n in args.sizes]
    configs = []
    for number, (events, logs) in enumerate(shapes):
        files = generate_logs(work / f"data-{events}-{logs}", events, args.seed + number, -(-events // logs))
        configs.append({"events": events, "files": [str(f) for f in files]})
    biggest = configs[-1]
    size = sum(Path(f).stat().st_size for f in biggest["files"])
    warm = generate_logs(work / "data-warm", 2_000, args.seed + 99)
    return configs, warm, size / biggest["events"]


def run_master(master: str, job: dict[str, Any], work: Path) -> dict[str, Any] | None:
    """`measure_master` in a subprocess (standalone: on a cluster started here for it)."""
    with cluster_for(master) as url:
        job = {**job, "master": url}
        spec, result = work / "job.json", work / "result.json"
        spec.write_text(json.dumps(job))
        result.unlink(missing_ok=True)
        done = subprocess.run([sys.executable, __file__, "--worker", str(spec), str(result)], check=False)
    if done.returncode != 0 or not result.exists():
        print(f"  {master}: the measuring process failed (exit {done.returncode}); left out", file=sys.stderr)
        return None
    measured: dict[str, Any] = json.loads(result.read_text())
    measured["label"] = master
    return measured


@contextlib.contextmanager
def cluster_for(master: str) -> Iterator[str]:
    """The master URL to use: `standalone` starts a master and two 1-core workers for the run."""
    if master != "standalone":
        yield master
        return
    from tests.spark_cluster import StandaloneCluster

    with StandaloneCluster(workers=2, cores=1) as cluster:
        yield cluster.master_url


@contextlib.contextmanager
def moto_s3() -> Iterator[dict[str, Any]]:
    """A `log.remote` section on a moto S3 server started here (stopped after): object storage as
    the executors see it on this machine (no network, a Python server)."""
    import boto3
    import httpx

    port = common.free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(endpoint, timeout=1)
                break
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("moto_server did not start: pip install 'moto[server]'")
            time.sleep(0.2)
        options = {
            "key": "bench",
            "secret": "bench",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )
        client.create_bucket(Bucket="eventspark-scale")
        yield {"url": "s3://eventspark-scale/events", "storage_options": options}
    finally:
        server.terminate()
        server.wait(10)


def copy_rate(configs: list[dict[str, Any]], types: dict[str, str]) -> float:
    """Rows/s of the COPY floor (bench/batch.py: one binary COPY of the pre-flattened rows from
    one process, into the pipeline's column types) on the largest pass's events: what one
    destination core takes, at most (the client's encoding runs in the same timed loop)."""
    files = [Path(f) for f in configs[-1]["files"]]
    seconds = batch.run_floor(files, types)
    return configs[-1]["events"] / min(seconds.values())


def gzip_cpu(configs: list[dict[str, Any]], folder: Path, repeats: int = 3) -> float:
    """CPU seconds per event of `archive_log` (ISA-L gzip, fsync, rename) on one thread, over the
    largest pass's logs: what one executor core spends per event archiving on a cluster master.
    This thread's CPU only, so other work on the machine does not count (the driver's `archive`
    timing is wall time of a thread pool on shared cores)."""
    from eventspark.logs.archive import archive_log

    files = [Path(f) for f in configs[-1]["files"]]
    runs = []
    for repeat in range(repeats):
        logs = folder / f"logs-{repeat}"
        logs.mkdir(parents=True)
        for path in files:
            os.link(path, logs / path.name)  # archive_log removes the log: a link, not the data
        started = time.thread_time()
        for path in files:
            archive_log(logs / path.name, folder / f"archive-{repeat}")
        runs.append(time.thread_time() - started)
    return statistics.median(runs) / configs[-1]["events"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    numbers = lambda text: [int(float(x)) for x in text.split(",")]  # noqa: E731
    parser.add_argument("--sizes", type=numbers, default=[50_000, 200_000], help="events of the large passes")
    parser.add_argument("--events-per-log", type=int, default=EVENTS_PER_LOG)
    parser.add_argument("--small-events", type=int, default=2_000, help="events of the small passes")
    parser.add_argument("--small-logs", type=numbers, default=[2, 32], help="logs of the small passes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--masters", default="local[1],local[2],local-cluster[2,1,1024],standalone")
    parser.add_argument("--no-staged", action="store_true", help="skip the passes into a new table")
    parser.add_argument("--staged-on", default="", help="masters running passes into a new table (default: the first)")
    parser.add_argument("--keyed", action="store_true", help="staged masters: also passes into a new keyed table")
    parser.add_argument("--rates", type=numbers, default=[10_000_000, 1_000_000_000], help="events a day")
    parser.add_argument("--nodes", type=numbers, default=[2, 16], help="collector nodes at each rate")
    parser.add_argument("--executors", type=numbers, default=[1, 4, 16, 64])
    parser.add_argument("--period", type=float, default=60.0, help="log.uploader_period_sec")
    parser.add_argument("--destination-cores", type=int, default=2, help="cores of the destination (this machine: 2)")
    parser.add_argument(
        "--store-request-ms",
        type=float,
        default=0.0,
        help="latency of one request to log.remote's store, for the archive's deletes (0: log.path)",
    )
    parser.add_argument(
        "--remote",
        default="",
        metavar="MASTER",
        help="also run MASTER's passes with log.remote on a moto S3 server started here (e.g. local[2])",
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", type=Path, help="write the measurements here")
    parser.add_argument("--from-json", type=Path, help="report measurements written by --json, measure nothing")
    args = parser.parse_args()
    if len(args.rates) != len(args.nodes):
        parser.error("--nodes needs one count per rate")
    if args.remote and args.remote not in masters(args.masters):
        parser.error(f"--remote {args.remote}: not one of --masters")
    return args


def masters(text: str) -> list[str]:
    """--masters split at the commas outside brackets: local-cluster[2,1,1024] is one master."""
    return re.split(r",(?![^\[]*\])", text)


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        job = json.loads(Path(sys.argv[2]).read_text())
        Path(sys.argv[3]).write_text(json.dumps(measure_master(job)))
        return
    args = parse_args()
    if args.from_json:
        report(json.loads(args.from_json.read_text()), args)
        return
    work = Path(tempfile.mkdtemp(prefix="eventspark-scale-"))
    try:
        saved = measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(saved, indent=1))
    report(saved, args)


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    started = time.perf_counter()
    configs, warm, bytes_per_event = make_data(work, args)
    print(f"data: {len(configs)} pass shapes generated in {time.perf_counter() - started:.1f} s", flush=True)
    job = {"configs": configs, "warm": [str(w) for w in warm], "repeats": args.repeats, "work": str(work)}
    results = []
    with moto_s3() if args.remote else contextlib.nullcontext() as remote:
        staged_on = masters(args.staged_on) if args.staged_on else masters(args.masters)[:1]
        for master in masters(args.masters):
            label = "".join(c if c.isalnum() else "_" for c in master).strip("_")
            spec = {**job, "schema": f"bench_scale_{label}", "staged": master in staged_on and not args.no_staged}
            spec["staged_min"] = min(args.sizes)
            spec["keyed"] = args.keyed
            spec["remote"] = remote if master == args.remote else None
            started = time.perf_counter()
            measured = run_master(master, spec, work)
            print(f"{master}: measured in {time.perf_counter() - started:.0f} s", flush=True)
            if measured is not None:
                results.append(measured)
    if not results:
        raise SystemExit("no master could be measured")
    floor = copy_rate(configs, results[0]["types"])
    gzip = gzip_cpu(configs, work / "gzip")
    print(f"archive's gzip: {gzip * 1e6:.2f} µs of CPU per event, one thread", flush=True)
    return {"results": results, "floor": floor, "bytes_per_event": bytes_per_event, "gzip_cpu_per_event": gzip}


if __name__ == "__main__":
    main()
