"""PostgreSQL client (psycopg 3): connections, statements, error classification, and the bulk
copy executors stage chunks with (binary COPY into UNLOGGED tables).

The COPY data comes in blocks from the compiled encoder when it is built (`speedups/_copytext.pyx`):
the bytes psycopg's per-row path (`Copy.set_types` + `Copy.write_row`) would send, for a fraction
of its client CPU. psycopg's path stays the reference and takes the rows the encoder leaves
(`write_blocks`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from itertools import islice
from types import ModuleType
from typing import Any, ClassVar

import psycopg
from psycopg import sql

from eventspark import speedups
from eventspark.config.base import DataSource
from eventspark.destinations.base import StagedChunk, TerminalError, TransientError
from eventspark.destinations.postgres.configuration import PostgresDestination
from eventspark.destinations.postgres.dialect import DIALECT, STAGE_TYPES
from eventspark.destinations.sql.stages import new_stage_table
from eventspark.steps.typing import DataType

DEFAULT_PORT = 5432
CONNECT_TIMEOUT = 10
# The compiled encoder of COPY data (None: psycopg's per-row path alone), and the size of its
# blocks: large enough that the per-block work is nothing, small enough to bound the memory.
COPYTEXT = speedups.load("copytext")
BLOCK_SIZE = 1 << 20


def conninfo_of(dest: PostgresDestination) -> str:
    return datasource_conninfo(dest.datasource, DEFAULT_PORT)


def datasource_conninfo(ds: DataSource, default_port: int) -> str:
    """libpq connection string of a `datasource` block (also Redshift's)."""
    params: dict[str, Any] = {"host": ds.host, "port": ds.port or default_port, "dbname": ds.db}
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


class PostgresClient:
    """One autocommit connection; `transaction` groups statements (in UTC)."""

    def __init__(self, conninfo: str) -> None:
        with translated_errors("connecting"):
            self.conn = psycopg.connect(conninfo, autocommit=True)
            # Literals are written with doubled quotes only: backslashes must not be escapes. (A
            # SET, not `options`, which would replace the user's `parameters: {options: ...}`.)
            self.conn.execute("SET standard_conforming_strings = on")

    @staticmethod
    def errors(doing: str) -> AbstractContextManager[None]:
        """How this client classifies the driver's errors (Redshift adds its own)."""
        return translated_errors(doing)

    def execute(self, statement: str, doing: str, params: Sequence[Any] | None = None) -> None:
        with self.errors(doing):
            self.conn.execute(statement.encode(), params)

    def rows(self, statement: str, doing: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.errors(doing):
            return self.conn.execute(statement.encode(), params).fetchall()

    @contextmanager
    def transaction(self, doing: str) -> Iterator[None]:
        with self.errors(doing), self.conn.transaction():
            self.conn.execute("SET LOCAL TimeZone = 'UTC'")
            yield

    def close(self) -> None:
        self.conn.close()


# --- bulk copy, on executors ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PostgresStageTarget:
    """Picklable: what an executor needs to write staging tables of one job."""

    conninfo: str
    schema: str
    job_id: str

    json_lines: ClassVar[bool] = False
    text_holds_nul: ClassVar[bool] = DIALECT.text_holds_nul
    """Postgres text cannot store U+0000 (the dialect says so): the executors fail such a value's event
    (`batch.chunks.chunk_buffer`) rather than this COPY failing the whole chunk."""

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
                        copy_binary_rows(copy, types, rows, conn.info.encoding)
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


def copy_binary_rows(
    copy: psycopg.Copy,
    types: list[str],
    rows: Sequence[Sequence[Any]],
    encoding: str,
    compiled: ModuleType | None = COPYTEXT,
) -> None:
    """Writes the rows into a binary COPY of columns of the stage `types` whose client encoding is
    `encoding`: the blocks `compiled` makes while it takes the rows, then psycopg's per-row path
    for the rest (for all of them without the module or not in UTF-8)."""
    done = 0
    stage_codes = compiled.STAGE_CODES if compiled is not None and encoding == "utf-8" else {}
    if compiled is not None and isinstance(rows, list) and all(name in stage_codes for name in types):
        # After data written whole (`Copy.write`) psycopg sends no header of its own, and its
        # trailer only after rows of its own.
        copy.write(compiled.BINARY_HEADER)
        done = write_blocks(copy, compiled.binary_rows, rows, b"".join(stage_codes[name] for name in types))
        if done == len(rows):
            copy.write(compiled.BINARY_TRAILER)
            return
    copy.set_types(types)
    for row in islice(rows, done, None):
        copy.write_row(row)


def write_blocks(copy: psycopg.Copy, encode: Callable[..., Any], rows: list[Any], codes: bytes) -> int:
    """Writes the blocks `encode` (`text_rows` or `binary_rows` of `speedups/_copytext.pyx`) makes
    of the rows; returns how many rows they hold (the next one holds a value psycopg must have: to
    write it as it does, or to fail as it fails)."""
    done = 0
    while done < len(rows):
        data, done, stopped = encode(rows, done, codes, BLOCK_SIZE)
        if data:
            copy.write(data)
        if stopped:
            break
    return done
