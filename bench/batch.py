"""Benchmark of the batch pipeline into Postgres, against a COPY floor and dlt, in one run.

    .venv/bin/python bench/batch.py [--events N] [--no-scaling] [--no-dlt] [--dlt-python PATH]
        [--fresh-table]
    .venv/bin/python bench/batch.py --destination clickhouse|mysql|duckdb [--events N]
        (bench/destinations.py)

1. generates N web events (bench/generate.py) as rotated incoming logs;
2. pipeline: one batch pass (warm SparkSession, `local[*]`) into a fresh Postgres schema whose
   table an untimed 2,000-event pass made first: the steady state of a running server, where
   executors write straight into the table (`--fresh-table`: time the pass that creates it);
3. floor: the same events flattened and converted to the column types of the pipeline's table
   beforehand (untimed), then copied from one process into tables with exactly those column
   types (numeric(38,18), timestamp...), by one binary COPY and one text COPY of all the rows
   (timed); the faster is the floor: what the warehouse can take at best; a CHECKPOINT before each
   timed side (pipeline, each floor) so that none flushes what another wrote;
   then the pipeline on the first 200k events beside EventNative 1.41's figures as issue 19
   quotes them (the bench cannot run EventNative); peak RSS of the process tree (this driver,
   the JVM, Spark's Python workers) during each pass;
4. dlt: `dlt[postgres]` loading the same events (parsed JSON) into the same Postgres; it runs in a
   subprocess of `--dlt-python` (default: this interpreter) so that dlt may live in its own venv;
5. rotate-to-visible latency of a 10-event batch with the warm session;
6. scaling: the pipeline again on 4×N events (skip with --no-scaling);
7. executor path: CPU time per event of one Spark task's body (`process_splits`: read, step chain,
   value checks, binary COPY into a stage table) in this process, without Spark, on the first
   `--executor-events` events; where Postgres takes direct writes, again writing straight into a
   table of the pipeline's column types. CPU time, unlike the rates above, hardly moves when
   other work shares the machine.

Prints events/s and the ratios (targets: pipeline ≥ 0.5× floor, ≥ 8× EventNative, ≥ 3× dlt,
latency ≤ 3 s).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import UTC
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import psycopg

sys.path.insert(0, str(Path(__file__).parent))

import common
from common import EVENTS_PER_FILE, PeakRss, generate_logs, stage_as_rotated
from eventspark.batch.partition import process_splits
from eventspark.batch.plan import JobPlan, token_routes
from eventspark.batch.process import run_pass
from eventspark.batch.session import get_session
from eventspark.batch.splits import Split
from eventspark.config import LoadedConfig
from eventspark.coordination import MemoryCoordination
from eventspark.destinations.postgres.dialect import DIALECT
from eventspark.destinations.postgres.load import PostgresWarehouse as PostgresAdapter
from eventspark.logs.incoming import live_log_name, rotate_incoming_logs
from eventspark.steps.flatten import flatten
from eventspark.steps.typing import DataType, coerce
from generate import generate_events

PG = {"host": "127.0.0.1", "port": 5432, "db": "test", "username": "postgres"}
PG_CONNINFO = "host=127.0.0.1 port=5432 dbname=test user=postgres"

FLOOR_CHUNK = 50_000
FLOOR_FORMATS = ("binary", "text")

# EventNative 1.41 on this machine, as issue 19 quotes it (the bench cannot run EventNative).
EVENTNATIVE_EVENTS = 200_000
EVENTNATIVE_RATE = 4_300
EVENTNATIVE_RSS = 6.0e9


def bench_config(root: Path, schema: str, master: str) -> LoadedConfig:
    destination = {
        "type": "postgres",
        "datasource": {**PG, "schema": schema},
        "data_layout": {"table_name_template": "events"},
    }
    return common.bench_config(root, master, {"pg": destination})


def pg_count(schema: str, table: str = "events") -> int:
    with psycopg.connect(PG_CONNINFO) as conn:
        found = conn.execute("SELECT to_regclass(%s)", (f'"{schema}"."{table}"',)).fetchone()
        if found is None or found[0] is None:
            return 0
        row = conn.execute(f'SELECT count(*) FROM "{schema}"."{table}"').fetchone()
        return int(row[0]) if row else 0


def checkpoint() -> None:
    """A CHECKPOINT, so that the timed side starts with no dirty pages or WAL of the side before
    it to flush (1M rows are ~1 GB of WAL: a checkpoint falls inside every pass and every floor,
    `max_wal_size` being 1 GB by default). Needs a superuser or pg_checkpoint; without, says so."""
    try:
        with psycopg.connect(PG_CONNINFO, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        print("  (no CHECKPOINT before the timed side: the bench's role may not run it)")


def drop_schema(schema: str) -> None:
    with psycopg.connect(PG_CONNINFO, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def table_types(schema: str, table: str = "events") -> dict[str, str]:
    """Column → SQL type (as `format_type` spells it: `numeric(38,18)`, `timestamp without time
    zone`...) of a table, in column order."""
    with psycopg.connect(PG_CONNINFO) as conn:
        rows = conn.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (f'"{schema}"."{table}"',),
        ).fetchall()
    return dict(rows)


def run_pipeline(
    work: Path,
    files: list[Path],
    master: str,
    session: Any,
    label: str,
    types: dict[str, str] | None = None,
    prime: Sequence[Path] = (),
) -> float:
    """One pass over `files` into a new schema; returns its duration in seconds after checking
    every event landed. `prime`: logs of an earlier pass (untimed) that creates the table, so
    that the timed one is the steady state of a running server (the table exists, its columns
    fit). `types`, when given, receives the column types of the table."""
    n = sum(1 for f in [*prime, *files] for _ in f.open("rb"))
    root = work / label
    schema = f"bench_{label}"
    drop_schema(schema)
    shutil.rmtree(root, ignore_errors=True)
    loaded = bench_config(root, schema, master)
    coordination = MemoryCoordination("bench")
    if prime:
        stage_as_rotated(prime, root / "events" / "incoming")
        run_pass(loaded, coordination, session=session)
    stage_as_rotated(files, root / "events" / "incoming", first=len(prime))
    checkpoint()
    started = time.perf_counter()
    result = run_pass(loaded, coordination, session=session)
    elapsed = time.perf_counter() - started
    loaded_rows = pg_count(schema)
    if not result.ok or loaded_rows != n:
        raise SystemExit(f"pipeline run {label} is wrong: ok={result.ok}, {loaded_rows} rows for {n} events")
    if types is not None:
        types.update(table_types(schema))
    drop_schema(schema)
    shutil.rmtree(root, ignore_errors=True)
    return elapsed


def floor_rows(files: list[Path]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for path in files:
        with path.open("rb") as lines:
            for line in lines:
                batch.append(flatten(orjson.loads(line)))
                if len(batch) == FLOOR_CHUNK:
                    yield batch
                    batch = []
    if batch:
        yield batch


def run_floor(files: list[Path], types: dict[str, str]) -> dict[str, float]:
    """COPY of the pre-flattened rows from one process into tables with the column types `types`
    of the pipeline's table: seconds of one COPY of all the rows per format (binary, then text),
    each after a CHECKPOINT, as the pipeline's pass is one continuous load (copying chunk by
    chunk with untimed work between them would let the server flush its WAL and pages off the
    clock). Untimed: flattening, converting each value to the Python type of its column (Decimal
    for numeric, naive UTC datetime for timestamp), creating the tables."""
    schema = "bench_floor"
    drop_schema(schema)
    timed = dict.fromkeys(FLOOR_FORMATS, 0.0)
    chunks: list[list[list[Any]]] = []
    names: list[str] | None = None
    for rows in floor_rows(files):
        names = names or [c for c in types if any(c in row for row in rows)]
        chunks.append(_floor_values(rows, names, [types[c] for c in names]))
    names = names or []
    with psycopg.connect(PG_CONNINFO) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        for fmt in FLOOR_FORMATS:
            conn.execute(f'CREATE TABLE "{schema}"."{fmt}" ({column_defs(types)})')
        conn.commit()
        for fmt in FLOOR_FORMATS:
            checkpoint()
            timed[fmt] = _floor_copy(conn, f'"{schema}"."{fmt}"', names, [types[c] for c in names], chunks, fmt)
        print(f"  floor tables: {len(types)} columns as the pipeline's, {len(names)} of them in the rows")
    drop_schema(schema)
    return timed


def column_defs(types: dict[str, str]) -> str:
    return ", ".join(f'"{c}" {t}' for c, t in types.items())


def _floor_copy(
    conn: psycopg.Connection[Any],
    table: str,
    names: list[str],
    sql_types: list[str],
    chunks: list[list[list[Any]]],
    fmt: str,
) -> float:
    """Seconds of one COPY (and its commit) of every row, values already of their columns' Python types."""
    columns = ", ".join(f'"{c}"' for c in names)
    started = time.perf_counter()
    with conn.cursor().copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT {fmt.upper()})") as copy:
        if fmt == "binary":  # the type without its modifier: numeric(38,18) → numeric
            copy.set_types([t.split("(")[0] for t in sql_types])
        for rows in chunks:
            for values in rows:
                copy.write_row(values)
    conn.commit()
    return time.perf_counter() - started


