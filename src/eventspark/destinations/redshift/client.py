"""Redshift client (psycopg 3: Redshift speaks the PostgreSQL wire protocol): connections,
statements, error classification, and how executors stage chunks without S3 (a staging table
per chunk, filled with multi-row INSERTs; with S3 see `s3.py`).

Every staged value is text (`stage_text`), in columns named after a hash of the column's name
(`stage_column`): one staging table, or one JSON object per row on S3, takes chunks of any column
types, and the commit turns the text into the target's types (`load.text_value`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar

import psycopg

from eventspark.destinations.base import ORDER_COLUMN, StagedChunk, TerminalError, TransientError
from eventspark.destinations.postgres.client import PostgresClient, datasource_conninfo
from eventspark.destinations.redshift.configuration import RedshiftDestination
from eventspark.destinations.redshift.dialect import DIALECT, STAGE_TEXT
from eventspark.destinations.sql.stages import new_stage_table
from eventspark.steps.typing import DataType

DEFAULT_PORT = 5439
MAX_PARAMETERS = 30_000
"""Parameters of one INSERT (Redshift's statements are at most 16 MB; PostgreSQL takes 65,535)."""
MAX_VARCHAR_BYTES = 65_535
"""Redshift's varchar(65535) holds 65,535 bytes (PostgreSQL's: characters): staged text is cut there."""
REDSHIFT_NAME_BYTES = 127
SERIALIZATION_CONFLICT = "serializable isolation violation"
"""Redshift's error 1023 (SQLSTATE XX000): concurrent transactions conflicted; retried later."""


def connect(conninfo: str, autocommit: bool = False) -> psycopg.Connection[Any]:
    """A psycopg connection that never prepares statements: psycopg would then send `DEALLOCATE
    ALL` after a DROP, ALTER or ROLLBACK, which Redshift does not have."""
    return psycopg.connect(conninfo, autocommit=autocommit, prepare_threshold=None)


def conninfo_of(dest: RedshiftDestination) -> str:
    return datasource_conninfo(dest.datasource, DEFAULT_PORT)


@contextmanager
def translated_errors(doing: str) -> Iterator[None]:
    """psycopg errors as TransientError (connection lost or refused) or TerminalError (the rest)."""
    try:
        yield
    except psycopg.OperationalError as exc:
        raise TransientError(f"redshift: {doing}: {_message(exc)}") from exc
    except psycopg.Error as exc:
        if is_serialization_conflict(exc):
            raise TransientError(f"redshift: {doing}: {_message(exc)} (serialization conflict)") from exc
        raise TerminalError(f"redshift: {doing}: {_message(exc)}") from exc


def is_serialization_conflict(exc: BaseException) -> bool:
    """Redshift's "1023: Serializable isolation violation on table ..." (SQLSTATE XX000, the
    words in the message or its detail), or PostgreSQL's serialization failure (40001)."""
    if not isinstance(exc, psycopg.Error):
        return False
    if exc.sqlstate == "40001":
        return True
    diag = exc.diag
    text = " ".join(t for t in (str(exc), diag.message_primary, diag.message_detail) if t).lower()
    return exc.sqlstate == "XX000" and (SERIALIZATION_CONFLICT in text or text.startswith("1023"))


def _name_limit(conn: psycopg.Connection[Any]) -> int:
    """The bytes of a name the server keeps: Redshift's 127 when `version()` names Redshift (or
    cannot be read), else the server's `max_identifier_length` (PostgreSQL: 63)."""
    try:
        row = conn.execute("SELECT version()").fetchone()
        if row is None or "redshift" in str(row[0]).lower():
            return REDSHIFT_NAME_BYTES
        row = conn.execute("SELECT current_setting('max_identifier_length')").fetchone()
        return int(row[0]) if row else REDSHIFT_NAME_BYTES
    except (psycopg.Error, ValueError):
        return REDSHIFT_NAME_BYTES


def cut_to_bytes(text: str, limit: int) -> str:
    """`text` cut to at most `limit` UTF-8 bytes, at a character boundary."""
    if len(text) * 4 <= limit:  # fast path: no character takes more than 4 bytes
        return text
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    return encoded[:limit].decode(errors="ignore")


def _message(exc: psycopg.Error) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


class RedshiftClient(PostgresClient):
    """One autocommit connection in UTC (set once: the session's time zone); `transaction` groups
    statements. Statements and rows as Postgres's client, with Redshift's error classes."""

    def __init__(self, conninfo: str) -> None:
        with translated_errors("connecting"):
            self.conn = connect(conninfo, autocommit=True)
            self.conn.execute("SET timezone TO 'UTC'")
            self.name_limit = _name_limit(self.conn)

    def stored_name(self, name: str) -> str:
        """`name` as the server stores it: a server keeping fewer bytes of a name than Redshift
        (PostgreSQL: 63) truncates longer ones silently, at a character boundary."""
        return cut_to_bytes(name, self.name_limit)

    @staticmethod
    def errors(doing: str) -> AbstractContextManager[None]:
        return translated_errors(doing)

    @contextmanager
    def transaction(self, doing: str) -> Iterator[None]:
        with self.errors(doing), self.conn.transaction():
            yield


# --- staged values --------------------------------------------------------------------------------


def stage_column(column: str) -> str:
    """The staging column of a target column: `c_` and 24 hex digits of its name's SHA-256, so
    that executors and the commit agree on it without talking, and the name is valid everywhere
    (lower case: Redshift's `JSON 'auto'` matches keys to lower-case column names)."""
    if column == ORDER_COLUMN:
        return column
    return "c_" + hashlib.sha256(column.encode()).hexdigest()[:24]


def stage_text(value: Any, stage: DataType) -> str | None:
    """A staged value as the text the commit casts to the target type: booleans `true`/`false`,
    integers in digits, floats in plain decimal notation (no exponent, which numeric casts may
    refuse), timestamps as they are, strings cut to 65,535 UTF-8 bytes (what Redshift's
    varchar(65535) holds: a longer one would fail the whole pair's COPY, every pass)."""
    if value is None:
        return None
    if stage is DataType.BOOL:
        return "true" if value else "false"
    if stage is DataType.INT64:
        return str(int(value))  # a bool in a promoted column counts as 0/1
    if stage is DataType.FLOAT64:
        return plain_number(float(value))
    return cut_to_bytes(value if isinstance(value, str) else str(value), MAX_VARCHAR_BYTES)


def plain_number(value: float) -> str:
    text = repr(value)
    if "e" not in text and "E" not in text:
        return text
    return format(Decimal(text), "f")


def stage_defs(columns: Iterable[str]) -> str:
    """The column list of a staging table holding `columns`: text, but the order column."""
    return ", ".join(
        f"{DIALECT.quote(ORDER_COLUMN)} bigint"
        if c == ORDER_COLUMN
        else f"{DIALECT.quote(stage_column(c))} {STAGE_TEXT}"
        for c in columns
    )


def staged_row(columns: Mapping[str, DataType], row: Sequence[Any]) -> list[Any]:
    return [
        (None if v is None else int(v)) if c == ORDER_COLUMN else stage_text(v, t)
        for (c, t), v in zip(columns.items(), row, strict=True)
    ]


def insert_batches(
    head: str, width: int, rows: Sequence[Sequence[Any]], row_sql: str
) -> Iterator[tuple[str, list[Any]]]:
    """Multi-row INSERTs of `rows` (`head` ends with VALUES; `row_sql` is one row's `(...)` with
    `width` placeholders), each under MAX_PARAMETERS parameters."""
    per = max(1, MAX_PARAMETERS // max(width, 1))
    for start in range(0, len(rows), per):
        batch = rows[start : start + per]
        yield head + ", ".join([row_sql] * len(batch)), [v for row in batch for v in row]


# --- bulk copy without S3, on executors ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RedshiftStageTarget:
    """Picklable: what an executor needs to write staging tables of one job."""

    conninfo: str = field(repr=False)  # holds the password
    schema: str
    job_id: str

    json_lines: ClassVar[bool] = False

    def open(self) -> RedshiftStageWriter:
        return RedshiftStageWriter(self)


class RedshiftStageWriter:
    """One connection per executor task; each chunk becomes its own staging table, filled with
    multi-row INSERTs in one transaction."""

    def __init__(self, target: RedshiftStageTarget) -> None:
        self._target = target
        self._conn: psycopg.Connection[Any] | None = None

    def write(self, columns: Mapping[str, DataType], rows: Sequence[Sequence[Any]]) -> StagedChunk:
        name = new_stage_table(self._target.job_id)
        table = f"{DIALECT.quote(self._target.schema)}.{DIALECT.quote(name)}"
        names = ", ".join(DIALECT.quote(stage_column(c)) for c in columns)
        head = f"INSERT INTO {table} ({names}) VALUES ".replace("%", "%%")
        row_sql = "(" + ", ".join(["%s"] * len(columns)) + ")"
        with translated_errors(f"staging {len(rows)} rows"):
            conn = self._connection()
            try:
                with conn.cursor() as cur:
                    cur.execute(f"CREATE TABLE {table} ({stage_defs(columns)})".encode())
                    staged = [staged_row(columns, row) for row in rows]
                    for statement, params in insert_batches(head, len(columns), staged, row_sql):
                        cur.execute(statement.encode(), params)
                conn.commit()
            except BaseException:
                if not conn.closed:
                    conn.rollback()  # keep the connection usable for the task's other chunks
                raise
        return StagedChunk(name, dict(columns), len(rows))

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            self._conn = connect(self._target.conninfo)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
