"""ClickHouse adapter over the HTTP interface (18.16 to current releases).

Batch: each executor chunk becomes its own staging table (`Memory` for a pass of up to 512 MiB of
logs, else `Log`), written with one `INSERT ... FORMAT JSONEachRow` of rows the executor encoded
one by one (50,000 rows by default). The driver commits a pair: the stage is counted (every
staged row must be there), the chunks are cast to the target's exact types and copied into it
with `INSERT ... SELECT` (a few at once for a large pair; through a *prepared* table first when a
cast can be refused, so that a bad value fails before the target is touched); then the stage is
counted again and one marker row per source file is written.

ClickHouse has no transactions, so the guarantee is this: a failed cast leaves the target
unchanged; a crash, a lost connection, one of the concurrent copies failing, or a stage found
short after the copy (a restart during it), all after the copy started and before the marker was
written, make the rerun insert the pair's events again, and those copies carry the same ORDER BY key
(`eventn_ctx_event_id` by default), which ReplacingMergeTree collapses into one row when parts
merge. Queries see every event exactly once with `FINAL` or after `OPTIMIZE TABLE ... FINAL`.
A table whose engine keeps duplicates (a custom `raw_statement`, or no event id column) gets
at-least-once in that window. Stream mode appends rows the same way (no upsert before merges).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from eventspark.destinations.base import (
    LOADS_TABLE,
    STAGE_PREFIX,
    DestinationError,
    Load,
    StagedChunk,
    TerminalError,
    TransientError,
)
from eventspark.destinations.clickhouse import rows as row_text
from eventspark.destinations.clickhouse.capabilities import CAPABILITIES
from eventspark.destinations.clickhouse.configuration import ClickHouseConfig, ClickHouseDestination
from eventspark.destinations.clickhouse.ddl import (
    DIST_PREFIX,
    KeyField,
    Layout,
    add_column_statements,
    create_statements,
    literal,
    quote,
)
from eventspark.destinations.clickhouse.dialect import DIALECT
from eventspark.destinations.clickhouse.http import Client, Endpoint, error_code, parse_dsn
from eventspark.destinations.clickhouse.load import casts_cannot_fail, copy_groups, data_type_of, prepare_select
from eventspark.destinations.staging import (
    StagingTableAdapter,
    is_user_table,
    load_columns,
    new_stage_table,
    started_before,
    tables_from_columns,
)
from eventspark.destinations.tsv import STAGE_ENCODERS, encode_rows
from eventspark.steps.diff import Table, TablePatch
from eventspark.steps.typing import DataType

log = logging.getLogger(__name__)

STAGE_TYPES: dict[DataType, str] = {
    DataType.BOOL: "Nullable(UInt8)",
    DataType.INT64: "Nullable(Int64)",
    DataType.FLOAT64: "Nullable(Float64)",
    DataType.TIMESTAMP: "Nullable(String)",
    DataType.STRING: "Nullable(String)",
}
DUPLICATE_COLUMN = 44
_TSV_INSERT = "INSERT INTO {} ({}) FORMAT TabSeparated"
_SKIP_UNKNOWN = {"input_format_skip_unknown_fields": "1"}
MEMORY_STAGE_MAX_BYTES = 512 * 1024 * 1024
"""Passes over at most this many bytes of logs stage in Memory tables, larger ones in Log tables."""
MEMORY_STAGE_MAX_AGE = 3600.0
"""Seconds after which a Memory staging table is a killed pass's leftover (passes this small last
minutes); `drop_stale_stages` drops it."""


def stage_engine(pass_bytes: int) -> str:
    """The staging tables' engine for a pass reading `pass_bytes` of logs (0: not known).

    Memory tables cost the server no compression and no disk writes, and are read back faster; the
    server holds them in RAM until the commit drops them, hence the bound. A restart empties them,
    which the commit notices (`ClickHouseAdapter._check_stage`).
    """
    return "Memory" if 0 < pass_bytes <= MEMORY_STAGE_MAX_BYTES else "Log"


def layout_of(config: ClickHouseConfig) -> Layout:
    """The destination's `clickhouse` block as a Layout; TerminalError for a bad key function."""
    engine = config.engine
    layout = Layout(
        db=config.db,
        cluster=config.cluster or None,
        raw_statement=engine.raw_statement,
        nullable_fields=frozenset(engine.nullable_fields),
        partition_fields=tuple(KeyField(f.field, f.function) for f in engine.partition_fields),
        order_fields=tuple(KeyField(f.field, f.function) for f in engine.order_fields),
        primary_keys=tuple(engine.primary_keys),
    )
    try:
        for key in (*layout.partition_fields, *layout.order_fields):
            key.sql()
    except ValueError as exc:
        raise TerminalError(str(exc)) from exc
    return layout


