"""Snowflake client (snowflake-connector-python): the connection, error classification, and the
executors' stage writer (gzip JSON lines PUT on a stage, or uploaded to S3 / GCS)."""

from __future__ import annotations

import gzip
import os
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import orjson
import snowflake.connector
from snowflake.connector import errors as sf_errors

from eventspark.destinations.base import StagedChunk, TerminalError, TransientError
from eventspark.destinations.snowflake.configuration import SnowflakeDestination
from eventspark.steps.typing import DataType

CONNECTOR_OPTIONS = {"login_timeout": 60, "network_timeout": 300, "socket_timeout": None}
"""Connector arguments that `parameters` may set (seconds), with eventspark's defaults."""
LOAD_TIMEOUT = 3600
"""Seconds a bulk statement may run (PUT, COPY and the INSERT/UPDATE/DELETE of a commit):
`parameters.load_timeout`. The connector cancels a statement after its timeout, `network_timeout`
for every other statement (cursor.py: the "timebomb"), so a COPY must not get the 300 s default."""
PINNED_SESSION: dict[str, Any] = {
    "TIMEZONE": "UTC",  # event times are UTC; text without an offset is read as UTC
    "TIMESTAMP_TYPE_MAPPING": "TIMESTAMP_NTZ",  # `timestamp(6)` columns are TIMESTAMP_NTZ in every account
    "TIMESTAMP_INPUT_FORMAT": "AUTO",  # RFC 3339 text casts to TIMESTAMP_TZ
    "QUOTED_IDENTIFIERS_IGNORE_CASE": False,  # "ünï_col" stays as written (the name rule)
    "CLIENT_OUT_OF_BAND_TELEMETRY_ENABLED": False,  # no calls to Snowflake's own telemetry endpoints
}
"""Session parameters eventspark's SQL depends on: they win over the same keys in `parameters`."""
_TRANSIENT = (
    sf_errors.OperationalError,
    sf_errors.InterfaceError,
    sf_errors.InternalServerError,
    sf_errors.ServiceUnavailableError,
    sf_errors.GatewayTimeoutError,
    sf_errors.BadGatewayError,
    sf_errors.RequestTimeoutError,
    sf_errors.OtherHTTPRetryableError,
)
_SESSION_EXPIRED = {390112, 390114}  # the session or its token expired: a new connection works
_GAVE_UP = {604, 625, 630}
"""Snowflake gave up on a statement, not on its data: cancelled (604: by the connector's timeout,
whose message says so), a lock wait past LOCK_TIMEOUT (625), STATEMENT_TIMEOUT_IN_SECONDS (630).
Transient: in stream mode a TerminalError sends the events to `failed`."""


@dataclass(frozen=True, slots=True)
class ConnectSettings:
    """Picklable: what a connection needs (executors connect with it too). No secret in its repr."""

    account: str
    database: str
    schema: str
    """The stored (upper-cased) schema name: the session's current schema."""
    user: str = ""
    password: str = field(default="", repr=False)
    warehouse: str = ""
    host: str = ""
    port: int | None = None
    protocol: str = "https"
    session_parameters: tuple[tuple[str, str], ...] = ()
    options: tuple[tuple[str, float], ...] = ()
    load_timeout: float = LOAD_TIMEOUT

    def session(self) -> dict[str, Any]:
        """The session parameters: the configured ones, then eventspark's pinned ones over them."""
        given = {k: v for k, v in self.session_parameters if k.upper() not in PINNED_SESSION}
        return {**given, **PINNED_SESSION}

    def bulk_timeout(self) -> int:
        """The connector's `timeout` of a bulk statement (never below `network_timeout`)."""
        network = dict(self.options).get("network_timeout") or 0
        return max(1, int(max(self.load_timeout, network)))

    def connect(self) -> Any:
        kwargs: dict[str, Any] = {
            "account": self.account,
            "user": self.user or os.environ.get("SNOWFLAKE_USER", ""),
            "password": self.password or os.environ.get("SNOWFLAKE_PASSWORD", ""),
            "database": self.database,
            "schema": self.schema,
            "protocol": self.protocol,
            "paramstyle": "qmark",
            "autocommit": True,
            "session_parameters": self.session(),
            **dict(self.options),
        }
        for key, value in (("warehouse", self.warehouse), ("host", self.host), ("port", self.port)):
            if value:
                kwargs[key] = value
        conn = snowflake.connector.connect(**kwargs)
        _cancel_quietly(conn)
        return conn


