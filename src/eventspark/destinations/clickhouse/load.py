"""ClickHouse: what differs from the shared SQL load (`sql.warehouse.SqlWarehouse`), over the HTTP
interface (18.16 to current releases).

Batch: each executor chunk becomes its own staging table (`Memory` for a pass of up to 512 MiB of
logs, else `Log`), written with one `INSERT ... FORMAT JSONEachRow` of rows the executor encoded
one by one (50,000 rows by default). The commit (no transaction: `Capabilities.transactions` is
false) counts the stage (every staged row must be there), casts the chunks to the target's exact
types and copies them with `INSERT ... SELECT` (a few at once for a large pair; through a
*prepared* table first when a cast can be refused, so that a bad value fails before the target
is touched); then counts the stage again, and the shared code writes one marker row per file.

Without transactions the guarantee is this: a failed cast leaves the target unchanged; a crash, a
lost connection, one of the concurrent copies failing, or a stage found short after the copy (a
restart during it), all after the copy started and before the marker was written, make the rerun
insert the pair's events again, and those copies carry the same ORDER BY key
(`eventn_ctx_event_id` by default), which ReplacingMergeTree collapses into one row when parts
merge (`Capabilities.upsert == "replacing_engine"`). Queries see every event exactly once with
`FINAL` or after `OPTIMIZE TABLE ... FINAL`. A table whose engine keeps duplicates (a custom
`raw_statement`, or no event id column) gets at-least-once in that window. Stream mode appends
rows the same way, in groups naming only their non-NULL columns (TSV, `best_effort` timestamps).

Casts: staging columns are Nullable stage types (timestamps as RFC 3339 text). For a
non-nullable column a NULL becomes the type's default (`assumeNotNull(CAST(NULL AS Nullable(T)))`:
0, '', the zero date). Text going to a non-text column is cast *after* replacing NULL, because
ClickHouse 18 casts unparsable text to NULL when the cast goes to a Nullable type but raises when
it does not: a bad value must fail the load. When every staged column meets a target type that
takes any of its values (`casts_cannot_fail`), the cast rows go straight into the target. A large
copy is cut into a few INSERTs of whole chunks (`copy_groups`) that run at once, since ClickHouse
writes the rows of one INSERT on one thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from eventspark.destinations.base import (
    LOADS_TABLE,
    ORDER_COLUMN,
    STAGE_PREFIX,
    DestinationError,
    Load,
    StagedChunk,
    TerminalError,
    TransientError,
)
from eventspark.destinations.clickhouse.capabilities import CAPABILITIES
from eventspark.destinations.clickhouse.client import ClickHouseStageTarget, Client, error_code, parse_dsn
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
from eventspark.destinations.clickhouse.dialect import DIALECT, base_type, data_type_of
from eventspark.destinations.sql.statements import load_columns
from eventspark.destinations.sql.warehouse import SqlClient, SqlWarehouse
from eventspark.destinations.tsv import escape
from eventspark.steps.diff import Table, TablePatch
from eventspark.steps.typing import DataType

log = logging.getLogger(__name__)

DUPLICATE_COLUMN = 44
MEMORY_STAGE_MAX_BYTES = 512 * 1024 * 1024
"""Passes over at most this many bytes of logs stage in Memory tables, larger ones in Log tables."""
MEMORY_STAGE_MAX_AGE = 3600.0
"""Seconds after which a Memory staging table is a killed pass's leftover (passes this small last
minutes); `drop_stale_stages` drops it."""
STREAM_SETTINGS = {"date_time_input_format": "best_effort"}
"""Stream rows carry RFC 3339 timestamps: parsed with their offsets, whatever the server's zone."""


def build(dest_id: str, dest: ClickHouseDestination, events_dir: Path) -> ClickHouseWarehouse:
    return ClickHouseWarehouse(dest_id, dest)