def _floor_values(rows: list[dict[str, Any]], names: list[str], sql_types: list[str]) -> list[list[Any]]:
    convert = [_converter(t) for t in sql_types]
    return [[None if row.get(c) is None else f(row[c]) for c, f in zip(names, convert, strict=True)] for row in rows]


def _converter(sql_type: str) -> Any:
    """The value → Python value of a column of `sql_type` (a Postgres type the dialect makes)."""
    kind = DIALECT.data_type_of(sql_type)
    if kind is None:
        raise SystemExit(f"the floor cannot copy into a {sql_type} column")
    if kind is DataType.FLOAT64:
        if not sql_type.startswith("numeric"):
            return lambda v: coerce(v, kind)
        return lambda v: Decimal(repr(coerce(v, kind)))
    if kind is DataType.TIMESTAMP and "with time zone" not in sql_type:
        return lambda v: coerce(v, kind).astimezone(UTC).replace(tzinfo=None)  # type: ignore[union-attr]
    return lambda v: coerce(v, kind)


DLT_WORKER = """
import sys, time, orjson, dlt
files, dsn, schema, workdir = sys.argv[1].split(","), sys.argv[2], sys.argv[3], sys.argv[4]
def events():
    for path in files:
        with open(path, "rb") as lines:
            for line in lines:
                yield orjson.loads(line)
pipeline = dlt.pipeline(pipeline_name="eventspark_bench", destination=dlt.destinations.postgres(credentials=dsn),
                        dataset_name=schema, pipelines_dir=workdir, progress=None)
started = time.perf_counter()
pipeline.run(events(), table_name="events", write_disposition="append")
print(time.perf_counter() - started)
"""


