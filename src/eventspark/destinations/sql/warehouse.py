"""`SqlWarehouse`: the adapter contract (`base.DestinationAdapter`) written once for every SQL
warehouse, on top of what a destination package provides:

- `dialect`, `capabilities` (data) and `MARKER_TABLE` (the DDL of its load-marker table);
- a client (`SqlClient`: execute, rows, transaction, close; driver errors already classified
  into TransientError / TerminalError) opened by `_connect`;
- a few hooks for what truly differs: reading the catalog, listing staging tables, the value
  expression of a staged column, and the bulk statement of a stream insert.

Shared here: connection life (a TransientError closes the client; the next call reconnects),
the marker table (created on connect, written in the commit's transaction, read by
`loaded_files`), patching (CREATE / ADD COLUMN / key, inside a transaction where DDL is
transactional, tolerating a column another node added first), the commit (copy, markers and
stage drops in one transaction where the warehouse has them), stage clean-up, and the stream
insert (dedup by key, upsert clause by style, one transaction).
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, ClassVar, Protocol

from eventspark.destinations.base import (
    LOADS_TABLE,
    DestinationAdapter,
    DestinationError,
    Load,
    StagedChunk,
    TerminalError,
    TransientError,
)
from eventspark.destinations.sql import debug_log, stages
from eventspark.destinations.sql.statements import (
    copy_statements,
    group_by_non_null,
    insert_plan,
    marker_delete,
    marker_insert,
    marker_select,
    split_marker_select,
    upsert_clause,
)
from eventspark.steps.diff import Table, TablePatch
from eventspark.steps.typing import DataType

log = logging.getLogger(__name__)

MARKER_DELETE_LOGS = 200
"""Logs per DELETE of archived logs' markers (`forget_loaded`): a statement stays short."""


class SqlClient(Protocol):
    """One connection to a warehouse. Every method translates driver errors at the boundary."""

    def execute(self, statement: str, doing: str) -> None: ...

    def rows(self, statement: str, doing: str) -> list[tuple[Any, ...]]: ...

    def transaction(self, doing: str) -> AbstractContextManager[None]:
        """Statements inside run in one transaction (UTC session time zone), rolled back on error."""
        ...

    def close(self) -> None: ...


