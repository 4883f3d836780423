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

With it, a split is first encoded in the binary COPY format, each value in its column's own
binary form (`binary_data`: numeric, timestamps, integers, text...): the server then parses no
text, a fifth less of its CPU per row (3.1 → 2.45 µs on the bench's rows). The values are those
the text would carry, and a value whose binary form the encoder cannot be sure of (a timestamp
with more than microseconds, a float that is not finite, ...) sends the whole split as text
instead: the text COPY stays the reference, and the tests load the same rows both ways and
compare the tables.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import islice
from types import ModuleType
from typing import Any

import psycopg
from psycopg import sql

from eventspark.destinations.base import DirectRows, TerminalError
from eventspark.destinations.postgres.client import BLOCK_SIZE, COPYTEXT, translated_errors, write_blocks

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


def binary_data(direct: DirectRows, encoding: str, compiled: ModuleType | None = COPYTEXT) -> list[bytes] | None:
    """The binary COPY data of every row (header and trailer included), or None when some column
    or value has no binary form the encoder is sure of (then the split goes as text)."""
    if compiled is None or encoding != "utf-8" or direct.sql_types is None or not isinstance(direct.rows, list):
        return None
    codes = [compiled.DIRECT_CODES.get(_without_modifier(sql_type)) for sql_type in direct.sql_types]
    if len(codes) != len(direct.columns) or None in codes:
        return None
    kinds = b"".join(codes)  # type: ignore[arg-type]  # None ruled out above
    blocks = [compiled.BINARY_HEADER]
    done = 0
    while done < len(direct.rows):
        data, done, stopped = compiled.binary_direct_rows(direct.rows, done, kinds, BLOCK_SIZE)
        if stopped:
            return None
        blocks.append(data)
    blocks.append(compiled.BINARY_TRAILER)
    return blocks


def _without_modifier(sql_type: str) -> str:
    """`numeric(38,18)` → `numeric`, `timestamp(3) without time zone` → `timestamp without time zone`."""
    return _MODIFIER.sub("", sql_type.strip().lower())


_MODIFIER = re.compile(r"\(\d+(?:,\s*\d+)?\)", re.ASCII)


@dataclass(frozen=True, slots=True)
class PostgresDirectTarget:
    """Picklable: what an executor needs to write splits of one destination into its tables."""

    conninfo: str
    schema: str
    loads_table: str
    """The marker table's name (in `schema`)."""
    dest_id: str
    binary: bool = True
    """Splits in the binary COPY format where the encoder can (`binary_data`); False: text only."""

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
        blocks = binary_data(direct, conn.info.encoding) if self._target.binary else None
        if blocks is not None:
            statement += sql.SQL(" (FORMAT BINARY)")
        with conn.cursor() as cur, cur.copy(statement) as copy:
            if blocks is None:
                copy_rows(copy, direct, conn.info.encoding)
                return
            for block in blocks:  # data written whole: psycopg adds no header or trailer of its own
                copy.write(block)

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
