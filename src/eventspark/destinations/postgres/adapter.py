"""PostgreSQL adapter: executors binary-COPY chunks into UNLOGGED staging tables; the driver moves
them into the target with one INSERT ... SELECT per destination/table pair."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import orjson
import psycopg
from psycopg import sql

from eventspark.destinations.base import (
    LOADS_TABLE,
    STAGE_PREFIX,
    Load,
    StagedChunk,
    TerminalError,
    TransientError,
)
from eventspark.destinations.load_sql import cast_expr, insert_plan, insert_select
from eventspark.destinations.postgres.capabilities import CAPABILITIES
from eventspark.destinations.postgres.configuration import PostgresDestination
from eventspark.destinations.postgres.dialect import DIALECT
from eventspark.destinations.staging import StagingTableAdapter, is_user_table, new_stage_table, tables_from_columns
from eventspark.steps.diff import Table, TablePatch
from eventspark.steps.typing import DataType

DEFAULT_PORT = 5432
CONNECT_TIMEOUT = 10
STAGE_TYPES: dict[DataType, str] = {
    DataType.BOOL: "boolean",
    DataType.INT64: "bigint",
    DataType.FLOAT64: "float8",
    DataType.TIMESTAMP: "text",
    DataType.STRING: "text",
}
_COLUMNS_QUERY = """
SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
  AND (%(table)s::text IS NULL OR c.relname = %(table)s)