def _cancel_quietly(conn: Any) -> None:
    """A statement still running after its timeout (`network_timeout`, or `load_timeout` for bulk
    statements) is cancelled from a timer thread (connector 4.8 cursor.py, `_timebomb`); when the
    server cannot be reached the cancel request fails too, and its exception escapes that thread
    (an unhandled-thread traceback per statement during an outage). The statement itself fails with
    the connector's OperationalError all the same, so the cancel's failure is dropped.

    The connector has no public setting for this: `network_timeout` (or `execute(timeout=)`) is the
    only bound on its retries of an unreachable server (network.py `RetryCtx`: without a timeout
    `should_retry` never turns false), and the same value arms the timer. So this wraps the private
    `_cancel_query` of one connection, and does nothing when a connector version lacks it."""
    cancel = getattr(conn, "_cancel_query", None)
    if not callable(cancel):
        return

    def cancel_or_give_up(sql: str, request_id: Any) -> Any:
        try:
            return cancel(sql, request_id)
        except sf_errors.Error:
            return {}

    conn._cancel_query = cancel_or_give_up


def settings_of(dest: SnowflakeDestination, schema: str) -> ConnectSettings:
    """The connection settings of `dest`: `parameters` are session parameters, except the
    connector's timeouts (`CONNECTOR_OPTIONS`) and `load_timeout`, in seconds."""
    sf = dest.snowflake
    session: dict[str, str] = {}
    options: dict[str, float] = {k: v for k, v in CONNECTOR_OPTIONS.items() if v is not None}
    load_timeout = float(LOAD_TIMEOUT)
    for key, value in sf.parameters.items():
        name = key.lower()
        if name in CONNECTOR_OPTIONS or name == "load_timeout":
            try:
                seconds = float(value)
            except ValueError:
                raise TerminalError(f"snowflake: parameters.{key} must be a number of seconds") from None
            if name == "load_timeout":
                load_timeout = seconds
            else:
                options[name] = seconds
        else:
            session[key] = value
    return ConnectSettings(
        account=sf.account,
        database=sf.db,
        schema=schema,
        user=sf.username,
        password=sf.password.get_secret_value(),
        warehouse=sf.warehouse,
        host=sf.host,
        port=sf.port,
        protocol=sf.protocol,
        session_parameters=tuple(session.items()),
        options=tuple(options.items()),
        load_timeout=load_timeout,
    )


@contextmanager
def translated_errors(doing: str) -> Iterator[None]:
    """Connector errors as TransientError (unreachable, dropped, 5xx, expired session) or
    TerminalError (what Snowflake refused). Messages carry no statement text (S3 keys)."""
    try:
        yield
    except sf_errors.Error as exc:
        errno = getattr(exc, "errno", None)
        transient = isinstance(exc, _TRANSIENT) or errno in _SESSION_EXPIRED or errno in _GAVE_UP
        kind = TransientError if transient else TerminalError
        raise kind(f"snowflake: {doing}: {_message(exc)}") from exc


def _message(exc: sf_errors.Error) -> str:
    text = (getattr(exc, "msg", None) or str(exc)).strip()
    return " ".join(text.split()) or type(exc).__name__


