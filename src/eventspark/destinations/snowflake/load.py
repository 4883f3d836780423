"""Snowflake: what differs from the shared SQL load (`sql.warehouse.SqlWarehouse`).

Names follow EventNative's rule (`dialect.stored_name`): plain names are upper-cased, and every
name is quoted.

Batch: `stage_target` creates the pass's staging table `_es_stage_<job>_<dest hash>` (one VARIANT
column) before the executors run; they write each chunk as a gzip JSON-lines file and PUT it on
that table's stage (or the named `stage`, or upload it to S3 / GCS). `commit` then runs, in one
transaction: one `COPY INTO` the staging table per file (PURGE removes an internal stage's file
once loaded), one `INSERT ... SELECT` converting each value to its column's type (with a primary
key, a `DELETE ... USING` of the keys first and only the last row of each key by `_es_seq`), the
load markers, and a `DELETE` emptying the staging table for the next pair. The shared clean-up
drops the staging tables of a pass when it ends (and those of killed passes later), and a table
stage goes with its table.

Stream: `INSERT ... SELECT ... FROM VALUES (?, ...), ...` (after a `DELETE ... USING` it with a key), values
bound as text, in statements of at most `STREAM_ROWS` rows.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from eventspark.destinations.base import ORDER_COLUMN, STAGE_PREFIX, Load, StagedChunk, TerminalError
from eventspark.destinations.snowflake.capabilities import CAPABILITIES
from eventspark.destinations.snowflake.client import (
    SnowflakeClient,
    SnowflakeStageTarget,
    StageLocation,
    gcs_bucket,
    s3_client,
    settings_of,
)
from eventspark.destinations.snowflake.configuration import SnowflakeDestination
from eventspark.destinations.snowflake.dialect import NAMES, logical_name, stored_name
from eventspark.destinations.sql.statements import load_columns
from eventspark.destinations.sql.warehouse import SqlClient, SqlWarehouse
from eventspark.steps.diff import Table
from eventspark.steps.typing import DataType

log = logging.getLogger(__name__)

STREAM_ROWS = 1000
"""Rows per stream INSERT (Snowflake takes at most 16,384 rows in a VALUES list)."""
_PART = r'(?:[A-Za-z_][A-Za-z0-9_$]*|"[^"\x00-\x1f]+")'
_STAGE_NAME = re.compile(rf"^{_PART}(?:\.{_PART}){{0,2}}$")
"""A stage name as configured: one to three parts, plain or quoted."""
_VARIANT_TYPES = ("VARIANT", "OBJECT", "ARRAY")
_CHUNK_REF = re.compile(r"([a-z0-9_]+)/[0-9a-f]{32}\.json\.gz")
"""`<staging table>/<file>`, as the stage writer names chunks: written into COPY statements as is."""


def build(dest_id: str, dest: SnowflakeDestination, events_dir: Path) -> SnowflakeWarehouse:
    return SnowflakeWarehouse(dest_id, dest)


class SnowflakeWarehouse(SqlWarehouse):
    """A schema of a Snowflake database (the schema is created when missing; the database is not)."""

    dialect = NAMES
    capabilities = CAPABILITIES
    MARKER_TABLE = (
        "CREATE TABLE IF NOT EXISTS {name} (dest_id text, file text, table_name text, "
        "loaded_at timestamp_ntz DEFAULT CURRENT_TIMESTAMP(), PRIMARY KEY (dest_id, file, table_name))"
    )

    def __init__(self, dest_id: str, dest: SnowflakeDestination) -> None:
        super().__init__(dest_id, dest.snowflake.schema_ or "public")
        self.settings = settings_of(dest, stored_name(self.schema))
        self.location = _location(dest.snowflake)

    def _connect(self) -> SnowflakeClient:
        return SnowflakeClient(self.settings)

    # --- catalog ------------------------------------------------------------------------------

    def _catalog(self, client: SqlClient, name: str | None) -> tuple[list[Any], list[tuple[str, Sequence[str]]]]:
        assert isinstance(client, SnowflakeClient)
        schema = stored_name(self.schema)
        where, params = "table_schema = ?", [schema]
        if name is not None:
            where, params = where + " AND table_name = ?", [*params, stored_name(name)]
        found = client.rows(
            "SELECT table_name, column_name, data_type, numeric_precision, numeric_scale "
            f"FROM information_schema.columns WHERE {where} ORDER BY table_name, ordinal_position",
            "reading tables",
            params,
        )
        columns = [(logical_name(t), logical_name(c), _sql_type(d, p, s)) for t, c, d, p, s in found]
        keys: dict[str, list[str]] = {}
        for row in client.rows(f"SHOW PRIMARY KEYS IN SCHEMA {self.dialect.quote(self.schema)}", "reading tables"):
            table, column = logical_name(row[3]), logical_name(row[4])
            if name is None or table == name:
                keys.setdefault(table, []).append(column)
        return columns, list(keys.items())

    def _stage_tables(self, client: SqlClient) -> list[tuple[str, str]]:
        assert isinstance(client, SnowflakeClient)
        found = client.rows(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = ? AND STARTSWITH(table_name, ?)",
            "listing staging tables",
            [stored_name(self.schema), stored_name(STAGE_PREFIX)],
        )
        return [(logical_name(t), "") for (t,) in found]

    def _key_statements(self, client: SqlClient, table: str, keys: tuple[str, ...]) -> list[str]:
        """A table without a primary key gets one (Snowflake records it, does not enforce it)."""
        current = self._read(table).get(table)
        if current is not None and current.primary_keys:
            raise TerminalError(f"snowflake: table {table!r} has a primary key; it cannot change")
        return [f"ALTER TABLE {self.name(table)} ADD PRIMARY KEY ({', '.join(self.dialect.quote(k) for k in keys)})"]

    # --- batch --------------------------------------------------------------------------------

    def stage_target(self, job_id: str, pass_bytes: int = 0) -> SnowflakeStageTarget:
        """Creates the pass's staging table (its stage holds the files unless another is configured)."""
        digest = hashlib.sha256(self.dest_id.encode()).hexdigest()[:8]
        table = f"{STAGE_PREFIX}{job_id}_{digest}"
        if not re.fullmatch(r"[a-z0-9_]+", table):
            raise TerminalError(f"snowflake: job id {job_id!r} cannot name a staging table")
        with self._session() as client:
            client.execute(f"CREATE TABLE IF NOT EXISTS {self.name(table)} (v VARIANT)", "creating the staging table")
        location = self.location
        if location.kind == "table":
            location = StageLocation("table", f"{self.dialect.quote(self.schema)}.%{stored_name(table)}")
        return SnowflakeStageTarget(self.settings, location, table)

    def _copy(self, client: SqlClient, load: Load, doing: str) -> None:
        """Runs inside the commit's transaction: COPY each file into the staging table, move its
        rows into the target, empty the staging table."""
        if not load.chunks:
            return
        refs = [_CHUNK_REF.fullmatch(chunk.ref) for chunk in load.chunks]
        if not all(refs):
            raise TerminalError(f"snowflake: {doing}: a chunk that is not a staged file of eventspark's")
        staging = {ref.group(1) for ref in refs if ref is not None}
        if len(staging) != 1:
            raise TerminalError(f"snowflake: {doing}: chunks of several passes in one load")
        (table,) = staging
        for chunk in load.chunks:
            client.execute(self._copy_statement(table, chunk), doing)
        for statement in self._move_statements(load, table):
            client.execute(statement, doing)
        client.execute(f"DELETE FROM {self.name(table)}", doing)

    def _copy_statement(self, table: str, chunk: StagedChunk) -> str:
        location = self.location
        options = "FILE_FORMAT = (TYPE = JSON) FORCE = TRUE"
        if location.kind == "table":
            source = f"@{self.dialect.quote(self.schema)}.%{stored_name(table)}/{chunk.ref}"
            options += " PURGE = TRUE"
        elif location.kind in ("named", "gcs"):
            source = f"@{location.stage}/{location.key(chunk.ref)}"
            options += " PURGE = TRUE" if location.kind == "named" else ""
        else:
            url = self.literal(f"s3://{location.bucket}/{location.key(chunk.ref)}")
            key_id, secret = self.literal(location.s3_key_id), self.literal(location.s3_secret)
            source = f"{url} CREDENTIALS = (AWS_KEY_ID = {key_id} AWS_SECRET_KEY = {secret})"
        return f"COPY INTO {self.name(table)} FROM {source} {options}"

    def _move_statements(self, load: Load, staging: str) -> list[str]:
        """INSERT (DELETE + INSERT with a key) of the staged rows, converted to the target's types."""
        columns = load_columns(load)
        target = load.table
        quote = self.dialect.quote

        def value(c: str) -> str:
            return _typed(f"v[{self.literal(c)}]::VARCHAR", target.columns[c])

        select = _select_list(columns, value, quote)
        names = ", ".join(quote(c) for c in columns)
        keys = target.primary_keys
        if not keys:
            return [f"INSERT INTO {self.name(target.name)} ({names}) SELECT {select} FROM {self.name(staging)}"]
        order = quote(ORDER_COLUMN)
        seq = f"CAST(v[{self.literal(ORDER_COLUMN)}]::VARCHAR AS NUMBER)" if load.ordered else "0"
        source = f"SELECT {select}, {seq} AS {order} FROM {self.name(staging)}"
        partition = ", ".join(quote(k) for k in keys)
        rank = f"ROW_NUMBER() OVER (PARTITION BY {partition} ORDER BY {order} DESC)"
        return self._replace(target, columns, f"SELECT {names} FROM ({source}) QUALIFY {rank} = 1", source)

    def _replace(self, target: Table, columns: Sequence[str], rows: str, keys_from: str) -> list[str]:
        """DELETE the stored rows whose key is among `keys_from`'s, then INSERT `rows` (one per key):
        EventNative 1.41's Snowflake upsert, run in the caller's transaction. (A MERGE would keep
        the stored values of columns the load lacks; fakesnow cannot run MERGE in a transaction.)"""
        quote = self.dialect.quote
        key_names = ", ".join(quote(k) for k in target.primary_keys)
        on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in target.primary_keys)
        names = ", ".join(quote(c) for c in columns)
        table = self.name(target.name)
        return [
            f"DELETE FROM {table} AS t USING (SELECT DISTINCT {key_names} FROM ({keys_from})) AS s WHERE {on}",
            f"INSERT INTO {table} ({names}) {rows}",
        ]

    def _discard_chunks(self, client: SqlClient, chunks: Sequence[StagedChunk]) -> None:
        """Internal stages PURGE loaded files; S3 / GCS objects are deleted here (a failure is only
        logged: the pass's staging table goes at its end, the bucket objects need a lifecycle rule)."""
        kind = self.location.kind
        if kind not in ("s3", "gcs") or not chunks:
            return
        try:
            if kind == "s3":
                s3 = s3_client(self.location)
                keys = [{"Key": self.location.key(c.ref)} for c in chunks]
                for start in range(0, len(keys), 1000):
                    s3.delete_objects(Bucket=self.location.bucket, Delete={"Objects": keys[start : start + 1000]})
            else:
                bucket = gcs_bucket(self.location)
                for chunk in chunks:
                    bucket.blob(self.location.key(chunk.ref)).delete()
        except Exception as exc:
            log.warning("snowflake: could not delete staged files in %s: %s", self.location.bucket, type(exc).__name__)

    # --- stream -------------------------------------------------------------------------------

    def _insert_rows(
        self, client: SqlClient, table: Table, columns: Sequence[str], rows: Sequence[Mapping[str, Any]], doing: str
    ) -> None:
        """INSERT (DELETE + INSERT with a key) ... SELECT over a VALUES list of text parameters,
        converted to the column types as a batch load converts staged values."""
        assert isinstance(client, SnowflakeClient)
        quote = self.dialect.quote
        row_mark = "(" + ", ".join("?" * len(columns)) + ")"
        per_statement = max(1, min(STREAM_ROWS, 16_000 // max(1, len(columns))))
        positions = {c: f"column{i + 1}" for i, c in enumerate(columns)}
        select = _select_list(columns, lambda c: _typed(positions[c], table.columns[c]), quote)
        for start in range(0, len(rows), per_statement):
            batch = rows[start : start + per_statement]
            source = f"SELECT {select} FROM VALUES {', '.join([row_mark] * len(batch))}"
            params = [_text(row.get(c)) for row in batch for c in columns]
            if table.primary_keys:
                delete, insert = self._replace(table, columns, source, source)
                client.execute(delete, doing, params)
                client.execute(insert, doing, params)
            else:
                names = ", ".join(quote(c) for c in columns)
                client.execute(f"INSERT INTO {self.name(table.name)} ({names}) {source}", doing, params)


# --- values ---------------------------------------------------------------------------------------


def _select_list(columns: Sequence[str], value: Callable[[str], str], quote: Callable[[str], str]) -> str:
    return ", ".join(f"{value(c)} AS {quote(c)}" for c in columns)


def _typed(text: str, target_sql: str) -> str:
    """SQL converting `text` (a value as text: 'true', '12', '2.5', RFC 3339, ...) to `target_sql`.

    Booleans become 1 and 0 in number columns (a column promoted from bool to int); timestamps
    keep their offsets, converted to UTC, then stored without a time zone (`timestamp(6)`)."""
    data_type = NAMES.data_type_of(target_sql)
    if data_type in (DataType.INT64, DataType.FLOAT64):
        number = f"IFF({text} = 'true', '1', IFF({text} = 'false', '0', {text}))"
        return f"CAST({number} AS {target_sql})"
    if data_type is DataType.TIMESTAMP:
        return f"CAST(CONVERT_TIMEZONE('UTC', CAST({text} AS TIMESTAMP_TZ)) AS {target_sql})"
    if target_sql.upper().startswith(_VARIANT_TYPES):
        return f"PARSE_JSON({text})"
    return f"CAST({text} AS {target_sql})"


def _text(value: Any) -> str | None:
    """A stream value as the text `_typed` converts (datetimes print as ISO 8601)."""
    if value is None or type(value) is str:
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)


def _sql_type(data_type: str, precision: int | None, scale: int | None) -> str:
    """A column's type from information_schema (`NUMBER` with its precision and scale)."""
    if data_type.upper() in ("NUMBER", "DECIMAL", "NUMERIC") and precision is not None:
        return f"NUMBER({precision},{scale or 0})"
    return data_type


def _location(sf: Any) -> StageLocation:
    """Where batch files go, from the config (`table`: the pass's staging table's own stage)."""
    stage = sf.stage.strip()
    if stage and not _STAGE_NAME.match(stage):
        raise TerminalError(f"snowflake: stage {stage!r} is not an SQL name (name, schema.name or db.schema.name)")
    if sf.s3 is not None:
        s3 = sf.s3
        key_id = s3.access_key_id.get_secret_value() if s3.access_key_id else ""
        secret = s3.secret_access_key.get_secret_value() if s3.secret_access_key else ""
        if not key_id:
            key_id, secret = _default_aws_keys()
        return StageLocation(
            "s3",
            prefix=s3.folder,
            bucket=s3.bucket,
            s3_endpoint=s3.endpoint,
            s3_region=s3.region,
            s3_key_id=key_id,
            s3_secret=secret,
        )
    if sf.google is not None:
        if not stage:
            raise TerminalError("snowflake: google staging needs `stage`: an external stage on the bucket")
        google = sf.google
        key = google.key_file
        key_text = key if isinstance(key, str) else (_json(key) if key else "")
        return StageLocation(
            "gcs",
            stage=stage,
            prefix=google.folder,
            bucket=google.gcs_bucket,
            gcs_endpoint=google.gcs_endpoint,
            gcs_key=key_text,
        )
    if stage:
        return StageLocation("named", stage=stage, prefix="eventspark")
    return StageLocation("table")


def _default_aws_keys() -> tuple[str, str]:
    """The keys boto3 finds (environment, profile) for the COPY's CREDENTIALS."""
    try:
        import boto3

        found = boto3.Session().get_credentials()
    except Exception:  # no boto3 or no credentials: the COPY will say so
        return "", ""
    if found is None:
        return "", ""
    frozen = found.get_frozen_credentials()
    return frozen.access_key, frozen.secret_key


def _json(value: Any) -> str:
    import orjson

    return orjson.dumps(value).decode()