def stage_engine(pass_bytes: int) -> str:
    """The staging tables' engine for a pass reading `pass_bytes` of logs (0: not known).

    Memory tables cost the server no compression and no disk writes, and are read back faster; the
    server holds them in RAM until the commit drops them, hence the bound. A restart empties them,
    which the commit notices (`ClickHouseWarehouse._check_stage`).
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


class ClickHouseWarehouse(SqlWarehouse):
    """A ClickHouse database (created when missing), reached through the first DSN that answers."""

    dialect = DIALECT
    capabilities = CAPABILITIES
    MARKER_TABLE = ""  # built by `_prepare_statements`: the engine depends on the cluster

    def __init__(self, dest_id: str, dest: ClickHouseDestination) -> None:
        config = dest.clickhouse
        super().__init__(dest_id, config.db)
        self.endpoints = [parse_dsn(dsn, config.tls) for dsn in config.dsns]
        self.layout = layout_of(config)

    def _connect(self) -> Client:
        error: DestinationError = TransientError("clickhouse: no DSN configured")
        for endpoint in self.endpoints:
            client = Client(endpoint)
            try:
                client.execute("SELECT 1", "connecting")
            except TransientError as exc:
                client.close()
                error = exc
                continue
            return client
        raise error

    def _prepare_statements(self) -> list[str]:
        layout, loads = self.layout, self.name(LOADS_TABLE)
        engine = "ReplacingMergeTree()"
        if layout.cluster:
            path = f"/clickhouse/tables/{{shard}}/{layout.db}/{LOADS_TABLE}"
            engine = f"ReplicatedReplacingMergeTree({literal(path)}, '{{replica}}')"
        return [
            f"CREATE DATABASE IF NOT EXISTS {quote(layout.db)}{layout.on_cluster()}",
            f"CREATE TABLE IF NOT EXISTS {loads}{layout.on_cluster()} (dest_id String, file String, "
            f"table_name String, loaded_at DateTime DEFAULT now()) ENGINE = {engine} "
            "ORDER BY (dest_id, file, table_name)",
        ]

    def forget_loaded(self, dest_id: str, logs: Sequence[str]) -> None:
        """Keeps the markers: a DELETE here is a mutation that rewrites the table's parts, too
        heavy for every pass. ClickHouse writes no per-split markers, only one per log and table."""

    # --- tables -------------------------------------------------------------------------------

    def _catalog(self, client: SqlClient, name: str | None) -> tuple[list[Any], list[tuple[str, Sequence[str]]]]:
        where = f"database = {literal(self.layout.db)}"
        columns = client.rows(
            f"SELECT table, name, type FROM system.columns WHERE {where}"
            + (f" AND table = {literal(name)}" if name is not None else ""),
            "reading tables",
        )
        keys = client.rows(
            f"SELECT name, sorting_key FROM system.tables WHERE {where}"
            + (f" AND name = {literal(name)}" if name is not None else ""),
            "reading tables",
        )
        return columns, [(table, key_columns(sorting_key)) for table, sorting_key in keys]

    def _is_user_table(self, name: str) -> bool:
        """False for eventspark's stage and marker tables and, with a cluster, Distributed tables."""
        return super()._is_user_table(name) and not (self.layout.cluster and name.startswith(DIST_PREFIX))

    def drop_statements(self, table: str) -> list[str]:
        """The probe's DROP (`sql/probe.py`): the table and, with a cluster, its Distributed table."""
        layout = self.layout
        names = [DIST_PREFIX + table, table] if layout.cluster else [table]
        return [f"DROP TABLE {layout.name(name)}{layout.on_cluster()}" for name in names]

    def _create_statements(self, patch: TablePatch) -> list[str]:
        return create_statements(self.layout, patch.table, patch.add_columns, patch.primary_keys or ())

    def _add_column(self, client: SqlClient, table: str, column: str, sql_type: str, doing: str) -> None:
        for statement in add_column_statements(self.layout, table, {column: sql_type}):
            try:
                client.execute(statement, doing)
            except TerminalError as exc:
                # Another node added it first (18.x has no ADD COLUMN IF NOT EXISTS).
                if error_code(exc) != DUPLICATE_COLUMN and "already exists" not in str(exc):
                    raise

    def _key_statements(self, client: SqlClient, table: str, keys: tuple[str, ...]) -> list[str]:
        current = self.read_table(table)
        have = current.primary_keys if current is not None else ()
        raise TerminalError(
            f"clickhouse: patching table {table!r}: the ORDER BY key of an existing table cannot change "
            f"(it is {list(have)}, primary_key_fields ask for {list(keys)})"
        )

    # --- batch --------------------------------------------------------------------------------

    def stage_target(self, job_id: str, pass_bytes: int = 0) -> ClickHouseStageTarget:
        endpoint = self._connection().endpoint  # type: ignore[attr-defined]
        return ClickHouseStageTarget(endpoint, self.layout.db, job_id, stage_engine(pass_bytes))

    def _copy(self, client: SqlClient, load: Load, doing: str) -> None:
        assert isinstance(client, Client)
        if not load.chunks:
            return
        self._check_stage(client, load, doing)
        columns = load_columns(load)
        names = ", ".join(quote(c) for c in columns)
        target = self.layout.insert_target(load.table.name)
        source = {chunk.ref: self.name(chunk.ref) for chunk in load.chunks}
        if casts_cannot_fail(load, columns):
            inserts = [
                f"INSERT INTO {target} ({names}) {prepare_select(group, columns, source)}"
                for group in copy_groups(load)
            ]
            self._run_at_once(client, inserts, doing)
        else:
            prepared = self.name(f"{load.chunks[0].ref}_load")
            self._prepare_rows(client, load, columns, prepared, doing)
            try:
                client.execute(f"INSERT INTO {target} ({names}) SELECT {names} FROM {prepared}", doing)
            finally:
                self._drop_quietly(client, prepared)
        self._check_stage(client, load, doing)

    def _check_stage(self, client: Client, load: Load, doing: str) -> None:
        """TransientError unless the stage still holds every row the executors staged. Checked
        before the copy (nothing copied yet) and after it: a Memory table emptied by a restart
        stays empty, so full counts after the copy mean it read every row. A restart during the
        copy fails the pair after some rows went in; the rerun inserts them again (see the
        module docstring on duplicates)."""
        counts = " UNION ALL ".join(
            f"SELECT {literal(chunk.ref)}, count() FROM {self.name(chunk.ref)}" for chunk in load.chunks
        )
        found = {ref: int(count) for ref, count in client.rows(counts, doing)}
        for chunk in load.chunks:
            if found.get(chunk.ref) != chunk.rows:
                raise TransientError(
                    f"clickhouse: {doing}: staging table {chunk.ref} holds {found.get(chunk.ref)} of its "
                    f"{chunk.rows} rows (was the server restarted?); the logs are kept for the next pass"
                )

    @staticmethod
    def _run_at_once(client: Client, statements: list[str], doing: str) -> None:
        """Runs the statements concurrently, the first on `client`, the others on connections of
        their own; raises the first error once all have ended."""
        if len(statements) == 1:
            client.execute(statements[0], doing)
            return
        extra = [Client(client.endpoint) for _ in statements[1:]]
        try:
            with ThreadPoolExecutor(len(statements)) as pool:
                runs = [pool.submit(c.execute, sql, doing) for c, sql in zip([client, *extra], statements, strict=True)]
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
        source = {chunk.ref: self.name(chunk.ref) for chunk in load.chunks}
        names = ", ".join(quote(c) for c in columns)
        client.execute(f"DROP TABLE IF EXISTS {prepared}", doing)
        client.execute(f"CREATE TABLE {prepared} ({defs}) ENGINE = Log", doing)
        try:
            client.execute(f"INSERT INTO {prepared} ({names}) {prepare_select(load, columns, source)}", doing)
        except DestinationError:
            self._drop_quietly(client, prepared)
            raise

    @staticmethod
    def _drop_quietly(client: Client, table: str) -> None:
        # A leftover is named like a stage of its job: `drop_stages` and stale clean-up retry.
        try:
            client.execute(f"DROP TABLE IF EXISTS {table}", "dropping")
        except DestinationError as exc:
            log.warning("clickhouse: could not drop staging table %s: %s", table, exc)

    def _stage_tables(self, client: SqlClient) -> list[tuple[str, str]]:
        return client.rows(
            f"SELECT name, engine FROM system.tables WHERE database = {literal(self.layout.db)} "
            f"AND substring(name, 1, {len(STAGE_PREFIX)}) = {literal(STAGE_PREFIX)}",
            "listing staging tables",
        )

    def _stale_before(self, engine: str, before: float) -> float:
        # A killed pass's Memory tables hold server RAM: they go after an hour, not a day.
        return max(before, time.time() - MEMORY_STAGE_MAX_AGE) if engine == "Memory" else before

    # --- stream -------------------------------------------------------------------------------

    def _insert_rows(
        self, client: SqlClient, table: Table, columns: Sequence[str], rows: Sequence[Mapping[str, Any]], doing: str
    ) -> None:
        """One `INSERT ... FORMAT TabSeparated` of rows that all have exactly `columns` non-NULL."""
        lines = ["\t".join(field_text(row[c]) for c in columns) for row in rows]
        body = ("\n".join(lines) + "\n").encode()
        names = ", ".join(quote(c) for c in columns)
        insert = f"INSERT INTO {self.layout.insert_target(table.name)} ({names}) FORMAT TabSeparated"
        client.execute(insert, doing, body, STREAM_SETTINGS)  # type: ignore[call-arg]

    def recognize_users(
        self,
        table: Table,
        anonymous_column: str,
        user_columns: Sequence[str],
        pairs: Mapping[str, Sequence[Any]],
        unset: Sequence[str] = (),
    ) -> None:
        """One `ALTER TABLE ... UPDATE` mutation per MUTATION_IDS pairs (`docs/users-recognition.md`):
        mutations rewrite every part they touch and run in the background, so a pass makes as few
        as it can. Values that do not fit their column are left out: a failing mutation would
        block the table's later ones."""
        statement = recognition_mutation(self.layout, table, anonymous_column, user_columns, pairs, unset)
        if statement is None:
            return
        with self._session() as client:
            client.execute(statement, f"recognizing {len(pairs)} users in {table.name!r}", settings=MUTATION_SETTINGS)  # type: ignore[call-arg]