def run_dlt(files: list[Path], python: str, work: Path) -> float | None:
    schema = "bench_dlt"
    drop_schema(schema)
    env = {**os.environ, "RUNTIME__LOG_LEVEL": "WARNING", "DLT_DATA_DIR": str(work / "dlt-data")}
    done = subprocess.run(
        [
            python,
            "-c",
            DLT_WORKER,
            ",".join(map(str, files)),
            "postgresql://postgres:trust@127.0.0.1:5432/test",
            schema,
            str(work / "dlt"),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    loaded = pg_count(schema)
    drop_schema(schema)
    if done.returncode != 0:
        print(f"dlt failed (install it: pip install 'dlt[postgres]==1.31.0'):\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    expected = sum(1 for f in files for _ in f.open("rb"))
    if loaded != expected:
        print(f"dlt loaded {loaded} rows for {expected} events", file=sys.stderr)
    return float(done.stdout.strip().splitlines()[-1])


def run_latency(work: Path, master: str, session: Any) -> float:
    """Seconds from rotating a live log of 10 events to the rows being visible in Postgres."""
    root = work / "latency"
    schema = "bench_latency"
    drop_schema(schema)
    shutil.rmtree(root, ignore_errors=True)
    loaded = bench_config(root, schema, master)
    incoming = root / "events" / "incoming"
    incoming.mkdir(parents=True)
    coordination = MemoryCoordination("bench")
    # A first pass creates the table: the measured one is the steady state of a running server.
    for attempt in range(2):
        events = b"".join(orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE) for e in generate_events(10, seed=attempt))
        (incoming / live_log_name("bench")).write_bytes(events)
        started = time.perf_counter()
        rotate_incoming_logs(incoming)
        run_pass(loaded, coordination, session=session)
        while pg_count(schema) < 10 * (attempt + 1):
            time.sleep(0.01)
        elapsed = time.perf_counter() - started
    drop_schema(schema)
    return elapsed


def run_executor(work: Path, files: list[Path], n: int, types: dict[str, str] | None = None) -> float:
    """CPU seconds per event of `process_splits` over the first `n` events (one task, one split):
    into a real stage, or with `types` (the pipeline's table) written directly into a table of
    those column types (`Capabilities.direct_writes`)."""
    schema = "bench_executor"
    drop_schema(schema)
    loaded = bench_config(work / "executor", schema, "local[1]")
    dest = loaded.config.destinations["pg"]
    adapter = PostgresAdapter("pg", dest)
    path = work / "executor.log"
    with path.open("wb") as out, files[0].open("rb") as lines:
        for _ in range(n):
            out.write(next(lines))
    plan = JobPlan("bench", str(work / "executor"), {"pg": dest}, {}, {}, (), {path.name: "bench"}, {path.name: 0})
    routes = token_routes(loaded.config.api_keys, plan.destinations)
    plan.secret_tokens, plan.token_destinations, plan.default_destinations = routes
    plan.stages = {"pg": adapter.stage_target("bench0000000000")}
    if types is not None:
        _plan_direct(plan, adapter, schema, types)
    try:
        started = time.process_time()
        process_splits(plan, 0, [Split(str(path), 0, path.stat().st_size)])
        cpu = time.process_time() - started
        if types is not None and pg_count(schema) != n:
            raise SystemExit(f"the executor did not write directly: {pg_count(schema)} rows of {n} in the table")
        return cpu / n
    finally:
        adapter.close()
        drop_schema(schema)


def _plan_direct(plan: JobPlan, adapter: PostgresAdapter, schema: str, types: dict[str, str]) -> None:
    """The plan of a pass whose table exists with `types` (the steady state): direct writes."""
    direct_target = adapter.direct_target("bench0000000000")  # creates the schema
    with psycopg.connect(PG_CONNINFO, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{schema}".events ({column_defs(types)})')
    plan.direct = {"pg": direct_target}
    plan.sql_types = {"pg": {"events": dict(types)}}
    plan.existing = {"pg": {"events": {c: DIALECT.data_type_of(t) for c, t in types.items()}}}


def report_eventnative(
    work: Path, n: int, rate: float, peak: int, args: argparse.Namespace, session: Any, prime: Sequence[Path]
) -> None:
    """The pipeline on EventNative's 200k events (the first 200k of the pass) beside its figures."""
    if n != EVENTNATIVE_EVENTS:
        files = generate_logs(work / "data-200k", EVENTNATIVE_EVENTS, args.seed)  # the same first events
        with PeakRss() as rss:
            rate = EVENTNATIVE_EVENTS / run_pipeline(work, files, args.master, session, "en", prime=prime)
        peak = rss.peak
        shutil.rmtree(work / "data-200k", ignore_errors=True)
    print(
        f"EventNative 1.41, {EVENTNATIVE_EVENTS:,} events: {EVENTNATIVE_RATE:,} events/s, "
        f"{EVENTNATIVE_RSS / 1e9:.1f} GB peak RSS (quoted from issue 19, not measured here)"
    )
    print(
        f"  pipeline on the same {EVENTNATIVE_EVENTS:,} events: {rate:,.0f} events/s, {peak / 1e9:.2f} GB peak RSS: "
        f"×{rate / EVENTNATIVE_RATE:.1f} the rate (target ≥ 8), ×{peak / EVENTNATIVE_RSS:.2f} the memory"
    )


def main() -> None:
    if "--destination" in sys.argv and sys.argv[sys.argv.index("--destination") + 1 :][:1] != ["postgres"]:
        import destinations  # ClickHouse, MySQL and DuckDB: their own bench, with their own floors

        destinations.main()
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--destination", choices=["postgres", "clickhouse", "mysql", "duckdb"], default="postgres")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--no-scaling", action="store_true", help="skip the 4×N run")
    parser.add_argument(
        "--fresh-table",
        action="store_true",
        help="time passes that create their table (default: a 2,000-event pass creates it first, untimed)",
    )
    parser.add_argument("--no-dlt", action="store_true")
    parser.add_argument("--dlt-python", default=sys.executable, help="a Python with dlt[postgres] installed")
    parser.add_argument(
        "--dlt-events",
        type=int,
        default=None,
        help="give dlt only the first logs holding this many events (rate compared)",
    )
    parser.add_argument(
        "--executor-events", type=int, default=50_000, help="events of the executor-path measure (0: skip it)"
    )
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--verbose", "-v", action="store_true", help="log the phases of each pass")
    args = parser.parse_args()
    if args.verbose:
        logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")
        logging.getLogger("eventspark").setLevel(logging.INFO)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="eventspark-bench-"))
    n = args.events
    try:
        report(args, work, n)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def report(args: argparse.Namespace, work: Path, n: int) -> None:
    started = time.perf_counter()
    files = generate_logs(work / "data", n, args.seed)
    size = sum(f.stat().st_size for f in files)
    print(
        f"events: {n:,} in {len(files)} logs, {size / 1e6:,.0f} MB (generated in {time.perf_counter() - started:.1f} s)"
    )
    started = time.perf_counter()
    session = get_session(bench_config(work, "unused", args.master).config.spark)
    cores = session.sparkContext.defaultParallelism
    print(f"spark {args.master} ({cores} cores): session started in {time.perf_counter() - started:.1f} s")

    warm = generate_logs(work / "data-warm", 2_000, args.seed + 2)
    started = time.perf_counter()
    run_pipeline(work, warm, args.master, session, "warm")  # Python workers, imports, JIT of the JVM
    print(f"warm-up pass of 2,000 events: {time.perf_counter() - started:.1f} s (not counted)")
    prime = () if args.fresh_table else warm
    print("passes into " + ("a new table" if args.fresh_table else "the table an earlier pass made (steady state)"))

    types: dict[str, str] = {}
    with PeakRss() as rss:
        pipeline = run_pipeline(work, files, args.master, session, "n", types, prime)
    rate = n / pipeline
    print(f"pipeline:        {rate:>10,.0f} events/s  ({pipeline:.1f} s, {rss})")
    floors = {fmt: n / seconds for fmt, seconds in run_floor(files, types).items()}
    fmt, floor = max(floors.items(), key=lambda item: item[1])
    others = ", ".join(f"{other} {floors[other]:,.0f}" for other in floors if other != fmt)
    print(f"COPY floor:      {floor:>10,.0f} events/s  ({fmt} COPY into the pipeline's column types; {others})")
    print(f"  ratio pipeline / floor: {rate / floor:.2f}  (target ≥ 0.5)")
    report_eventnative(work, n, rate, rss.peak, args, session, prime)
    executor_n = min(args.executor_events, n, EVENTS_PER_FILE)
    if executor_n > 0:
        run_executor(work, files, min(executor_n, 2_000))  # warms the caches (UA parser, lookups)
        cpu = run_executor(work, files, executor_n)
        print(f"executor path:   {cpu * 1e6:>10.1f} µs CPU/event  ({1 / cpu:,.0f} events/s per core, one process)")
        print(f"  ratio executor core / floor: {1 / cpu / floor:.2f}")
        if getattr(PostgresAdapter.capabilities, "direct_writes", False):
            cpu = run_executor(work, files, executor_n, types)
            print(f"  the same, direct writes: {cpu * 1e6:.1f} µs CPU/event  ({1 / cpu:,.0f} events/s per core)")
    if not args.no_dlt:
        dlt_files, dlt_n = files, n
        if args.dlt_events is not None and args.dlt_events < n:
            dlt_n = args.dlt_events
            dlt_files = generate_logs(work / "data-dlt", dlt_n, args.seed)  # the same first events
        dlt_time = run_dlt(dlt_files, args.dlt_python, work)
        if dlt_time is not None:
            print(f"dlt:             {dlt_n / dlt_time:>10,.0f} events/s  ({dlt_time:.1f} s for {dlt_n:,} events)")
            print(f"  ratio pipeline / dlt:   {rate / (dlt_n / dlt_time):.2f}  (target ≥ 3)")
    latency = run_latency(work, args.master, session)
    print(f"rotate-to-visible, 10 events, warm session: {latency:.2f} s  (target ≤ 3)")
    if not args.no_scaling:
        big = generate_logs(work / "data4", 4 * n, args.seed + 1)
        big_time = run_pipeline(work, big, args.master, session, "n4", prime=prime)
        big_rate = 4 * n / big_time
        print(f"pipeline 4×N:    {big_rate:>10,.0f} events/s  ({big_time:.1f} s)")
        print(
            f"  scaling N → 4N: time ×{big_time / pipeline:.2f} (ideal 4), rate ratio {big_rate / rate:.2f} (ideal 1)"
        )


if __name__ == "__main__":
    main()
