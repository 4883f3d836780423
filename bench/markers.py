"""What removing the load markers of archived logs costs a pass (`forget_loaded`), on Postgres.

Fills a fresh schema's `_eventspark_loads` with `--markers` per-split markers (10 per log), then,
for passes archiving 1, 20 and 200 logs, times through the real adapter the read every pass makes
of those logs' split markers (`loaded_splits`, the baseline) and the DELETE of them
(`forget_loaded`), and prints the ratio. Run: `.venv/bin/python bench/markers.py` (the machine's
Postgres, database `test`).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from pathlib import Path
from tempfile import TemporaryDirectory

import psycopg

from eventspark.config.loading import validate_config
from eventspark.destinations import build_destination
from eventspark.destinations.base import LOADS_TABLE

SPLITS_PER_LOG = 10


def log_name(n: int) -> str:
    return f"incoming.tok=bench-{n:08d}.log"


def fill(conninfo: str, schema: str, markers: int) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}"."{LOADS_TABLE}" (dest_id, file, table_name) '
            f"SELECT 'pg', 'incoming.tok=bench-' || lpad((g / {SPLITS_PER_LOG})::text, 8, '0') || '.log@' "
            f"|| (g % {SPLITS_PER_LOG}) || '-1', 't' FROM generate_series(0, {markers - 1}) g"
        )
        conn.execute(f'ANALYZE "{schema}"."{LOADS_TABLE}"')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markers", type=int, default=1_000_000, help="markers in the table (default 1M)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5432)
    parser.add_argument("--db", default="test")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    schema = f"bench_markers_{uuid.uuid4().hex[:8]}"
    conninfo = f"host={args.host} port={args.port} dbname={args.db} user=postgres"
    datasource = {"host": args.host, "port": args.port, "db": args.db, "schema": schema, "username": "postgres"}
    config = validate_config({"destinations": {"pg": {"type": "postgres", "datasource": datasource}}})
    with TemporaryDirectory() as tmp:
        adapter = build_destination("pg", config.destinations["pg"], Path(tmp))
        try:
            adapter.read_tables()  # connects: the schema and the marker table with its index
            fill(conninfo, schema, args.markers)
            next_log = 0
            print(f"{args.markers:,} markers in the table, {SPLITS_PER_LOG} per log")
            for count in (1, 20, 200):
                reads, deletes = [], []
                for _ in range(args.repeats):
                    logs = [log_name(next_log + i) for i in range(count)]
                    next_log += count
                    started = time.perf_counter()
                    found = adapter.loaded_splits("pg", logs)
                    reads.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    adapter.forget_loaded("pg", logs)
                    deletes.append(time.perf_counter() - started)
                    assert len(found) == count * SPLITS_PER_LOG and not adapter.loaded_splits("pg", logs)
                read, delete = statistics.median(reads) * 1000, statistics.median(deletes) * 1000
                print(
                    f"{count:4d} archived log(s): read of their markers {read:6.1f} ms, removal {delete:6.1f} ms, "
                    f"ratio {delete / read:.2f}"
                )
        finally:
            adapter.close()
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
