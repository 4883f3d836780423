"""MySQL / MariaDB adapter (PyMySQL): executors `LOAD DATA LOCAL INFILE` each chunk into its own
InnoDB staging table; the driver moves a pair's chunks into the target with one INSERT ... SELECT
(`ON DUPLICATE KEY UPDATE` with a primary key) and writes the load markers in the same
transaction, so a pair is committed whole or not at all."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pymysql

from eventspark.destinations.base import (
    LOADS_TABLE,
    STAGE_PREFIX,
    DestinationError,
    Load,
    StagedChunk,
    TerminalError,
    TransientError,
)
from eventspark.destinations.mysql import load as sql
from eventspark.destinations.mysql.capabilities import CAPABILITIES
from eventspark.destinations.mysql.configuration import MySQLDestination
from eventspark.destinations.mysql.dialect import DIALECT
from eventspark.destinations.staging import (
    StagingTableAdapter,
    is_user_table,
    new_stage_table,
    tables_from_columns,
)
from eventspark.destinations.tsv import encode_rows
from eventspark.steps.diff import Table, TablePatch
from eventspark.steps.typing import DataType

log = logging.getLogger(__name__)

DEFAULT_PORT = 3306
CONNECT_TIMEOUT = 10
SQL_MODE = "STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION"
DUPLICATE_COLUMN = 1060
TRANSIENT_CODES = frozenset(
    {1040, 1053, 1205, 1213, 1927, 2002, 2003, 2006, 2013, 2055, 4031}
)  # too many connections, shutdown, lock wait, deadlock, killed, can't connect, gone away, lost
PARAMETERS = {
    "connect_timeout": int,
    "read_timeout": int,
    "write_timeout": int,
    "ssl_ca": str,
    "ssl_cert": str,
    "ssl_key": str,
}
"""`datasource.parameters` passed to the driver (values are strings in config)."""
INSERT_ROWS = 1000
"""Rows per multi-row INSERT in stream mode (well under the default 16 MB max_allowed_packet)."""
quote = DIALECT.quote


def pct(text: str) -> str:
    """SQL text for a statement run with arguments: the driver formats it with `%`."""
    return text.replace("%", "%%")


@contextmanager
def translated_errors(doing: str) -> Iterator[None]:
    """PyMySQL errors as TransientError (connection lost or refused, lock timeouts) or TerminalError."""
    try:
        yield
    except pymysql.err.Error as exc:
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        transient = code in TRANSIENT_CODES or isinstance(exc, pymysql.err.InterfaceError)
        message = exc.args[1] if len(exc.args) > 1 else str(exc)
        kind = TransientError if transient else TerminalError
        raise kind(f"mysql: {doing}: ({code}) {message}") from exc
    except OSError as exc:
        raise TransientError(f"mysql: {doing}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class ConnectInfo:
    """Picklable connection settings; `connect` opens an autocommit, strict, UTC session."""

    host: str
    port: int
    user: str
    password: str
    options: tuple[tuple[str, Any], ...] = field(default=())

    def connect(self) -> pymysql.connections.Connection[Any]:
        options = dict(self.options)
        options.setdefault("connect_timeout", CONNECT_TIMEOUT)
        ssl = {k[4:]: options.pop(k) for k in list(options) if k.startswith("ssl_")}
        return pymysql.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            charset="utf8mb4",
            autocommit=True,
            local_infile=True,
            init_command=f"SET SESSION sql_mode = '{SQL_MODE}', time_zone = '+00:00'",
            ssl=ssl or None,
            **options,
        )


def connect_info_of(dest: MySQLDestination) -> ConnectInfo:
    ds = dest.datasource
    options = []
    for name, value in ds.parameters.items():
        convert = PARAMETERS.get(name)
        if convert is None:
            raise TerminalError(f"mysql: datasource parameter {name!r} is not one of {sorted(PARAMETERS)}")
        options.append((name, convert(value)))
    return ConnectInfo(ds.host, ds.port or DEFAULT_PORT, ds.username or "root", ds.password, tuple(options))


@dataclass(frozen=True, slots=True)
class MySQLStageTarget:
    """Picklable: what an executor needs to write staging tables of one job."""

    info: ConnectInfo
    db: str
    job_id: str

    json_lines: ClassVar[bool] = False

    def open(self) -> MySQLStageWriter:
        return MySQLStageWriter(self)


class MySQLStageWriter:
    """One connection per executor task; each chunk is a staging table filled by LOAD DATA."""

    def __init__(self, target: MySQLStageTarget) -> None:
        self._target = target
        self._conn: pymysql.connections.Connection[Any] | None = None

    def write(self, columns: Mapping[str, DataType], rows: Sequence[Sequence[Any]]) -> StagedChunk:
        ref = new_stage_table(self._target.job_id)
        name = f"{quote(self._target.db)}.{quote(ref)}"
        defs = ", ".join(f"{quote(c)} {sql.STAGE_TYPES[t]}" for c, t in columns.items())
        try:
            body = encode_rows(rows, [sql.STAGE_FILE_ENCODERS[t] for t in columns.values()])
        except ValueError as exc:
            raise TerminalError(f"mysql: staging {len(rows)} rows: {exc}") from exc
        with tempfile.NamedTemporaryFile(prefix="eventspark-", suffix=".tsv") as file:
            file.write(body)
            file.flush()
            with translated_errors(f"staging {len(rows)} rows"):
                conn = self._connection()
                with conn.cursor() as cur:
                    cur.execute(f"CREATE TABLE {name} ({defs}) {sql.TABLE_OPTIONS.format('utf8mb4_bin')}")
                    names = pct(", ".join(quote(c) for c in columns))
                    loaded = cur.execute(
                        f"LOAD DATA LOCAL INFILE %s INTO TABLE {pct(name)} CHARACTER SET utf8mb4 "
                        "FIELDS TERMINATED BY '\\t' ESCAPED BY '\\\\' LINES TERMINATED BY '\\n' "
                        f"({names})",
                        (file.name,),
                    )
                    self._check(cur, loaded, len(rows))
        return StagedChunk(ref, dict(columns), len(rows))

    @staticmethod
    def _check(cur: Any, loaded: int, expected: int) -> None:
        # LOAD DATA LOCAL turns conversion errors into warnings: treat any warning as a failure.
        cur.execute("SHOW WARNINGS LIMIT 1")
        warning = cur.fetchone()
        if loaded != expected or warning:
            detail = warning[2] if warning else f"{loaded} rows loaded"
            raise TerminalError(f"mysql: staging {expected} rows: {detail}")

    def _connection(self) -> pymysql.connections.Connection[Any]:
        if self._conn is None:
            self._conn = self._target.info.connect()
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class MySQLAdapter(StagingTableAdapter):
    """A MySQL database (`datasource.db`, created when missing). One driver connection."""

    dialect = DIALECT
    capabilities = CAPABILITIES

    def __init__(self, dest_id: str, dest: MySQLDestination) -> None:
        self.dest_id = dest_id
        self.info = connect_info_of(dest)
        self.schema = dest.datasource.db
        self._conn: pymysql.connections.Connection[Any] | None = None
        self._table_options = sql.TABLE_OPTIONS.format(sql.EXACT_COLLATIONS[-1])

    def _connection(self) -> pymysql.connections.Connection[Any]:
        if self._conn is None or not self._conn.open:
            with translated_errors("connecting"):
                conn = self.info.connect()
                with conn.cursor() as cur:
                    self._table_options = sql.TABLE_OPTIONS.format(self._collation(cur))
                    cur.execute(f"CREATE DATABASE IF NOT EXISTS {quote(self.schema)} CHARACTER SET utf8mb4")
                    cur.execute(
                        f"CREATE TABLE IF NOT EXISTS {self._name(LOADS_TABLE)} (dest_id VARCHAR(128) NOT NULL, "
                        "file VARCHAR(255) NOT NULL, table_name VARCHAR(64) NOT NULL, "
                        "loaded_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, "
                        f"PRIMARY KEY (dest_id, file, table_name)) {self._table_options}"
                    )
                self._conn = conn
        return self._conn

    @staticmethod
    def _collation(cur: Any) -> str:
        """The best exact collation the server has (see EXACT_COLLATIONS)."""
        marks = ", ".join(["%s"] * len(sql.EXACT_COLLATIONS))
        cur.execute(
            f"SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE COLLATION_NAME IN ({marks})",
            sql.EXACT_COLLATIONS,
        )
        found = {name for (name,) in cur.fetchall()}
        return next((c for c in sql.EXACT_COLLATIONS if c in found), sql.EXACT_COLLATIONS[-1])

    @contextmanager
    def _cursor(self, doing: str) -> Iterator[Any]:
        """A cursor of the driver connection; a connection error closes it, so the next call
        reconnects."""
        try:
            with translated_errors(doing):
                conn = self._connection()
                with conn.cursor() as cur:
                    yield cur
        except TransientError:
            self.close()
            raise

    def _name(self, table: str) -> str:
        return f"{quote(self.schema)}.{quote(table)}"

    def data_type_of(self, sql_type: str) -> DataType | None:
        return sql.data_type_of(sql_type)

    # --- tables -------------------------------------------------------------------------------

    def _read(self, name: str | None) -> dict[str, Table]:
        where = "TABLE_SCHEMA = %s" + (" AND TABLE_NAME = %s" if name is not None else "")
        args = (self.schema, name) if name is not None else (self.schema,)
        with self._cursor("reading tables") as cur:
            cur.execute(
                "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS "
                f"WHERE {where} ORDER BY TABLE_NAME, ORDINAL_POSITION",
                args,
            )
            columns = cur.fetchall()
            cur.execute(
                "SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE "
                f"WHERE {where} AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY TABLE_NAME, ORDINAL_POSITION",
                args,
            )
            keys = cur.fetchall()
        tables = tables_from_columns(columns, is_user_table)
        for table, column in keys:
            if table in tables:
                tables[table].primary_keys += (column,)
        return tables

    def patch(self, patch: TablePatch) -> None:
        table = self._name(patch.table)
        with self._cursor(f"patching table {patch.table!r}") as cur:
            if patch.create:
                keys = patch.primary_keys or ()
                defs = [
                    f"{quote(c)} {sql.key_column_type(t) if c in keys else t}" for c, t in patch.add_columns.items()
                ]
                if keys:
                    defs.append(f"PRIMARY KEY ({', '.join(quote(k) for k in keys)})")
                cur.execute(f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(defs)}) {self._table_options}")
                return
            for column, sql_type in patch.add_columns.items():
                self._add_column(cur, table, column, sql_type)
            if patch.primary_keys is not None:
                self._set_key(cur, patch.table, patch.primary_keys)

    @staticmethod
    def _add_column(cur: Any, table: str, column: str, sql_type: str) -> None:
        try:
            cur.execute(f"ALTER TABLE {table} ADD COLUMN {quote(column)} {sql_type}")
        except pymysql.err.OperationalError as exc:
            if exc.args[0] != DUPLICATE_COLUMN:  # another node added it first
                raise

    def _set_key(self, cur: Any, name: str, keys: tuple[str, ...]) -> None:
        current = self._read(name).get(name) or Table(name)
        changes = [
            f"MODIFY COLUMN {quote(k)} {sql.KEY_TEXT_TYPE}"
            for k in keys
            if sql.key_column_type(current.columns.get(k, "")) != current.columns.get(k, "")
        ]
        if current.primary_keys:
            changes.append("DROP PRIMARY KEY")
        changes.append(f"ADD PRIMARY KEY ({', '.join(quote(k) for k in keys)})")
        cur.execute(f"ALTER TABLE {self._name(name)} {', '.join(changes)}")

    # --- batch --------------------------------------------------------------------------------

    def stage_target(self, job_id: str, pass_bytes: int = 0) -> MySQLStageTarget:
        self._connection()  # the database must exist before executors create tables in it
        return MySQLStageTarget(self.info, self.schema, job_id)

    def commit(self, load: Load) -> None:
        markers = [(load.dest_id, f, load.table.name) for f in load.files]
        with self._cursor(f"loading table {load.table.name!r}") as cur:
            statements = sql.insert_select(load, self._name(load.table.name), lambda c: self._name(c.ref))
            cur.connection.begin()
            try:
                for statement in statements:
                    cur.execute(statement)
                if markers:
                    loads = pct(self._name(LOADS_TABLE))
                    insert = f"INSERT INTO {loads} (dest_id, file, table_name) VALUES (%s, %s, %s)"
                    cur.executemany(insert, markers)
                cur.connection.commit()
            except BaseException:
                _rollback(cur.connection)
                raise
        self._drop([chunk.ref for chunk in load.chunks])

    def _drop(self, refs: list[str]) -> None:
        # After the commit a failed DROP loses nothing: drop_stages retries it.
        for ref in refs:
            try:
                with self._cursor("dropping a staging table") as cur:
                    cur.execute(f"DROP TABLE IF EXISTS {self._name(ref)}")
            except DestinationError as exc:
                log.warning("mysql: could not drop staging table %s: %s", ref, exc)

    def loaded_files(self, dest_id: str, files: Iterable[str]) -> set[tuple[str, str]]:
        wanted = list(files)
        if not wanted:
            return set()
        marks = ", ".join(["%s"] * len(wanted))
        with self._cursor("reading load markers") as cur:
            cur.execute(
                f"SELECT file, table_name FROM {pct(self._name(LOADS_TABLE))} WHERE dest_id = %s AND file IN ({marks})",
                (dest_id, *wanted),
            )
            return {(f, t) for f, t in cur.fetchall()}

    def _drop_stages_where(self, matches: Callable[[str], bool]) -> None:
        with self._cursor("dropping staging tables") as cur:
            cur.execute(
                "SELECT TABLE_NAME FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = %s AND LEFT(TABLE_NAME, %s) = %s",
                (self.schema, len(STAGE_PREFIX), STAGE_PREFIX),
            )
            for (name,) in cur.fetchall():
                if matches(name[len(STAGE_PREFIX) :]):
                    cur.execute(f"DROP TABLE IF EXISTS {self._name(name)}")

    # --- stream -------------------------------------------------------------------------------

    def insert(self, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
        """Inserts (upserts with a primary key) rows in one transaction, one multi-row INSERT per
        set of columns."""
        with self._cursor(f"inserting into {table.name!r}") as cur:
            cur.connection.begin()
            try:
                for columns, group in sql.group_rows(rows).items():
                    self._insert_group(cur, table, columns, group)
                cur.connection.commit()
            except BaseException:
                _rollback(cur.connection)
                raise

    def _insert_group(self, cur: Any, table: Table, columns: tuple[str, ...], rows: list[Mapping[str, Any]]) -> None:
        missing = [c for c in columns if c not in table.columns]
        if missing:
            raise TerminalError(f"mysql: table {table.name!r} has no column {missing[0]!r}")
        targets = [sql.data_type_of(table.columns[c]) for c in columns]
        try:
            values = [tuple(sql.stream_value(row[c], t) for c, t in zip(columns, targets, strict=True)) for row in rows]
        except ValueError as exc:
            raise TerminalError(f"mysql: inserting into {table.name!r}: {exc}") from exc
        names = ", ".join(quote(c) for c in columns)
        prefix = pct(f"INSERT INTO {self._name(table.name)} ({names}) VALUES ")
        suffix = pct(sql.upsert_clause(columns, table.primary_keys))
        row_marks = "(" + ", ".join(["%s"] * len(columns)) + ")"
        # Multi-row INSERTs built here rather than by executemany, whose statement parsing a
        # column name like `x) VALUES (` could confuse.
        for start in range(0, len(values), INSERT_ROWS):
            part = values[start : start + INSERT_ROWS]
            args = [value for row in part for value in row]
            cur.execute(prefix + ", ".join([row_marks] * len(part)) + suffix, args)

    def close(self) -> None:
        if self._conn is not None:
            with suppress(pymysql.err.Error):  # already closed by the server
                self._conn.close()
            self._conn = None


def _rollback(conn: Any) -> None:
    try:
        conn.rollback()
    except (pymysql.err.Error, OSError) as exc:  # the connection is gone: the server rolled back
        log.debug("mysql: rollback failed: %s", exc)


def build(dest_id: str, dest: MySQLDestination, events_dir: Path) -> MySQLAdapter:
    return MySQLAdapter(dest_id, dest)
