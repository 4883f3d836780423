"""ClickHouse client: a small client of the HTTP interface (the protocol of EventNative's DSNs),
and the bulk copy executors stage chunks with (`INSERT ... FORMAT JSONEachRow`).

`http[s]://user:password@host:port/db?setting=value`: query parameters are sent as ClickHouse
settings with every statement, except the client options `timeout` (seconds, or Go durations
such as `30s`, `1m`) and `tls_config` (a name of the destination's `tls` map: the CA file that
verifies an https server). The HTTP interface has answered the same way from 18.x to current
releases; errors come back as a non-200 status with `Code: N. ... DB::Exception: ...` text.

Errors are classified here: no connection, a dropped one, a timeout or a code in
`TRANSIENT_CODES` → TransientError; anything else the server refuses → TerminalError.
"""

from __future__ import annotations

import base64
import http.client
import re
import ssl
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import orjson

from eventspark.destinations.base import StagedChunk, TerminalError, TransientError
from eventspark.destinations.clickhouse.dialect import STAGE_TYPES, quote
from eventspark.destinations.sql.stages import new_stage_table
from eventspark.destinations.tsv import STAGE_ENCODERS, encode_rows
from eventspark.steps.typing import DataType

DEFAULT_TIMEOUT = 300.0
IDLE_RECONNECT = 2.0
"""Seconds after which a kept-alive connection is not trusted any more."""
CLIENT_OPTIONS = frozenset({"timeout", "tls_config", "read_timeout", "write_timeout", "debug"})
TRANSIENT_CODES = frozenset(
    {
        159,  # TIMEOUT_EXCEEDED
        209,  # SOCKET_TIMEOUT
        210,  # NETWORK_ERROR
        202,  # TOO_MANY_SIMULTANEOUS_QUERIES
        203,  # NO_FREE_CONNECTION
        236,  # ABORTED
        241,  # MEMORY_LIMIT_EXCEEDED
        242,  # TABLE_IS_READ_ONLY
        252,  # TOO_MANY_PARTS
        285,  # TOO_FEW_LIVE_REPLICAS
        319,  # UNKNOWN_STATUS_OF_INSERT
        394,  # QUERY_WAS_CANCELLED
        425,  # SYSTEM_ERROR
        999,  # KEEPER_EXCEPTION
    }
)
_JSON_NUMBERS = {"output_format_json_quote_64bit_integers": "0"}
_CODE = re.compile(r"Code:\s*(\d+)")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)?")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One parsed DSN: picklable, so executors can open their own connections."""

    scheme: str
    host: str
    port: int
    user: str
    password: str
    settings: tuple[tuple[str, str], ...] = ()
    timeout: float = DEFAULT_TIMEOUT
    ca_file: str | None = None

    @property
    def address(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


def parse_dsn(dsn: str, tls: Mapping[str, str] | None = None) -> Endpoint:
    """An Endpoint from an EventNative ClickHouse DSN; TerminalError when it is not one."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TerminalError(f"clickhouse: DSN {_redact(dsn)!r} is not http(s)://[user[:password]@]host[:port]/db")
    try:
        port = parts.port or (8443 if parts.scheme == "https" else 8123)
    except ValueError as exc:
        raise TerminalError(f"clickhouse: DSN {_redact(dsn)!r}: {exc}") from exc
    params = dict(parse_qsl(parts.query))
    ca_name = params.get("tls_config")
    ca_file = (tls or {}).get(ca_name) if ca_name else None
    if ca_name and ca_file is None:
        raise TerminalError(f"clickhouse: DSN names tls_config {ca_name!r}, which clickhouse.tls lacks")
    settings = tuple((k, v) for k, v in params.items() if k not in CLIENT_OPTIONS)
    timeout = _seconds(params.get("timeout") or params.get("read_timeout"))
    user, password = unquote(parts.username or "default"), unquote(parts.password or "")
    return Endpoint(parts.scheme, parts.hostname, port, user, password, settings, timeout, ca_file)


def _seconds(text: str | None) -> float:
    if not text:
        return DEFAULT_TIMEOUT
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise TerminalError(f"clickhouse: timeout {text!r} is not a duration like 30s or 1m")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _redact(dsn: str) -> str:
    parts = urlsplit(dsn)
    if parts.password:
        return dsn.replace(f":{parts.password}@", ":***@", 1)
    return dsn


@dataclass(slots=True)
class Client:
    """One keep-alive HTTP connection to one server; reconnects after a failure. Statements name
    their tables with the database, so no default database is sent."""

    endpoint: Endpoint
    _conn: http.client.HTTPConnection | None = field(default=None, repr=False)
    _used: float = field(default=0.0, repr=False)

    def execute(
        self,
        sql: str,
        doing: str = "running a statement",
        data: bytes | bytearray | None = None,
        settings: Mapping[str, str] | None = None,
    ) -> bytes:
        """Runs `sql`; with `data`, `sql` is an `INSERT ... FORMAT ...` and `data` its rows.

        `wait_end_of_query` makes the server buffer the answer, so an error in the middle of a
        statement still arrives as an error status rather than after a 200 header."""
        params = dict(self.endpoint.settings)
        params.update(settings or {})
        params["wait_end_of_query"] = "1"
        body: bytes | bytearray
        if data is None:
            body = sql.encode()
        else:
            params["query"] = sql
            body = data
        return self._post("/?" + urlencode(params), body, doing)

    def rows(self, sql: str, doing: str = "reading") -> list[list[Any]]:
        """The rows of a SELECT, values as JSON gives them (numbers, strings, None)."""
        text = self.execute(f"{sql} FORMAT JSONCompact", doing, settings=_JSON_NUMBERS)
        data: list[list[Any]] = orjson.loads(text)["data"]
        return data

    def transaction(self, doing: str) -> AbstractContextManager[None]:
        """ClickHouse has no transactions (`Capabilities.transactions` is false): a no-op."""
        return nullcontext()

    def _post(self, path: str, body: bytes | bytearray, doing: str) -> bytes:
        credentials = f"{self.endpoint.user}:{self.endpoint.password}".encode()
        headers = {
            "Authorization": "Basic " + base64.b64encode(credentials).decode(),
            "Connection": "keep-alive",
        }
        try:
            response, payload = self._exchange(path, body, headers)
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise TransientError(f"clickhouse {self.endpoint.address}: {doing}: {_describe(exc)}") from exc
        if response.status != 200:
            raise _server_error(response.status, payload, f"clickhouse: {doing}")
        return payload

    def _exchange(
        self, path: str, body: bytes | bytearray, headers: dict[str, str]
    ) -> tuple[http.client.HTTPResponse, bytes]:
        """One request; sent again on a fresh connection when a kept-alive one turns out closed
        while *sending* (the server never saw the request, so sending it again is safe)."""
        if self._conn is not None and time.monotonic() - self._used > IDLE_RECONNECT:
            self.close()  # the server closes idle connections (keep_alive_timeout, 3 s by default)
        reused = self._conn is not None
        conn = self._connection()
        try:
            conn.request("POST", path, body, headers)
        except (BrokenPipeError, ConnectionResetError):
            if not reused:
                raise
            self.close()
            conn = self._connection()
            conn.request("POST", path, body, headers)
        response = conn.getresponse()
        payload = response.read()
        self._used = time.monotonic()
        return response, payload

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            ep = self.endpoint
            if ep.scheme == "https":
                context = ssl.create_default_context(cafile=ep.ca_file)
                self._conn = http.client.HTTPSConnection(ep.host, ep.port, timeout=ep.timeout, context=context)
            else:
                self._conn = http.client.HTTPConnection(ep.host, ep.port, timeout=ep.timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _server_error(status: int, payload: bytes, doing: str) -> TransientError | TerminalError:
    text = payload.decode("utf-8", "replace").strip()
    message = text.split(", e.what()")[0][:2000] or f"HTTP {status}"
    match = _CODE.search(text)
    if match is None:
        # Proxies and load balancers answer 502-504 while the server restarts.
        kind = TransientError if status >= 502 else TerminalError
        return kind(f"{doing}: HTTP {status}: {message}")
    code = int(match.group(1))
    kind = TransientError if code in TRANSIENT_CODES else TerminalError
    return kind(f"{doing}: {message}")


def error_code(exc: BaseException) -> int | None:
    """The ClickHouse error code in a translated error's message, if any."""
    match = _CODE.search(str(exc))
    return int(match.group(1)) if match else None


# --- bulk copy, on executors ----------------------------------------------------------------------

_SKIP_UNKNOWN = {"input_format_skip_unknown_fields": "1"}


@dataclass(frozen=True, slots=True)
class ClickHouseStageTarget:
    """Picklable: the server (the one the driver uses) and database where a job stages."""

    endpoint: Endpoint
    db: str
    job_id: str
    engine: str = "Log"
    """The staging tables' engine: Memory for a pass small enough (`load.stage_engine`), else Log."""

    json_lines: ClassVar[bool] = True

    def open(self) -> ClickHouseStageWriter:
        return ClickHouseStageWriter(self)


class ClickHouseStageWriter:
    """One HTTP connection per executor task; each chunk becomes its own table."""

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
        self._client.execute(f"CREATE TABLE {name} ({defs}) ENGINE = {self._target.engine}", doing)
        insert = f"INSERT INTO {name} ({', '.join(quote(c) for c in columns)}) FORMAT {data_format}"
        # JSON rows may name columns that are null in every row of the chunk: it has none of them.
        self._client.execute(insert, doing, body, _SKIP_UNKNOWN)
        return StagedChunk(ref, dict(columns), count)

    def close(self) -> None:
        self._client.close()