MUTATION_IDS = 5000
"""Most anonymous ids in one mutation (callers split larger batches)."""
MUTATION_SETTINGS = {"max_query_size": str(64 * 1024 * 1024)}
"""A mutation names its ids in the statement: more than the default 256 KiB of SQL."""


def recognition_mutation(
    layout: Layout,
    table: Table,
    anonymous_column: str,
    user_columns: Sequence[str],
    pairs: Mapping[str, Sequence[Any]],
    unset: Sequence[str] = (),
) -> str | None:
    """`ALTER TABLE ... UPDATE` setting each user column from `transform` over the ids, on the rows
    of those ids whose user columns are all empty (NULL, '' or 0: columns are not Nullable)."""
    usable = {a: v for a, v in pairs.items() if _literal_ok(a)}
    sets = []
    for index, column in enumerate(user_columns):
        sql_type = table.columns[column]
        known = {a: str(v[index]) for a, v in usable.items() if _fits(v[index], data_type_of(sql_type))}
        if known:
            ids = ", ".join(literal(a) for a in known)
            values = ", ".join(literal(v) for v in known.values())
            mapped = f"transform(toString({quote(anonymous_column)}), [{ids}], [{values}], toString({quote(column)}))"
            sets.append(f"{quote(column)} = CAST({mapped} AS {sql_type})")
    if not sets:
        return None
    ids = ", ".join(literal(a) for a in usable)
    empty = " AND ".join(
        [f"ifNull(toString({quote(c)}), '') IN ('', '0')" for c in user_columns]
        + [f"ifNull(toString({quote(c)}), '') = ''" for c in unset]
    )
    return (
        f"ALTER TABLE {layout.name(table.name)}{layout.on_cluster()} UPDATE {', '.join(sets)} "
        f"WHERE toString({quote(anonymous_column)}) IN ({ids}) AND {empty}"
    )