class SqlWarehouse(DestinationAdapter):
    """A schema (database) of an SQL warehouse; constructors do no I/O, one client opened on use."""

    CREATE_SCHEMA: ClassVar[str] = "CREATE SCHEMA IF NOT EXISTS {schema}"
    """The statement creating the destination's schema (`{schema}`: quoted)."""
    MARKER_TABLE: ClassVar[str]
    """`CREATE TABLE IF NOT EXISTS {name} (dest_id, file, table_name, loaded_at ...)`, `{name}`
    the qualified marker table: the only part of the marker table a package writes."""

    def __init__(self, dest_id: str, schema: str, staging_dir: Path | None = None) -> None:
        self.dest_id = dest_id
        self.schema = schema
        self.staging_dir = staging_dir
        """Where file stages live (`Capabilities.stage == "files"`)."""
        self._client: SqlClient | None = None

    # --- what a package provides ---------------------------------------------------------------

    @abstractmethod
    def _connect(self) -> SqlClient:
        """A new client; `_prepare_statements` then run on it (schema, marker table)."""

    @abstractmethod
    def _catalog(self, client: SqlClient, name: str | None) -> tuple[list[Any], list[tuple[str, Sequence[str]]]]:
        """Catalog rows of the schema (only table `name` when given): (table, column, SQL type) in
        column order, and (table, primary key columns)."""

    def _stage_tables(self, client: SqlClient) -> list[tuple[str, str]]:
        """(name, engine) of the staging tables in the schema (table stages only)."""
        raise NotImplementedError

    def _value(self, column: str, stage: DataType | None, target_sql: str) -> str:
        """SQL giving staged `column` (quoted; its stage type, None when the chunk lacks it) as a
        value of the target column type."""
        raise NotImplementedError

    def _insert_rows(
        self, client: SqlClient, table: Table, columns: Sequence[str], rows: Sequence[Mapping[str, Any]], doing: str
    ) -> None:
        """Inserts `rows` (values in their column's types, absent ones NULL) naming `columns`,
        ending each statement with `self._upsert(table, columns)`."""
        raise NotImplementedError

    # --- names --------------------------------------------------------------------------------

    def name(self, table: str) -> str:
        """`table` of the destination's schema, qualified and quoted."""
        return f"{self.dialect.quote(self.schema)}.{self.dialect.quote(table)}"

    def literal(self, text: str) -> str:
        return self.dialect.literal(text)

    def _upsert(self, table: Table, columns: Sequence[str]) -> str:
        return upsert_clause(self.capabilities.upsert, self.dialect.quote, columns, table.primary_keys)

    # --- connection ---------------------------------------------------------------------------

    def _connection(self) -> SqlClient:
        if self._client is None:
            client = debug_log.wrap(self._connect(), self.dest_id)  # sql_debug_log, when configured
            try:
                with self._ddl_transaction(client, "connecting"):
                    for statement in self._prepare_statements():
                        client.execute(statement, "connecting")
            except BaseException:
                client.close()  # unprepared: the next use connects and prepares again
                raise
            self._client = client
        return self._client

    def _prepare_statements(self) -> list[str]:
        """Run on every new connection: the schema and the marker table, when missing."""
        create_schema = self.CREATE_SCHEMA.format(schema=self.dialect.quote(self.schema))
        return [create_schema, self.MARKER_TABLE.format(name=self.name(LOADS_TABLE))]

    @contextmanager
    def _session(self) -> Iterator[SqlClient]:
        """The client; a TransientError closes it, so that the next call reconnects."""
        try:
            yield self._connection()
        except TransientError:
            self.close()
            raise

    def _in_transaction(self, client: SqlClient, doing: str) -> AbstractContextManager[None]:
        return client.transaction(doing) if self.capabilities.transactions else _no_transaction()

    def _ddl_transaction(self, client: SqlClient, doing: str) -> AbstractContextManager[None]:
        return client.transaction(doing) if self.capabilities.ddl_in_transactions else _no_transaction()

    def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            client.close()

    # --- tables -------------------------------------------------------------------------------

    def read_tables(self) -> dict[str, Table]:
        return self._read(None)

    def read_table(self, name: str) -> Table | None:
        return self._read(name).get(name)

    def _read(self, name: str | None) -> dict[str, Table]:
        with self._session() as client:
            columns, keys = self._catalog(client, name)
        return stages.tables_from_catalog(columns, keys, self._is_user_table)

    def _is_user_table(self, name: str) -> bool:
        return stages.is_user_table(name)

    def patch(self, patch: TablePatch) -> None:
        doing = f"patching table {patch.table!r}"
        with self._session() as client, self._ddl_transaction(client, doing):
            if patch.create:
                for statement in self._create_statements(patch):
                    client.execute(statement, doing)
            else:
                for column, sql_type in patch.add_columns.items():
                    self._add_column(client, patch.table, column, sql_type, doing)
                if patch.primary_keys is not None:
                    for statement in self._key_statements(client, patch.table, patch.primary_keys):
                        client.execute(statement, doing)

    def _create_statements(self, patch: TablePatch) -> list[str]:
        keys = patch.primary_keys or ()
        defs = [self._column_def(c, t, keys) for c, t in patch.add_columns.items()]
        if keys:
            defs.append(self._key_clause(patch.table, keys))
        return [f"CREATE TABLE IF NOT EXISTS {self.name(patch.table)} ({', '.join(defs)}){self._table_options()}"]

    def _key_clause(self, table: str, keys: Sequence[str]) -> str:
        """The primary key of a CREATE TABLE."""
        return f"PRIMARY KEY ({', '.join(self.dialect.quote(k) for k in keys)})"

    def _column_def(self, column: str, sql_type: str, keys: Sequence[str]) -> str:
        return f"{self.dialect.quote(column)} {sql_type}"

    def _table_options(self) -> str:
        return ""

    def _add_column(self, client: SqlClient, table: str, column: str, sql_type: str, doing: str) -> None:
        if_missing = "IF NOT EXISTS " if self.capabilities.add_column_if_not_exists else ""
        statement = f"ALTER TABLE {self.name(table)} ADD COLUMN {if_missing}{self._column_def(column, sql_type, ())}"
        try:
            client.execute(statement, doing)
        except TerminalError as exc:
            if not self._is_duplicate_column(exc):  # else another node added it first
                raise

    def _is_duplicate_column(self, exc: TerminalError) -> bool:
        return False

    def _key_statements(self, client: SqlClient, table: str, keys: tuple[str, ...]) -> list[str]:
        """Statements giving an existing table the primary key `keys`."""
        raise TerminalError(f"{self.dialect.name}: table {table!r} has a primary key; it cannot change")

    # --- batch --------------------------------------------------------------------------------

    def commit(self, load: Load) -> None:
        doing = f"loading table {load.table.name!r}"
        caps = self.capabilities
        # Staging tables go with the commit where DDL is transactional; else (and files) after it.
        drop_inside = caps.transactions and caps.ddl_in_transactions and caps.stage == "table"
        with self._session() as client:
            with self._in_transaction(client, doing):
                self._copy(client, load, doing)
                markers = marker_insert(self.name(LOADS_TABLE), self.literal, load)
                if markers is not None:
                    client.execute(markers, doing)
                if drop_inside:
                    self._drop_chunks(client, load.chunks, doing)
            if not drop_inside:
                self._discard_chunks(client, load.chunks)

    def _copy(self, client: SqlClient, load: Load, doing: str) -> None:
        """Moves the chunks into the target (inside the commit's transaction, if any)."""
        target = self.name(load.table.name)
        for statement in copy_statements(
            load, self.capabilities.upsert, self.dialect.quote, target, self._stage_source, self._value
        ):
            client.execute(statement, doing)

    def _stage_source(self, chunk: StagedChunk) -> str:
        """The SQL naming a staged chunk in a SELECT's FROM."""
        return self.name(chunk.ref)

    def _drop_chunks(self, client: SqlClient, chunks: Iterable[StagedChunk], doing: str) -> None:
        if self.capabilities.stage == "table":
            for chunk in chunks:
                client.execute(f"DROP TABLE IF EXISTS {self.name(chunk.ref)}", doing)

    def _discard_chunks(self, client: SqlClient, chunks: Sequence[StagedChunk]) -> None:
        """Removes committed chunks after the commit: a failure loses nothing (`drop_stages` and
        `drop_stale_stages` retry), so it is only logged."""
        if self.capabilities.stage == "files":
            for chunk in chunks:
                Path(chunk.ref).unlink(missing_ok=True)
            return
        try:
            self._drop_chunks(client, chunks, "dropping staging tables")
        except DestinationError as exc:
            log.warning("%s: could not drop staging tables: %s", self.dialect.name, exc)

    def loaded_files(self, dest_id: str, files: Iterable[str]) -> set[tuple[str, str]]:
        wanted = list(files)
        if not wanted:
            return set()
        with self._session() as client:
            select = marker_select(self.name(LOADS_TABLE), self.literal, dest_id, wanted)
            rows = client.rows(select, "reading load markers")
        return {(f, t) for f, t in rows}

    def mark_loaded(self, dest_id: str, table: str, files: Sequence[str]) -> None:
        markers = marker_insert(self.name(LOADS_TABLE), self.literal, Load(dest_id, Table(table), [], list(files)))
        if markers is None:
            return
        doing = f"writing the load markers of table {table!r}"
        with self._session() as client, self._in_transaction(client, doing):
            client.execute(markers, doing)

    def forget_loaded(self, dest_id: str, logs: Sequence[str]) -> None:
        loads = self.name(LOADS_TABLE)
        doing = "removing the load markers of archived logs"
        with self._session() as client:
            for start in range(0, len(logs), MARKER_DELETE_LOGS):
                chunk = logs[start : start + MARKER_DELETE_LOGS]
                statement = marker_delete(loads, self.literal, dest_id, chunk, self._split_markers)
                with self._in_transaction(client, doing):
                    client.execute(statement, doing)

    @property
    def _split_markers(self) -> bool:
        """Whether per-split markers are ever written here (matched with LIKE … ESCAPE): only by
        direct writes and task commits, Postgres and MySQL. BigQuery, without ESCAPE, has none."""
        return self.capabilities.direct_writes or self.capabilities.task_commits

    def loaded_splits(self, dest_id: str, logs: Iterable[str]) -> set[tuple[str, str]]:
        wanted = list(logs)
        if not wanted or not self._split_markers:
            return set()  # no split markers are ever written
        with self._session() as client:
            select = split_marker_select(self.name(LOADS_TABLE), self.literal, dest_id, wanted)
            rows = client.rows(select, "reading split load markers")
        return {(f, t) for f, t in rows}

    def drop_stages(self, job_id: str) -> None:
        self._drop_stages_where(lambda _engine: stages.of_job(job_id))

    def drop_stale_stages(self, before: float) -> None:
        self._drop_stages_where(lambda engine: stages.started_before(self._stale_before(engine, before)))

    def _stale_before(self, engine: str, before: float) -> float:
        """The epoch before which a stage of `engine` is a killed job's leftover."""
        return before

    def _drop_stages_where(self, test: Callable[[str], Callable[[str], bool]]) -> None:
        """Drops the stages whose job part passes `test(engine)` (engine '' for file stages)."""
        if self.capabilities.stage == "files":
            if self.staging_dir is not None:
                stages.drop_file_stages(self.staging_dir, self.dest_id, test(""))
            return
        doing = "dropping staging tables"
        with self._session() as client:
            for name, engine in self._stage_tables(client):
                job = stages.stage_job(name)
                if job is not None and test(engine)(job):
                    client.execute(f"DROP TABLE IF EXISTS {self.name(name)}", doing)

    # --- stream -------------------------------------------------------------------------------

    def insert(self, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
        """Inserts (upserts with a primary key) rows whose values are already in their columns'
        types, in one transaction where the warehouse has them."""
        columns, rows = insert_plan(self.dialect.name, table, rows)
        if not columns:
            return
        if self.capabilities.insert_absent_as_null:
            groups: dict[tuple[str, ...], Sequence[Mapping[str, Any]]] = {tuple(columns): rows}
        else:
            groups = dict(group_by_non_null(rows))
        doing = f"inserting {len(rows)} rows into {table.name!r}"
        with self._session() as client, self._in_transaction(client, doing):
            for group_columns, group in groups.items():
                if group_columns:
                    self._insert_rows(client, table, group_columns, group, doing)


@contextmanager
def _no_transaction() -> Iterator[None]:
    yield
