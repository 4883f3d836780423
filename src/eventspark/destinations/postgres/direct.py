"""Direct writes (`Capabilities.direct_writes`): executors copy whole splits straight into the
target tables, each split in one transaction with its load markers.

A text-format COPY per table: psycopg's C dumpers write each value in its text form by Python
type (int, float, bool, str) and the server parses it into the column's own type (numeric,
timestamp, ...), so no staging table and no second write. When the rows tell each column's one
Python type (`DirectRows.kinds`), its encoder is set once for the whole COPY (`Copy.set_types`)
instead of being looked up for every value: a quarter of the COPY's client CPU. The marker
table's primary key (dest_id, file, table_name) makes a second write of the same split fail,
rolled back whole, instead of loading its rows twice.

When the compiled encoder is built (`speedups/_copytext.pyx`), it makes the COPY data of whole
blocks of rows, the bytes psycopg's per-row path would send, for a fraction of its client CPU;
psycopg's path stays the reference and takes the rows the encoder leaves (`copy_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import islice
from types import ModuleType
from typing import Any

import psycopg
from psycopg import sql

from eventspark.destinations.base import DirectRows, TerminalError
from eventspark.destinations.postgres.client import COPYTEXT, translated_errors, write_blocks

# The text encoder of each Python type of values (`DirectRows.kinds`): the server parses its text
# into the column's own type whatever the name here (a text COPY sends no types).
_ENCODERS: dict[type, str] = {bool: "bool", int: "int8", float: "float8", str: "text"}


def copy_rows(copy: psycopg.Copy, direct: DirectRows, encoding: str, compiled: ModuleType | None = COPYTEXT) -> None:
    """Writes the rows into a text COPY whose client encoding is `encoding`: the blocks `compiled`
    (`speedups/_copytext.pyx`) makes while it takes the rows, then psycopg's per-row path for the
    rest (for all of them without the module, without `kinds`, or not in UTF-8)."""
    width = len(direct.columns)
    kinds = direct.kinds if direct.kinds is not None and len(direct.kinds) == width else None
    done = 0
    if compiled is not None and kinds is not None and encoding == "utf-8" and isinstance(direct.rows, list):
        codes = b"".join(compiled.KIND_CODES[kind] for kind in kinds)
        done = write_blocks(copy, compiled.text_rows, direct.rows, codes)
    if done == len(direct.rows):
        return
    if kinds is not None:
        copy.set_types([_ENCODERS[kind] for kind in kinds])
    for row in islice(direct.rows, done, None):
        # A row may stop at its last value: the missing tail is NULL.
        copy.write_row(row if len(row) == width else [*row, *([None] * (width - len(row)))])


@dataclass(frozen=True, slots=True)
class PostgresDirectTarget:
    """Picklable: what an executor needs to write splits of one destination into its tables."""

    conninfo: str
    schema: str
    loads_table: str
    """The marker table's name (in `schema`)."""
    dest_id: str

    def open(self) -> PostgresDirectWriter:
        return PostgresDirectWriter(self)


class PostgresDirectWriter:
    """One connection per executor task (opened on the first split, again after one is lost)."""

    def __init__(self, target: PostgresDirectTarget) -> None:
        self._target = target
        self._conn: psycopg.Connection[Any] | None = None

    def write_split(
        self, split: str, tables: Mapping[str, DirectRows], before_commit: Callable[[], None] | None = None
    ) -> None:
        """COPYs the rows of each table and inserts one marker (`split`, table) per table, in one
        transaction; `before_commit` (a test hook) runs after the last statement, before COMMIT."""
        rows = sum(len(direct.rows) for direct in tables.values())
        with translated_errors(f"writing split {split} ({rows} rows)"):
            conn = self._connection()
            try:
                with conn.transaction():
                    conn.execute("SET LOCAL TimeZone = 'UTC'")
                    for table, direct in tables.items():
                        self._copy(conn, table, direct)
                    self._mark(conn, split, list(tables))
                    if before_commit is not None:
                        before_commit()
            except psycopg.Error:
                if conn.broken or conn.closed:
                    self.close()  # the next split connects again
                raise

    def _copy(self, conn: psycopg.Connection[Any], table: str, direct: DirectRows) -> None:
        columns = direct.columns
        names = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        statement = sql.SQL("COPY {} ({}) FROM STDIN").format(sql.Identifier(self._target.schema, table), names)
        with conn.cursor() as cur, cur.copy(statement) as copy:
            copy_rows(copy, direct, conn.info.encoding)

    def _mark(self, conn: psycopg.Connection[Any], split: str, tables: list[str]) -> None:
        if not tables:
            return
        loads = sql.Identifier(self._target.schema, self._target.loads_table)
        values = sql.SQL(", ").join(sql.SQL("(%s, %s, %s)") for _ in tables)
        statement = sql.SQL("INSERT INTO {} (dest_id, file, table_name) VALUES ").format(loads) + values
        params = [value for table in tables for value in (self._target.dest_id, split, table)]
        try:
            conn.execute(statement, params)
        except psycopg.errors.UniqueViolation as exc:
            raise TerminalError(f"split {split} was written already: {exc.diag.message_detail or exc}") from exc

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            self._conn = psycopg.connect(self._target.conninfo, autocommit=True)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()