ORDER BY c.relname, a.attnum
"""
_KEYS_QUERY = """
SELECT c.relname, con.conname, array_agg(a.attname ORDER BY k.ord)
FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
WHERE n.nspname = %(schema)s AND con.contype = 'p' AND (%(table)s::text IS NULL OR c.relname = %(table)s)
GROUP BY c.relname, con.conname
"""


def conninfo_of(dest: PostgresDestination) -> str:
    ds = dest.datasource
    params: dict[str, Any] = {"host": ds.host, "port": ds.port or DEFAULT_PORT, "dbname": ds.db}
    if ds.username:
        params["user"] = ds.username
    if ds.password:
        params["password"] = ds.password
    params.setdefault("connect_timeout", CONNECT_TIMEOUT)
    params.update(ds.parameters)
    return psycopg.conninfo.make_conninfo(**params)


@contextmanager
def translated_errors(doing: str) -> Iterator[None]:
    """psycopg errors as TransientError (connection lost or refused) or TerminalError (the rest)."""
    try:
        yield
    except psycopg.OperationalError as exc:
        raise TransientError(f"postgres: {doing}: {_message(exc)}") from exc
    except psycopg.Error as exc:
        raise TerminalError(f"postgres: {doing}: {_message(exc)}") from exc


def _message(exc: psycopg.Error) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


@dataclass(frozen=True, slots=True)
class PostgresStageTarget:
    """Picklable: what an executor needs to write staging tables of one job."""

    conninfo: str
    schema: str
    job_id: str

    json_lines: ClassVar[bool] = False

    def open(self) -> PostgresStageWriter:
        return PostgresStageWriter(self)


class PostgresStageWriter:
    """One connection per executor task; each chunk becomes its own UNLOGGED table."""

    def __init__(self, target: PostgresStageTarget) -> None:
        self._target = target
        self._conn: psycopg.Connection[Any] | None = None

    def write(self, columns: Mapping[str, DataType], rows: Sequence[Sequence[Any]]) -> StagedChunk:
        name = new_stage_table(self._target.job_id)
        table = sql.Identifier(self._target.schema, name)
        names = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        defs = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(STAGE_TYPES[t])) for c, t in columns.items()
        )
        types = [STAGE_TYPES[t] for t in columns.values()]
        with translated_errors(f"staging {len(rows)} rows"):
            conn = self._connection()
            try:
                with conn.cursor() as cur:
                    cur.execute(sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(table, defs))
                    copy_sql = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(table, names)
                    with cur.copy(copy_sql) as copy:
                        copy.set_types(types)
                        for row in rows:
                            copy.write_row(row)
                conn.commit()
            except BaseException:
                if not conn.closed:
                    conn.rollback()  # keep the connection usable for the task's other chunks
                raise
        return StagedChunk(name, dict(columns), len(rows))

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            self._conn = psycopg.connect(self._target.conninfo)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class PostgresAdapter(StagingTableAdapter):
    """A Postgres schema (created when missing). One driver connection, opened on first use."""

    dialect = DIALECT
    capabilities = CAPABILITIES

    def __init__(self, dest_id: str, dest: PostgresDestination) -> None:
        self.dest_id = dest_id
        self.conninfo = conninfo_of(dest)
        self.schema = dest.datasource.schema_ or "public"
        self._conn: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            with translated_errors("connecting"):
                conn = psycopg.connect(self.conninfo)
                try:
                    self._prepare(conn)
                except BaseException:
                    conn.close()  # unprepared: the next use connects and prepares again
                    raise
                self._conn = conn
        return self._conn

    def _prepare(self, conn: psycopg.Connection[Any]) -> None:
        loads = sql.Identifier(self.schema, LOADS_TABLE)
        with conn.transaction():
            # Nodes connecting at once would race on CREATE ... IF NOT EXISTS (a unique violation
            # in the catalog): a transaction-scoped advisory lock makes them take turns.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('eventspark.prepare'))")
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (dest_id text, file text, table_name text, "
                    "loaded_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (dest_id, file, table_name))"
                ).format(loads)
            )

    def _name(self, table: str) -> sql.Composable:
        return sql.Identifier(self.schema, table)

    def _read(self, name: str | None) -> dict[str, Table]:
        args = {"schema": self.schema, "table": name}
        conn = self._connection()
        with translated_errors("reading tables"), conn.transaction():
            columns = conn.execute(_COLUMNS_QUERY, args).fetchall()
            keys = conn.execute(_KEYS_QUERY, args).fetchall()
        tables = tables_from_columns(columns, is_user_table)
        for table, _constraint, key_columns in keys:
            if table in tables:
                tables[table].primary_keys = tuple(key_columns)
        return tables

    def patch(self, patch: TablePatch) -> None:
        conn = self._connection()
        with translated_errors(f"patching table {patch.table!r}"), conn.transaction():
            for statement in self._patch_statements(patch):
                conn.execute(statement)

    def _patch_statements(self, patch: TablePatch) -> list[sql.Composable]:
        table = self._name(patch.table)
        columns = [sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in patch.add_columns.items()]
        statements: list[sql.Composable] = []
        if patch.create:
            statements.append(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(table, sql.SQL(", ").join(columns)))
        else:
            statements += [sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {}").format(table, c) for c in columns]
        if patch.primary_keys:
            statements += self._key_statements(patch.table, patch.primary_keys, patch.create)
        return statements

    def _key_statements(self, table: str, keys: tuple[str, ...], created: bool) -> list[sql.Composable]:
        # EventNative's constraint name; the current key (whatever its name) is replaced.
        constraint = sql.Identifier(f"{self.schema}_{table}_pk"[:63])
        statements: list[sql.Composable] = []
        if not created:
            for _table, name, _cols in self._conn_execute(_KEYS_QUERY, {"schema": self.schema, "table": table}):
                drop = sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}")
                statements.append(drop.format(self._name(table), sql.Identifier(name)))
        cols = sql.SQL(", ").join(sql.Identifier(k) for k in keys)
        add = sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY ({})")
        statements.append(add.format(self._name(table), constraint, cols))
        return statements

    def _conn_execute(self, query: str, args: dict[str, Any]) -> list[tuple[Any, ...]]:
        return self._connection().execute(query, args).fetchall()

    def stage_target(self, job_id: str, pass_bytes: int = 0) -> PostgresStageTarget:
        self._connection()  # the schema must exist before executors create tables in it
        return PostgresStageTarget(self.conninfo, self.schema, job_id)

    def commit(self, load: Load) -> None:
        target = self._name(load.table.name).as_string(None)
        statement = insert_select(load, DIALECT.quote, target, self._stage_source)
        markers = [(load.dest_id, f, load.table.name) for f in load.files]
        conn = self._connection()
        with translated_errors(f"loading table {load.table.name!r}"), conn.transaction():
            conn.execute("SET LOCAL TimeZone = 'UTC'")
            conn.execute(statement)
            with conn.cursor() as cur:
                insert = sql.SQL("INSERT INTO {} (dest_id, file, table_name) VALUES (%s, %s, %s)")
                cur.executemany(insert.format(self._name(LOADS_TABLE)), markers)
            for chunk in load.chunks:
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._name(chunk.ref)))

    def _stage_source(self, chunk: StagedChunk) -> str:
        return self._name(chunk.ref).as_string(None)

    def loaded_files(self, dest_id: str, files: Iterable[str]) -> set[tuple[str, str]]:
        query = sql.SQL("SELECT file, table_name FROM {} WHERE dest_id = %s AND file = ANY(%s)")
        conn = self._connection()
        with translated_errors("reading load markers"), conn.transaction():
            rows = conn.execute(query.format(self._name(LOADS_TABLE)), (dest_id, list(files))).fetchall()
        return {(f, t) for f, t in rows}

    def _drop_stages_where(self, matches: Callable[[str], bool]) -> None:
        query = "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        query += "WHERE n.nspname = %s AND c.relkind = 'r' AND left(c.relname, %s) = %s"
        conn = self._connection()
        with translated_errors("dropping staging tables"), conn.transaction():
            rows = conn.execute(query, (self.schema, len(STAGE_PREFIX), STAGE_PREFIX)).fetchall()
            for (name,) in rows:
                if matches(name[len(STAGE_PREFIX) :]):
                    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._name(name)))

    def insert(self, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
        """One `INSERT ... SELECT` over `jsonb_array_elements` of all the rows sent as one JSON
        parameter, in one transaction; each value is read as text and cast to its column's type
        (see `_insert_rows` for rows with different columns and primary keys)."""
        columns, payload = _insert_rows(table, rows)
        if not columns:
            return
        conn = self._connection()
        with translated_errors(f"inserting {len(rows)} rows into {table.name!r}"), conn.transaction():
            conn.execute("SET LOCAL TimeZone = 'UTC'")
            conn.execute(self._insert_statement(table, columns), [payload])

    def _insert_statement(self, table: Table, columns: list[str]) -> sql.Composable:
        names = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        values = sql.SQL(", ").join(
            sql.SQL(cast_expr(f"(r.v->>{i})", DataType.STRING, table.columns[c])) for i, c in enumerate(columns)
        )
        statement = sql.SQL("INSERT INTO {} ({}) SELECT {} FROM jsonb_array_elements(%s::jsonb) AS r(v)").format(
            self._name(table.name), names, values
        )
        if not table.primary_keys:
            return statement
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in table.primary_keys)
        updates = [
            sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in columns if c not in table.primary_keys
        ]
        action = sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(updates)) if updates else sql.SQL("DO NOTHING")
        return sql.SQL("{} ON CONFLICT ({}) {}").format(statement, keys, action)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


# --- stream inserts: rows as one JSON parameter --------------------------------------------------


def _insert_rows(table: Table, rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], str]:
    """The columns of `rows` (see `load_sql.insert_plan`) and the rows as a JSON array of arrays in
    that column order (absent values are null)."""
    columns, rows = insert_plan("postgres", table, rows)
    values = [[row.get(c) for c in columns] for row in rows]
    return columns, orjson.dumps(values, default=str).decode()


def build(dest_id: str, dest: PostgresDestination, events_dir: Path) -> PostgresAdapter:
    return PostgresAdapter(dest_id, dest)
