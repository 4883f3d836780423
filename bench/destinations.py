"""Batch loads into ClickHouse, MySQL or DuckDB against a raw-insert floor measured in the same run.

    .venv/bin/python bench/destinations.py --destination clickhouse|mysql|duckdb [--events N]
        [--rounds R] [--master local[*]]

1. generates N web events (bench/generate.py) as rotated incoming logs;
2. adapter: the same events flattened and typed beforehand (untimed), then staged and committed
   through the adapter from one process (timed): the load path without Spark and the steps;
3. then R rounds, each timing the two sides one after the other (so that a burst of load from
   elsewhere on this shared machine slows both alike):
   - pipeline: one batch pass (after a 20k-event warm-up pass on the same SparkSession) into a
     new table: the step chain, staging, commit;
   - floor: the same pre-flattened rows, converted to the target's column types (untimed, once),
     inserted into a copy of that table from one process (timed: encoding + insert), the fastest
     way found: ClickHouse `INSERT ... FORMAT TabSeparated` over HTTP or the native protocol
     through clickhouse-driver (the faster of the two counts); MySQL `LOAD DATA LOCAL INFILE`;
     DuckDB its own readers of a file written beforehand (untimed): `INSERT ... SELECT FROM
     read_json` of JSON lines or `COPY ... FROM` a CSV file (the faster of the two counts).

ClickHouse is the test server of scripts/clickhouse.sh (started in a temporary folder); MySQL is
the machine's MariaDB at 127.0.0.1:3306; DuckDB a file in the temporary folder. Prints every
round, then events/s and the ratio of the best round of each side, the median ratio (target:
pipeline ≥ 0.5× the floor) and the peak RSS of the process tree during the pipeline's passes.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).parent))

from common import PeakRss, bench_config, free_port, generate_logs, stage_as_rotated
from eventspark.batch.chunks import ChunkBuffer
from eventspark.batch.process import run_pass
from eventspark.batch.session import get_session
from eventspark.config import LoadedConfig
from eventspark.config.loading import validate_config
from eventspark.coordination import MemoryCoordination
from eventspark.destinations import build_destination
from eventspark.destinations.base import DestinationAdapter, Load
from eventspark.destinations.tsv import escape
from eventspark.steps.diff import diff, table_from_header
from eventspark.steps.flatten import flatten
from eventspark.steps.typing import DataType, coerce

ROOT = Path(__file__).resolve().parent.parent
CHUNK = 50_000
WARMUP_EVENTS = 20_000
MYSQL = {"host": "127.0.0.1", "port": 3306, "username": "root"}


class Warehouse:
    """What differs between the two destinations: config, counting, the floor insert."""

    def __init__(self, kind: str, work: Path) -> None:
        self.kind = kind
        self.work = work
        self.db = f"bench_{uuid.uuid4().hex[:8]}"
        self.ch_dir = work / "clickhouse"
        self.http_port = self.tcp_port = 0

    def start(self) -> None:
        if self.kind == "clickhouse":
            self.http_port, self.tcp_port = free_port(), free_port()
            script = ROOT / "scripts" / "clickhouse.sh"
            subprocess.run(
                [str(script), "start", str(self.ch_dir), str(self.http_port), str(self.tcp_port)], check=True
            )

    def stop(self) -> None:
        if self.kind == "clickhouse":
            subprocess.run([str(ROOT / "scripts" / "clickhouse.sh"), "stop", str(self.ch_dir)], check=True)
        elif self.kind == "mysql":
            self.mysql(f"DROP DATABASE IF EXISTS `{self.db}`")

    def destination(self) -> dict[str, Any]:
        if self.kind == "clickhouse":
            return {"type": "clickhouse", "clickhouse": {"dsns": [f"http://127.0.0.1:{self.http_port}"], "db": self.db}}
        if self.kind == "duckdb":
            return {"type": "duckdb", "duckdb": {"path": str(self.duckdb_path)}}
        return {"type": "mysql", "datasource": {**MYSQL, "db": self.db}}

    @property
    def duckdb_path(self) -> Path:
        return self.work / "warehouse.duckdb"

    def duck(self, sql: str) -> list[tuple[Any, ...]]:
        """A statement on the DuckDB file (in this process, as the pipeline's driver opens it)."""
        import duckdb

        conn = duckdb.connect(str(self.duckdb_path))
        try:
            conn.execute("SET TimeZone = 'UTC'")
            return conn.execute(sql).fetchall()
        finally:
            conn.close()

    def config(self, root: Path, master: str, table: str) -> LoadedConfig:
        dest = {**self.destination(), "data_layout": {"table_name_template": table}}
        return bench_config(root, master, {"wh": dest})

    def ch(self, sql: str, data: bytes | None = None) -> bytes:
        from eventspark.destinations.clickhouse.client import Client, parse_dsn

        client = Client(parse_dsn(f"http://127.0.0.1:{self.http_port}"))
        try:
            return client.execute(sql, data=data)
        finally:
            client.close()

    def mysql(self, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True, local_infile=True)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())
        finally:
            conn.close()

    def count(self, table: str) -> int:
        if self.kind == "clickhouse":
            return int(self.ch(f"SELECT count() FROM `{self.db}`.`{table}`"))
        if self.kind == "duckdb":
            return int(self.duck(f'SELECT count(*) FROM "{table}"')[0][0])
        return int(self.mysql(f"SELECT count(*) FROM `{self.db}`.`{table}`")[0][0])

    def copy_table(self, source: str, copy: str) -> None:
        if self.kind == "clickhouse":
            self.ch(f"CREATE TABLE `{self.db}`.`{copy}` AS `{self.db}`.`{source}`")
        elif self.kind == "duckdb":
            self.duck(f'CREATE TABLE "{copy}" AS SELECT * FROM "{source}" LIMIT 0')
        else:
            self.mysql(f"CREATE TABLE `{self.db}`.`{copy}` LIKE `{self.db}`.`{source}`")