def _insert_sql(name: str, columns: Iterable[str]) -> str:
    return _TSV_INSERT.format(name, ", ".join(quote(c) for c in columns))


@dataclass(frozen=True, slots=True)
class ClickHouseStageTarget:
    """Picklable: the server (the one the driver uses) and database where a job stages."""

    endpoint: Endpoint
    db: str
    job_id: str
    engine: str = "Log"
    """The staging tables' engine: Memory for a pass small enough (`stage_engine`), else Log."""

    json_lines: ClassVar[bool] = True

    def open(self) -> ClickHouseStageWriter:
        return ClickHouseStageWriter(self)


class ClickHouseStageWriter:
    """One HTTP connection per executor task; each chunk becomes its own Log table."""

    def __init__(self, target: ClickHouseStageTarget) -> None:
        self._target = target
        self._client = Client(target.endpoint)

    def write(self, columns: Mapping[str, DataType], rows: Sequence[Sequence[Any]]) -> StagedChunk:
        body = encode_rows(rows, [STAGE_ENCODERS[t] for t in columns.values()])
        return self._stage(columns, len(rows), "TabSeparated", body)

    def write_json(self, columns: Mapping[str, DataType], lines: bytes | bytearray, rows: int) -> StagedChunk:
        return self._stage(columns, rows, "JSONEachRow", lines)

    def _stage(
        self, columns: Mapping[str, DataType], count: int, data_format: str, body: bytes | bytearray
    ) -> StagedChunk:
        ref = new_stage_table(self._target.job_id)
        name = f"{quote(self._target.db)}.{quote(ref)}"
        defs = ", ".join(f"{quote(c)} {STAGE_TYPES[t]}" for c, t in columns.items())
        doing = f"staging {count} rows"
        self._client.execute(f"CREATE TABLE {name} ({defs}) ENGINE = {self._target.engine}", doing=doing)
        insert = f"INSERT INTO {name} ({', '.join(quote(c) for c in columns)}) FORMAT {data_format}"
        # JSON rows may name columns that are null in every row of the chunk: it has none of them.
        self._client.execute(insert, body, doing=doing, settings=_SKIP_UNKNOWN)
        return StagedChunk(ref, dict(columns), count)

    def close(self) -> None:
        self._client.close()