def _literal_ok(text: str) -> bool:
    try:
        literal(text)
    except ValueError:
        return False
    return True


def _fits(value: Any, data_type: DataType | None) -> bool:
    """`value` (text or None) can be CAST to a column of `data_type` without failing the mutation."""
    if value is None or not _literal_ok(str(value)):
        return False
    if data_type is DataType.INT64:
        return str(value).lstrip("-").isdigit() and -(2**63) <= int(value) < 2**63
    if data_type is DataType.FLOAT64:
        try:
            float(value)
        except ValueError:
            return False
        return True
    return data_type is DataType.STRING


def field_text(value: Any) -> str:
    """One value, already in its column's type (timestamps as RFC 3339), as TSV text."""
    if value is True or value is False:
        return "1" if value else "0"
    return escape(value) if isinstance(value, str) else str(value)


# --- the SQL of a commit ----------------------------------------------------------------------------


MAX_COPY_STREAMS = 4
MIN_COPY_ROWS = 100_000
"""Rows below which a copy is not cut further: each INSERT makes a part per partition."""
_TEXT_STAGES = (DataType.STRING, DataType.TIMESTAMP)
# Stage type → the target column types (inside Nullable) its cast can never refuse. A staged
# TIMESTAMP is RFC 3339 text the executor has already parsed.
_SAFE_TARGETS: dict[DataType, frozenset[str]] = {
    DataType.BOOL: frozenset({"UInt8", "Int64", "Float64", "String"}),
    DataType.INT64: frozenset({"Int64", "Float64", "String"}),
    DataType.FLOAT64: frozenset({"Float64", "String"}),
    DataType.STRING: frozenset({"String"}),
    DataType.TIMESTAMP: frozenset({"DateTime", "String"}),
}