def run_pipeline(
    wh: Warehouse, work: Path, files: list[Path], master: str, session: Any, n: int, table: str = "events"
) -> float:
    root = work / f"pipeline-{table}"
    loaded = wh.config(root, master, table)
    stage_as_rotated(files, root / "events" / "incoming")
    started = time.perf_counter()
    result = run_pass(loaded, MemoryCoordination("bench"), session=session)
    elapsed = time.perf_counter() - started
    if not result.ok or wh.count(table) != n:
        raise SystemExit(f"pipeline run is wrong: ok={result.ok}, {wh.count(table)} rows for {n} events")
    shutil.rmtree(root, ignore_errors=True)
    return elapsed


def typed_chunks(files: list[Path], json_lines: bool) -> list[tuple[dict[str, DataType], Any, Any, int]]:
    """The events flattened and typed as an executor stages them, in chunks (untimed): column
    types, rows as lists (or JSON lines for a stage that reads them), header, row count."""
    chunks: list[tuple[dict[str, DataType], Any, Any, int]] = []
    buffer = ChunkBuffer("events", None, json_lines=json_lines)
    take = buffer.take_json if json_lines else buffer.take
    for path in files:
        for line in path.open("rb"):
            buffer.add(flatten(orjson.loads(line)), {})
            if len(buffer) == CHUNK:
                chunks.append((*take(), CHUNK))
    if len(buffer):
        count = len(buffer)
        chunks.append((*take(), count))
    return chunks


def run_adapter(wh: Warehouse, chunks: list[Any], work: Path, pass_bytes: int) -> float:
    """Stage and commit the typed chunks through the adapter, from this process."""
    adapter: DestinationAdapter = build_destination("wh", _validated(wh), work)
    header = chunks[0][2]
    for _columns, _rows, more, _count in chunks[1:]:
        header.merge(more)
    header.table_name = "adapter_events"
    adapter.patch(diff(adapter.read_table("adapter_events"), table_from_header(header, adapter.dialect.column_type)))
    target = adapter.read_table("adapter_events")
    assert target is not None
    started = time.perf_counter()
    stage = adapter.stage_target("bench", pass_bytes)
    writer: Any = stage.open()
    if stage.json_lines:
        staged = [writer.write_json(columns, data, count) for columns, data, _header, count in chunks]
    else:
        staged = [writer.write(columns, data) for columns, data, _header, _count in chunks]
    writer.close()
    adapter.commit(Load("wh", target, staged, ["bench-log"]))
    elapsed = time.perf_counter() - started
    adapter.close()
    return elapsed


def _validated(wh: Warehouse) -> Any:
    raw = {"destinations": {"wh": wh.destination()}}
    return validate_config(raw).destinations["wh"]