class ClickHouseAdapter(StagingTableAdapter):
    """A ClickHouse database (created when missing), reached through the first DSN that answers."""

    dialect = DIALECT
    capabilities = CAPABILITIES

    def __init__(self, dest_id: str, dest: ClickHouseDestination) -> None:
        config = dest.clickhouse
        self.dest_id = dest_id
        self.endpoints = [parse_dsn(dsn, config.tls) for dsn in config.dsns]
        self.layout = layout_of(config)
        self.schema = config.db
        self._client: Client | None = None

    def _connection(self) -> Client:
        if self._client is None:
            error: DestinationError = TransientError("clickhouse: no DSN configured")
            for endpoint in self.endpoints:
                client = Client(endpoint)
                try:
                    self._prepare(client)
                except TransientError as exc:
                    client.close()
                    error = exc
                    continue
                self._client = client
                break
            else:
                raise error
        return self._client

    def _prepare(self, client: Client) -> None:
        layout = self.layout
        client.execute(f"CREATE DATABASE IF NOT EXISTS {quote(layout.db)}{layout.on_cluster()}", doing="connecting")
        engine = "ReplacingMergeTree()"
        if layout.cluster:
            path = f"/clickhouse/tables/{{shard}}/{layout.db}/{LOADS_TABLE}"
            engine = f"ReplicatedReplacingMergeTree({literal(path)}, '{{replica}}')"
        client.execute(
            f"CREATE TABLE IF NOT EXISTS {self._name(LOADS_TABLE)}{layout.on_cluster()} (dest_id String, "
            f"file String, table_name String, loaded_at DateTime DEFAULT now()) ENGINE = {engine} "
            "ORDER BY (dest_id, file, table_name)",
            doing="connecting",
        )

    def _name(self, table: str) -> str:
        return self.layout.name(table)

    def data_type_of(self, sql_type: str) -> DataType | None:
        return data_type_of(sql_type)

    # --- tables -------------------------------------------------------------------------------

    def _read(self, name: str | None) -> dict[str, Table]:
        client = self._connection()
        where = f"database = {literal(self.layout.db)}"
        columns = client.rows(
            f"SELECT table, name, type FROM system.columns WHERE {where}"
            + (f" AND table = {literal(name)}" if name is not None else ""),
            doing="reading tables",
        )
        keys = client.rows(
            f"SELECT name, sorting_key FROM system.tables WHERE {where}"
            + (f" AND name = {literal(name)}" if name is not None else ""),
            doing="reading tables",
        )
        tables = tables_from_columns(columns, self._is_own)
        for table, sorting_key in keys:
            if table in tables:
                tables[table].primary_keys = key_columns(sorting_key)
        return tables

    def _is_own(self, table: str) -> bool:
        """False for eventspark's stage and marker tables and, with a cluster, Distributed tables."""
        return is_user_table(table) and not (self.layout.cluster and table.startswith(DIST_PREFIX))

    def patch(self, patch: TablePatch) -> None:
        client = self._connection()
        doing = f"patching table {patch.table!r}"
        if patch.create:
            for statement in create_statements(self.layout, patch.table, patch.add_columns, patch.primary_keys or ()):
                client.execute(statement, doing=doing)
            return
        if patch.primary_keys is not None:
            current = self.read_table(patch.table)
            have = current.primary_keys if current is not None else ()
            raise TerminalError(
                f"clickhouse: {doing}: the ORDER BY key of an existing table cannot change "
                f"(it is {list(have)}, primary_key_fields ask for {list(patch.primary_keys)})"
            )
        for statement in add_column_statements(self.layout, patch.table, patch.add_columns):
            try:
                client.execute(statement, doing=doing)
            except TerminalError as exc:
                # Another node added it first (18.x has no ADD COLUMN IF NOT EXISTS).
                if error_code(exc) != DUPLICATE_COLUMN and "already exists" not in str(exc):
                    raise

    # --- batch --------------------------------------------------------------------------------

    def stage_target(self, job_id: str, pass_bytes: int = 0) -> ClickHouseStageTarget:
        endpoint = self._connection().endpoint
        return ClickHouseStageTarget(endpoint, self.layout.db, job_id, stage_engine(pass_bytes))

    def commit(self, load: Load) -> None:
        client = self._connection()
        doing = f"loading table {load.table.name!r}"
        if load.chunks:
            self._check_stage(client, load, doing)
            columns = load_columns(load)
            names = ", ".join(quote(c) for c in columns)
            target = self.layout.insert_target(load.table.name)
            if casts_cannot_fail(load, columns):
                source = {chunk.ref: self._name(chunk.ref) for chunk in load.chunks}
                inserts = [
                    f"INSERT INTO {target} ({names}) {prepare_select(group, columns, source)}"
                    for group in copy_groups(load)
                ]
                self._run_at_once(client, inserts, doing)
            else:
                prepared = self._name(f"{load.chunks[0].ref}_load")
                self._prepare_rows(client, load, columns, prepared, doing)
                client.execute(f"INSERT INTO {target} ({names}) SELECT {names} FROM {prepared}", doing=doing)
            self._check_stage(client, load, doing)
        if load.files:
            markers = [[load.dest_id, f, load.table.name] for f in load.files]
            body = encode_rows(markers, [STAGE_ENCODERS[DataType.STRING]] * 3)
            client.execute(_insert_sql(self._name(LOADS_TABLE), ["dest_id", "file", "table_name"]), body, doing)
        refs = [f"{load.chunks[0].ref}_load"] if load.chunks else []
        self._drop(client, refs + [chunk.ref for chunk in load.chunks])

    def _check_stage(self, client: Client, load: Load, doing: str) -> None:
        """TransientError unless the stage still holds every row the executors staged. Checked
        before the copy (nothing copied yet) and after it: a Memory table emptied by a restart
        stays empty, so full counts after the copy mean it read every row. A restart during the
        copy fails the pair after some rows went in; the rerun inserts them again (see the
        module docstring on duplicates)."""
        counts = " UNION ALL ".join(
            f"SELECT {literal(chunk.ref)}, count() FROM {self._name(chunk.ref)}" for chunk in load.chunks
        )
        found = {ref: int(count) for ref, count in client.rows(counts, doing=doing)}
        for chunk in load.chunks:
            if found.get(chunk.ref) != chunk.rows:
                raise TransientError(
                    f"clickhouse: {doing}: staging table {chunk.ref} holds {found.get(chunk.ref)} of its "
                    f"{chunk.rows} rows (was the server restarted?); the logs are kept for the next pass"
                )

    def _run_at_once(self, client: Client, statements: list[str], doing: str) -> None:
        """Runs the statements concurrently, the first on `client`, the others on connections of
        their own; raises the first error once all have ended."""
        if len(statements) == 1:
            client.execute(statements[0], doing=doing)
            return
        extra = [Client(client.endpoint) for _ in statements[1:]]
        try:
            with ThreadPoolExecutor(len(statements)) as pool:
                runs = [
                    pool.submit(c.execute, sql, None, doing)
                    for c, sql in zip([client, *extra], statements, strict=True)
                ]
                errors = [run.exception() for run in runs]
        finally:
            for other in extra:
                other.close()
        first = next((error for error in errors if error is not None), None)
        if first is not None:
            raise first

    def _prepare_rows(self, client: Client, load: Load, columns: list[str], prepared: str, doing: str) -> None:
        """Casts every chunk into `prepared` (the target's column types); drops it on failure."""
        defs = ", ".join(f"{quote(c)} {load.table.columns[c]}" for c in columns)
        source = {chunk.ref: self._name(chunk.ref) for chunk in load.chunks}
        select = prepare_select(load, columns, source)
        names = ", ".join(quote(c) for c in columns)
        client.execute(f"DROP TABLE IF EXISTS {prepared}", doing=doing)
        client.execute(f"CREATE TABLE {prepared} ({defs}) ENGINE = Log", doing=doing)
        try:
            client.execute(f"INSERT INTO {prepared} ({names}) {select}", doing=doing)
        except DestinationError:
            self._drop(client, [prepared], qualified=True)
            raise

    def _drop(self, client: Client, tables: list[str], qualified: bool = False) -> None:
        # After the marker is written a failed DROP loses nothing: drop_stages retries it.
        for table in tables:
            try:
                client.execute(f"DROP TABLE IF EXISTS {table if qualified else self._name(table)}", doing="dropping")
            except DestinationError as exc:
                log.warning("clickhouse: could not drop staging table %s: %s", table, exc)

    def loaded_files(self, dest_id: str, files: Iterable[str]) -> set[tuple[str, str]]:
        wanted = list(files)
        if not wanted:
            return set()
        rows = self._connection().rows(
            f"SELECT DISTINCT file, table_name FROM {self._name(LOADS_TABLE)} "
            f"WHERE dest_id = {literal(dest_id)} AND file IN ({', '.join(literal(f) for f in wanted)})",
            doing="reading load markers",
        )
        return {(f, t) for f, t in rows}

    def drop_stale_stages(self, before: float) -> None:
        # A killed pass's Memory tables hold server RAM: they go after an hour, not a day.
        memory_before = max(before, time.time() - MEMORY_STAGE_MAX_AGE)
        self._drop_stages_where(started_before(before), memory=started_before(memory_before))

    def _drop_stages_where(self, matches: Callable[[str], bool], memory: Callable[[str], bool] | None = None) -> None:
        """Drops the staging tables whose job part matches (`memory`, if given, for Memory ones)."""
        client = self._connection()
        rows = client.rows(
            f"SELECT name, engine FROM system.tables WHERE database = {literal(self.layout.db)} "
            f"AND substring(name, 1, {len(STAGE_PREFIX)}) = {literal(STAGE_PREFIX)}",
            doing="listing staging tables",
        )
        for name, engine in rows:
            test = memory if memory is not None and engine == "Memory" else matches
            if test(name[len(STAGE_PREFIX) :]):
                client.execute(f"DROP TABLE IF EXISTS {self._name(name)}", doing="dropping staging tables")

    # --- stream -------------------------------------------------------------------------------

    def insert(self, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
        """Appends rows, one INSERT per set of non-NULL columns (the others get their defaults)."""
        client = self._connection()
        target = self.layout.insert_target(table.name)
        doing = f"inserting into {table.name!r}"
        for columns, group in row_text.group_by_columns(rows).items():
            body = row_text.encode(table, columns, group, self.data_type_of)
            client.execute(_insert_sql(target, columns), body, doing=doing, settings=row_text.SETTINGS)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def key_columns(sorting_key: str) -> tuple[str, ...]:
    """The plain columns of a `system.tables.sorting_key` text (`a, b`, with backquoted names)."""
    found: list[str] = []
    for part in _split_top_level(sorting_key):
        if part.startswith("`") and part.endswith("`") and len(part) >= 2:
            found.append(part[1:-1].replace("\\`", "`").replace("\\\\", "\\"))
        elif part and all(ch.isalnum() or ch == "_" for ch in part):
            found.append(part)
    return tuple(found)


def _split_top_level(text: str) -> list[str]:
    parts, depth, quoted, current = [], 0, False, []
    escaped = False
    for ch in text:
        if quoted:
            quoted = escaped or ch != "`"
            escaped = not escaped and ch == "\\"
        elif ch == "`":
            quoted = True
        elif ch in "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    parts.append("".join(current).strip())
    return [p for p in parts if p]


def build(dest_id: str, dest: ClickHouseDestination, events_dir: Path) -> ClickHouseAdapter:
    return ClickHouseAdapter(dest_id, dest)