def default_of(sql_type: str) -> str:
    """An expression giving the default value of (non-nullable) `sql_type`."""
    return f"assumeNotNull(CAST(NULL AS Nullable({sql_type})))"


def value_expr(column: str, stage: DataType | None, target_sql: str, target: DataType | None) -> str:
    """The staged `column` (quoted) of stage type `stage` (None: the chunk lacks it) as a value of
    the target column type `target_sql`, whose DataType is `target`."""
    inner, nullable = base_type(target_sql)
    if stage is None:
        return f"CAST(NULL AS Nullable({inner}))" if nullable else default_of(inner)
    if target is DataType.TIMESTAMP and stage in _TEXT_STAGES:
        value = f"CAST(parseDateTimeBestEffort({column}, 'UTC') AS Nullable({inner}))"
    elif stage in _TEXT_STAGES and target is not DataType.STRING:
        if not nullable:
            return f"CAST(ifNull({column}, toString({default_of(inner)})) AS {inner})"
        value = f"CAST({column} AS Nullable({inner}))"
    elif stage is DataType.BOOL and target is DataType.STRING:
        # As the other warehouses print booleans.
        text = f"if(assumeNotNull({column}) = 1, 'true', 'false')"
        value = f"CAST(if(isNull({column}), NULL, {text}) AS Nullable({inner}))"
    else:
        value = f"CAST({column} AS Nullable({inner}))"
    return value if nullable else f"ifNull({value}, {default_of(inner)})"


def casts_cannot_fail(load: Load, columns: list[str]) -> bool:
    """True when no staged value can be refused by its target column's type (module docstring)."""
    for chunk in load.chunks:
        for name in columns:
            stage = chunk.columns.get(name)
            if stage is not None and base_type(load.table.columns[name])[0] not in _SAFE_TARGETS[stage]:
                return False
    return True


def copy_groups(load: Load, streams: int = MAX_COPY_STREAMS) -> list[Load]:
    """`load` cut into at most `streams` loads of whole chunks, at most one per MIN_COPY_ROWS rows,
    spread to be about equal in rows; one when only the last row of each key is kept (that needs
    every chunk)."""
    total = sum(chunk.rows for chunk in load.chunks)
    count = min(streams, len(load.chunks), max(1, total // MIN_COPY_ROWS))
    if count <= 1 or (load.ordered and load.table.primary_keys):
        return [load]
    groups: list[list[StagedChunk]] = [[] for _ in range(count)]
    sizes = [0] * count
    for chunk in sorted(load.chunks, key=lambda c: -c.rows):  # largest first, to the emptiest group
        smallest = sizes.index(min(sizes))
        groups[smallest].append(chunk)
        sizes[smallest] += chunk.rows
    return [replace(load, chunks=group) for group in groups]


def prepare_select(load: Load, columns: list[str], source: dict[str, str]) -> str:
    """SELECT of every chunk (`source`: chunk ref → qualified name) as the target's types, columns
    named c0, c1...; with a primary key and an order column, only the last row of each key."""
    key_columns = [f"c{columns.index(k)}" for k in load.table.primary_keys if k in columns]
    keep_last = load.ordered and bool(key_columns)
    branches = [_branch(load, chunk, columns, source[chunk.ref], keep_last) for chunk in load.chunks]
    names = ", ".join(f"c{i}" for i in range(len(columns)))
    select = f"SELECT {names} FROM ({' UNION ALL '.join(branches)})"
    if keep_last:
        select += f" ORDER BY seq DESC LIMIT 1 BY {', '.join(key_columns)}"
    return select


def _branch(load: Load, chunk: StagedChunk, columns: list[str], source: str, keep_last: bool) -> str:
    exprs = []
    for index, name in enumerate(columns):
        target_sql = load.table.columns[name]
        target = data_type_of(target_sql)
        exprs.append(f"{value_expr(quote(name), chunk.columns.get(name), target_sql, target)} AS c{index}")
    if keep_last:
        seq = quote(ORDER_COLUMN) if ORDER_COLUMN in chunk.columns else "toInt64(0)"
        exprs.append(f"ifNull({seq}, toInt64(0)) AS seq")
    return f"SELECT {', '.join(exprs)} FROM {source}"


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