class Floor:
    """The fastest raw insert of the pre-flattened rows, converted to the target's types once."""

    def __init__(self, wh: Warehouse, chunks: list[Any], like: str) -> None:
        self.wh = wh
        wh.copy_table(like, "floor_like")
        adapter = build_destination("wh", _validated(wh), wh.work)
        target = adapter.read_table("floor_like")
        assert target is not None
        self.columns = list(target.columns)
        kinds = [adapter.data_type_of(t) for t in target.columns.values()]
        self.sql_types = list(target.columns.values())
        self.prepared = [_floor_rows(wh.kind, have, rows, self.columns, kinds) for have, rows, _h, _n in chunks]
        adapter.close()
        if wh.kind == "duckdb":
            self.files = _duck_files(wh.work / "floor", self.columns, self.prepared)

    def run(self, table: str) -> tuple[float, str]:
        """Seconds of the fastest way into `table` (a new copy of the pipeline's table), and its name."""
        wh, columns, prepared = self.wh, self.columns, self.prepared
        wh.copy_table("floor_like", table)
        if wh.kind == "duckdb":
            return _floor_duckdb(wh, table, columns, self.sql_types, self.files)
        if wh.kind != "clickhouse":
            return _timed(lambda: _floor_load_data(wh, table, columns, prepared)), "LOAD DATA LOCAL INFILE"
        results = [(_timed(lambda: _floor_http(wh, table, columns, prepared)), "HTTP TabSeparated")]
        native = _floor_native(wh, table, columns, prepared)
        if native is not None:
            results.append((native, "native protocol (clickhouse-driver)"))
        return min(results)


def _floor_rows(
    kind: str, have: dict[str, DataType], rows: list[list[Any]], columns: list[str], kinds: list[Any]
) -> list[list[Any]]:
    index = {c: i for i, c in enumerate(have)}
    out = []
    for row in rows:
        values = []
        for column, target in zip(columns, kinds, strict=True):
            value = row[index[column]] if column in index else None
            if value is not None and target is DataType.TIMESTAMP:
                value = coerce(value, DataType.TIMESTAMP).replace(tzinfo=None)  # type: ignore[union-attr]
                if kind == "clickhouse":  # DateTime text has whole seconds
                    value = value.replace(microsecond=0)
            if value is None and kind == "clickhouse":
                value = _CH_DEFAULTS.get(target, "")
            values.append(value)
        out.append(values)
    return out


_CH_DEFAULTS: dict[Any, Any] = {
    DataType.BOOL: 0,
    DataType.INT64: 0,
    DataType.FLOAT64: 0.0,
    DataType.TIMESTAMP: datetime(1970, 1, 2),
    DataType.STRING: "",
}


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _tsv(rows: list[list[Any]]) -> bytes:
    def text(v: Any) -> str:
        if v is None:
            return "\\N"
        if v is True or v is False:
            return "1" if v else "0"
        return escape(v) if isinstance(v, str) else str(v)

    return ("".join("\t".join(map(text, row)) + "\n" for row in rows)).encode()


def _floor_http(wh: Warehouse, table: str, columns: list[str], prepared: list[list[list[Any]]]) -> None:
    names = ", ".join(f"`{c}`" for c in columns)
    for rows in prepared:
        wh.ch(f"INSERT INTO `{wh.db}`.`{table}` ({names}) FORMAT TabSeparated", _tsv(rows))


def _floor_native(wh: Warehouse, table: str, columns: list[str], prepared: list[list[list[Any]]]) -> float | None:
    try:
        from clickhouse_driver import Client  # type: ignore[import-not-found]
    except ImportError:
        return None
    wh.ch(f"TRUNCATE TABLE `{wh.db}`.`{table}`")
    client = Client("127.0.0.1", port=wh.tcp_port)
    names = ", ".join(f"`{c}`" for c in columns)
    started = time.perf_counter()
    for rows in prepared:
        client.execute(f"INSERT INTO `{wh.db}`.`{table}` ({names}) VALUES", rows)
    elapsed = time.perf_counter() - started
    client.disconnect()
    return elapsed


def _duck_files(folder: Path, columns: list[str], prepared: list[list[list[Any]]]) -> tuple[Path, Path]:
    """The converted rows as one JSON-lines file (objects) and one CSV file (the table's order)."""
    import csv

    folder.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = folder / "rows.jsonl", folder / "rows.csv"
    with json_path.open("wb") as json_out, csv_path.open("w", newline="") as csv_out:
        writer = csv.writer(csv_out)
        for rows in prepared:
            json_out.writelines(
                orjson.dumps(dict(zip(columns, row, strict=True)), option=orjson.OPT_APPEND_NEWLINE) for row in rows
            )
            writer.writerows([_csv_value(v) for v in row] for row in rows)
    return json_path, csv_path


def _csv_value(value: Any) -> Any:
    # An empty unquoted field is NULL for DuckDB's CSV reader; a datetime as ISO text with offset.
    return value.isoformat() if isinstance(value, datetime) else value


