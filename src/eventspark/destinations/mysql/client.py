"""MySQL / MariaDB client (PyMySQL): connections in strict mode and UTC, statements, error
classification, and the bulk copy executors stage chunks with (`LOAD DATA LOCAL INFILE` of TSV
into InnoDB staging tables)."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

import pymysql

from eventspark.destinations.base import StagedChunk, TerminalError, TransientError
from eventspark.destinations.mysql.configuration import MySQLDestination
from eventspark.destinations.mysql.dialect import STAGE_TYPES, TABLE_OPTIONS, quote
from eventspark.destinations.sql.stages import new_stage_table
from eventspark.destinations.tsv import NULL, STAGE_ENCODERS, Encoder, encode_rows
from eventspark.steps.typing import DataType, coerce, parse_timestamp

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
        defs = ", ".join(f"{quote(c)} {STAGE_TYPES[t]}" for c, t in columns.items())
        try:
            body = encode_rows(rows, [STAGE_FILE_ENCODERS[t] for t in columns.values()])
        except ValueError as exc:
            raise TerminalError(f"mysql: staging {len(rows)} rows: {exc}") from exc
        with tempfile.NamedTemporaryFile(prefix="eventspark-", suffix=".tsv") as file:
            file.write(body)
            file.flush()
            with translated_errors(f"staging {len(rows)} rows"):
                conn = self._connection()
                with conn.cursor() as cur:
                    cur.execute(f"CREATE TABLE {name} ({defs}) {TABLE_OPTIONS.format('utf8mb4_bin')}")
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


class MySQLClient:
    """One autocommit connection; `transaction` groups statements."""

    def __init__(self, info: ConnectInfo) -> None:
        with translated_errors("connecting"):
            self.conn = info.connect()

    def execute(self, statement: str, doing: str, params: Sequence[Any] | None = None) -> None:
        """Runs `statement`; with `params`, `%s` marks them (and `%` in names must be `%%`: `pct`)."""
        with translated_errors(doing), self.conn.cursor() as cur:
            cur.execute(statement, params)

    def rows(self, statement: str, doing: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        with translated_errors(doing), self.conn.cursor() as cur:
            cur.execute(statement, params)
            return list(cur.fetchall())

    @contextmanager
    def transaction(self, doing: str) -> Iterator[None]:
        with translated_errors(doing):
            self.conn.begin()
            try:
                yield
                self.conn.commit()
            except BaseException:
                _rollback(self.conn)
                raise

    def close(self) -> None:
        with suppress(pymysql.err.Error):  # already closed by the server
            self.conn.close()


def _rollback(conn: Any) -> None:
    try:
        conn.rollback()
    except (pymysql.err.Error, OSError) as exc:  # the connection is gone: the server rolled back
        log.debug("mysql: rollback failed: %s", exc)


# --- values as MySQL reads them -------------------------------------------------------------------


def _timestamps(values: Sequence[Any]) -> list[str]:
    """RFC 3339 text as MySQL DATETIME text in UTC (MySQL reads no offsets)."""
    out = []
    for v in values:
        if v is None:
            out.append(NULL)
        elif len(v) == 27 and v[26] == "Z" and v[10] == "T":  # the pipeline's own format: no parsing
            out.append(f"{v[:10]} {v[11:26]}")
        else:
            out.append(mysql_datetime(v).isoformat(" ", "microseconds"))
    return out


def mysql_datetime(value: Any) -> datetime:
    """A timestamp value (RFC 3339 text or datetime) as a naive UTC datetime."""
    parsed = parse_timestamp(value) if isinstance(value, str) else coerce(value, DataType.TIMESTAMP)
    if not isinstance(parsed, datetime):
        raise ValueError(f"{value!r} is not an RFC 3339 timestamp")
    return parsed.replace(tzinfo=None)


STAGE_FILE_ENCODERS: dict[DataType, Encoder] = {**STAGE_ENCODERS, DataType.TIMESTAMP: _timestamps}