class SnowflakeClient:
    """One autocommit connection; `transaction` groups statements (the session is in UTC)."""

    def __init__(self, settings: ConnectSettings) -> None:
        self._bulk_timeout = settings.bulk_timeout()
        with translated_errors("connecting"):
            self.conn = settings.connect()

    def execute(self, statement: str, doing: str, params: Sequence[Any] | None = None, bulk: bool = False) -> None:
        """Runs `statement`; `bulk` ones (COPY, a commit's INSERT/UPDATE) may take `load_timeout`."""
        with translated_errors(doing), self.conn.cursor() as cur:
            cur.execute(statement, params, timeout=self._bulk_timeout if bulk else None)

    def rows(self, statement: str, doing: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        with translated_errors(doing), self.conn.cursor() as cur:
            cur.execute(statement, params)
            return [tuple(r) for r in cur.fetchall()]

    @contextmanager
    def transaction(self, doing: str) -> Iterator[None]:
        self.execute("BEGIN", doing)
        try:
            yield
        except BaseException:
            # A failed ROLLBACK must not hide why: the connection (and its transaction) is gone.
            with suppress(TransientError, TerminalError):
                self.execute("ROLLBACK", doing)
            raise
        self.execute("COMMIT", doing)

    def close(self) -> None:
        with suppress(sf_errors.Error):
            self.conn.close()


# --- bulk copy, on executors ----------------------------------------------------------------------

StageKind = Literal["table", "named", "s3", "gcs"]


@dataclass(frozen=True, slots=True)
class StageLocation:
    """Where one pass's files go. `folder` is the pass's folder (its staging table's name) under
    the stage or bucket prefix; a chunk's ref is `<staging table>/<file>`."""

    kind: StageKind
    stage: str = ""
    """The SQL stage reference without `@` (table stage: `"SCHEMA".%TABLE`; named: as configured)."""
    prefix: str = ""
    """Bucket folder (`s3.folder`, `google.folder`) the pass folders live under."""
    bucket: str = ""
    s3_endpoint: str = ""
    s3_region: str = ""
    s3_key_id: str = field(default="", repr=False)
    s3_secret: str = field(default="", repr=False)
    gcs_endpoint: str = ""
    gcs_key: str = field(default="", repr=False)
    """The key file's path or its JSON text ('' : the default credentials)."""

    def key(self, ref: str) -> str:
        """The object key (or the path in the stage) of chunk `ref`."""
        return f"{self.prefix.strip('/')}/{ref}" if self.prefix.strip("/") else ref


@dataclass(frozen=True, slots=True)
class SnowflakeStageTarget:
    """Picklable: what executors need to put one pass's chunks on the stage."""

    settings: ConnectSettings
    location: StageLocation
    table: str
    """The pass's staging table (eventspark's name): the folder of its files."""

    json_lines: ClassVar[bool] = True

    def open(self) -> SnowflakeStageWriter:
        return SnowflakeStageWriter(self)


class SnowflakeStageWriter:
    """One per executor task: each chunk becomes one gzip JSON-lines file on the stage."""

    def __init__(self, target: SnowflakeStageTarget) -> None:
        self._target = target
        self._conn: Any = None
        self._client: Any = None

    def write(self, columns: Mapping[str, DataType], rows: Sequence[Sequence[Any]]) -> StagedChunk:
        names = list(columns)
        lines = b"".join(orjson.dumps(dict(zip(names, row, strict=True))) + b"\n" for row in rows)
        return self.write_json(columns, lines, len(rows))

    def write_json(self, columns: Mapping[str, DataType], lines: bytes | bytearray, rows: int) -> StagedChunk:
        ref = f"{self._target.table}/{uuid.uuid4().hex}.json.gz"
        data = gzip.compress(bytes(lines), compresslevel=5)
        kind = self._target.location.kind
        doing = f"staging {rows} rows"
        if kind in ("table", "named"):
            self._put(ref, data, doing)
        elif kind == "s3":
            self._upload_s3(ref, data, doing)
        else:
            self._upload_gcs(ref, data, doing)
        return StagedChunk(ref, dict(columns), rows)

    def _put(self, ref: str, data: bytes, doing: str) -> None:
        """PUT through the connector: it uploads to the stage's storage (AUTO_COMPRESS off: gzip)."""
        location = self._target.location
        folder, _, name = location.key(ref).rpartition("/")
        with tempfile.TemporaryDirectory(prefix="es-sf-") as tmp:
            path = Path(tmp) / name
            path.write_bytes(data)
            url = "file://" + path.as_posix()
            statement = f"PUT '{url}' @{location.stage}/{folder}/ AUTO_COMPRESS=FALSE OVERWRITE=TRUE"
            with translated_errors(doing):
                if self._conn is None:
                    self._conn = self._target.settings.connect()
                with self._conn.cursor() as cur:
                    cur.execute(statement, timeout=self._target.settings.bulk_timeout())

    def _upload_s3(self, ref: str, data: bytes, doing: str) -> None:
        location = self._target.location
        try:
            if self._client is None:
                self._client = s3_client(location)
            self._client.put_object(Bucket=location.bucket, Key=location.key(ref), Body=data)
        except Exception as exc:  # botocore's errors: a failed upload fails the pair, the task goes on
            raise TransientError(f"snowflake: {doing} in s3://{location.bucket}: {type(exc).__name__}") from exc

    def _upload_gcs(self, ref: str, data: bytes, doing: str) -> None:
        location = self._target.location
        try:
            if self._client is None:
                self._client = gcs_bucket(location)
            self._client.blob(location.key(ref)).upload_from_string(data, content_type="application/gzip")
        except Exception as exc:
            raise TransientError(f"snowflake: {doing} in gs://{location.bucket}: {type(exc).__name__}") from exc

    def close(self) -> None:
        if self._conn is not None:
            with suppress(sf_errors.Error):
                self._conn.close()
            self._conn = None
        self._client = None


def s3_client(location: StageLocation) -> Any:
    """A boto3 client of the bucket (keys from the config, else boto3's usual chain)."""
    import boto3

    kwargs: dict[str, Any] = {}
    if location.s3_endpoint:
        kwargs["endpoint_url"] = location.s3_endpoint
    if location.s3_region:
        kwargs["region_name"] = location.s3_region
    if location.s3_key_id:
        kwargs["aws_access_key_id"] = location.s3_key_id
        kwargs["aws_secret_access_key"] = location.s3_secret
    return boto3.client("s3", **kwargs)


def gcs_bucket(location: StageLocation) -> Any:
    """The google-cloud-storage bucket, with the credentials every Google destination reads
    (`destinations.google_auth`: anonymous with an endpoint and no key)."""
    from google.cloud import storage

    from eventspark.destinations import google_auth

    options = {"api_endpoint": location.gcs_endpoint} if location.gcs_endpoint else None
    path, info = google_auth.key_of(location.gcs_key, "snowflake")
    scopes = ("https://www.googleapis.com/auth/devstorage.read_write",)
    credentials = google_auth.credentials(path, info, location.gcs_endpoint, scopes, "snowflake")
    project = getattr(credentials, "project_id", None) or ("eventspark" if location.gcs_endpoint else None)
    client = storage.Client(project=project, credentials=credentials, client_options=options)
    return client.bucket(location.bucket)