def _floor_duckdb(
    wh: Warehouse, table: str, columns: list[str], sql_types: list[str], files: tuple[Path, Path]
) -> tuple[float, str]:
    """The faster of `read_json` (told the table's columns) and `COPY FROM` CSV into `table`."""
    json_path, csv_path = files
    types = ", ".join(f"{_sql_literal(c)}: {_sql_literal(t)}" for c, t in zip(columns, sql_types, strict=True))
    read_json = (
        f'INSERT INTO "{table}" SELECT * FROM read_json({_sql_literal(json_path)}, '
        f"format = 'newline_delimited', columns = {{{types}}})"
    )
    copy = f'COPY "{table}" FROM {_sql_literal(csv_path)} (FORMAT csv, HEADER false)'
    results = []
    for how, statement in (("read_json", read_json), ("COPY FROM CSV", copy)):
        wh.duck(f'DELETE FROM "{table}"')
        results.append((_timed(lambda statement=statement: wh.duck(statement)), how))
        if wh.count(table) != sum(1 for _ in json_path.open("rb")):
            raise SystemExit(f"duckdb floor {how} loaded {wh.count(table)} rows")
    (best, how), (other, other_how) = sorted(results)
    return best, f"{how}; {other_how} {other / best:.2f}x its time"


def _sql_literal(text: Path | str) -> str:
    return "'" + str(text).replace("'", "''") + "'"


def _floor_load_data(wh: Warehouse, table: str, columns: list[str], prepared: list[list[list[Any]]]) -> None:
    import pymysql

    names = ", ".join(f"`{c}`" for c in columns)
    conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True, local_infile=True)
    try:
        with conn.cursor() as cur, tempfile.NamedTemporaryFile(suffix=".tsv") as file:
            for rows in prepared:
                file.seek(0)
                file.truncate()
                file.write(_tsv(rows))
                file.flush()
                cur.execute(
                    f"LOAD DATA LOCAL INFILE %s INTO TABLE `{wh.db}`.`{table}` CHARACTER SET utf8mb4 ({names})",
                    (file.name,),
                )
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--destination", choices=["clickhouse", "mysql", "duckdb"], required=True)
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--rounds", type=int, default=3, help="pipeline and floor runs, taking turns")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--verbose", "-v", action="store_true", help="log the phases of each pass")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    if args.verbose:
        logging.getLogger("eventspark").setLevel(logging.INFO)
    work = Path(tempfile.mkdtemp(prefix="eventspark-bench-"))
    wh = Warehouse(args.destination, work)
    wh.start()
    try:
        report(args, wh, work)
    finally:
        wh.stop()
        shutil.rmtree(work, ignore_errors=True)


def report(args: argparse.Namespace, wh: Warehouse, work: Path) -> None:
    n = args.events
    files = generate_logs(work / "logs", n, args.seed)
    from eventspark.config.models import SparkConfig

    session = get_session(SparkConfig(master=args.master))
    # A first pass warms the Python workers (imports, UA parser, lookups), as a running node has.
    warmup = generate_logs(work / "warmup", WARMUP_EVENTS, args.seed + 1)
    run_pipeline(wh, work, warmup, args.master, session, WARMUP_EVENTS, table="warmup")
    pass_bytes = sum(path.stat().st_size for path in files)
    adapter = run_adapter(wh, typed_chunks(files, json_lines=wh.kind == "clickhouse"), work, pass_bytes)
    floor: Floor | None = None
    pipelines, floors, peaks = [], [], []
    print(f"{args.destination}: {n} events, master {args.master}, {os.cpu_count()} CPUs")
    for round_ in range(args.rounds):
        with PeakRss() as rss:
            pipelines.append(run_pipeline(wh, work, files, args.master, session, n, table=f"events{round_}"))
        peaks.append(rss)
        if floor is None:  # the floor's tables copy the one the pipeline made
            floor = Floor(wh, typed_chunks(files, json_lines=False), like="events0")
        seconds, how = floor.run(f"floor{round_}")
        floors.append(seconds)
        print(f"  round {round_ + 1}: pipeline {n / pipelines[-1]:9,.0f} events/s, floor {n / seconds:9,.0f} ({how})")
    best_floor, best_pipeline = min(floors), min(pipelines)
    ratio_median = statistics.median(f / p for f, p in zip(floors, pipelines, strict=True))
    print(f"  floor, best round:           {n / best_floor:12,.0f} events/s")
    print(f"  adapter stage+commit:        {n / adapter:12,.0f} events/s  ({best_floor / adapter:.2f}x floor)")
    ratio = best_floor / best_pipeline
    print(f"  pipeline, best round:        {n / best_pipeline:12,.0f} events/s  ({ratio:.2f}x floor)")
    print(f"  median of the rounds' ratios: {ratio_median:.2f}x")
    print(f"  a pass's highest peak (bench, JVM, Python workers): {max(peaks, key=lambda rss: rss.peak)}")
    print(f"  target pipeline >= 0.5x floor: {'met' if ratio >= 0.5 else 'MISSED'}")


if __name__ == "__main__":
    main()
