"""Snowflake: what differs from the shared SQL load (`sql.warehouse.SqlWarehouse`).

Names follow EventNative's rule (`dialect.stored_name`): plain names are upper-cased, and every
name is quoted.

Batch: `stage_target` creates the pass's TRANSIENT staging table `_es_stage_<job>_<dest hash>`
(one VARIANT column) before the executors run; they write each chunk as a gzip JSON-lines file and
PUT it on that table's stage (or the named `stage`, or upload it to S3 / GCS). `commit` then runs,
in one transaction: the COPYs of the pair's files into the staging table (one per 1,000 files
named in FILES; one per file on a table stage, which fakesnow cannot COPY with FILES), one
`INSERT ... SELECT` converting each value to its column's type (with a primary key, only the last
row of each key by `_es_seq`, as an UPDATE of the stored keys and an INSERT of the new ones), the
load markers, and a `DELETE` emptying the staging table for the next pair. Internal stages PURGE
the files they load. The shared clean-up drops the staging tables of a pass when it ends (and
those of killed passes later), and a table stage goes with its table.

Stream: `INSERT ... SELECT ... FROM VALUES (?, ...), ...` (UPDATE + INSERT with a key), values
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
COPY_FILES = 1000
"""Files per COPY: Snowflake's limit on a FILES list."""
_PART = r'(?:[A-Za-z_][A-Za-z0-9_$]*|"[^"\x00-\x1f]+")'
_STAGE_NAME = re.compile(rf"^{_PART}(?:\.{_PART}){{0,2}}$")
"""A stage name as configured: one to three parts, plain or quoted."""
_VARIANT_TYPES = ("VARIANT", "OBJECT", "ARRAY")
_FOLDER = re.compile(r"[A-Za-z0-9_./-]*")
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
        if name is not None and not columns:
            return [], []  # no such table (SHOW ... IN TABLE would fail)
        # SHOW PRIMARY KEYS: created_on, database_name, schema_name, table_name, column_name,
        # key_sequence, ...; its rows come in no promised order: a key's columns by key_sequence
        # (a stable sort: fakesnow reports 1 for every column, in the key's order). One table's
        # keys when one is read (a commit reads its table), not the whole schema's.
        scope = f"SCHEMA {self.dialect.quote(self.schema)}" if name is None else f"TABLE {self.name(name)}"
        shown = client.rows(f"SHOW PRIMARY KEYS IN {scope}", "reading tables")
        keys: dict[str, list[tuple[int, str]]] = {}
        for row in shown:
            table, column = logical_name(row[3]), logical_name(row[4])
            # fakesnow's IN TABLE matches the table name in any schema
            if row[2] == schema and (name is None or table == name):
                keys.setdefault(table, []).append((int(row[5]), column))
        by_sequence = {t: sorted(found, key=lambda seq_column: seq_column[0]) for t, found in keys.items()}
        return columns, [(t, [c for _, c in found]) for t, found in by_sequence.items()]

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
        """Creates the pass's staging table (its stage holds the files unless another is configured).
        TRANSIENT, without Time Travel: staged rows cost no Fail-safe or Time Travel storage."""
        digest = hashlib.sha256(self.dest_id.encode()).hexdigest()[:8]
        table = f"{STAGE_PREFIX}{job_id}_{digest}"
        if not re.fullmatch(r"[a-z0-9_]+", table):
            raise TerminalError(f"snowflake: job id {job_id!r} cannot name a staging table")
        with self._session() as client:
            client.execute(
                f"CREATE TRANSIENT TABLE IF NOT EXISTS {self.name(table)} (v VARIANT) DATA_RETENTION_TIME_IN_DAYS = 0",
                "creating the staging table",
            )
        location = self.location
        if location.kind == "table":
            location = StageLocation("table", f"{self.dialect.quote(self.schema)}.%{stored_name(table)}")
        return SnowflakeStageTarget(self.settings, location, table)

    def _copy(self, client: SqlClient, load: Load, doing: str) -> None:
        """Runs inside the commit's transaction: COPY the pair's files into the staging table, move
        its rows into the target, empty the staging table."""
        assert isinstance(client, SnowflakeClient)
        if not load.chunks:
            return
        refs = [_CHUNK_REF.fullmatch(chunk.ref) for chunk in load.chunks]
        if not all(refs):
            raise TerminalError(f"snowflake: {doing}: a chunk that is not a staged file of eventspark's")
        staging = {ref.group(1) for ref in refs if ref is not None}
        if len(staging) != 1:
            raise TerminalError(f"snowflake: {doing}: chunks of several passes in one load")
        (table,) = staging
        for statement in self._copy_statements(table, load.chunks):
            client.execute(statement, doing, bulk=True)
        for statement in self._move_statements(load, table):
            client.execute(statement, doing, bulk=True)
        client.execute(f"DELETE FROM {self.name(table)}", doing, bulk=True)

    def _copy_statements(self, table: str, chunks: Sequence[StagedChunk]) -> list[str]:
        """The COPYs of `chunks` (files of the pass folder `table`) into the staging table: one per
        at most `COPY_FILES` files, naming them in FILES, so that a file the pair does not own (a
        failed task attempt's) is never loaded. On a table stage, one COPY per file naming it in
        the path: fakesnow 0.12.1 refuses FILES there (docs/destinations/snowflake.md, "Tested")."""
        names = [chunk.ref.rpartition("/")[2] for chunk in chunks]
        options = "FILE_FORMAT = (TYPE = JSON COMPRESSION = GZIP) ON_ERROR = ABORT_STATEMENT FORCE = TRUE"
        location = self.location
        into = f"COPY INTO {self.name(table)} FROM"
        if location.kind == "table":
            stage = f"@{self.dialect.quote(self.schema)}.%{stored_name(table)}/{table}/"
            return [f"{into} {stage}{name} {options} PURGE = TRUE" for name in names]
        if location.kind == "named":
            source, options = f"@{location.stage}/{location.key(table)}/", options + " PURGE = TRUE"
        elif location.kind == "gcs":
            source = f"@{location.stage}/{location.key(table)}/"
        else:
            url = self.literal(f"s3://{location.bucket}/{location.key(table)}/")
            source = f"{url}{_s3_credentials(location, self.literal)}"
        statements = []
        for start in range(0, len(names), COPY_FILES):
            files = ", ".join(self.literal(name) for name in names[start : start + COPY_FILES])
            statements.append(f"{into} {source} FILES = ({files}) {options}")
        return statements

    def _move_statements(self, load: Load, staging: str) -> list[str]:
        """INSERT (an upsert with a key) of the staged rows, converted to the target's types."""
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
        return self._upsert_statements(target, columns, f"SELECT {names} FROM ({source}) QUALIFY {rank} = 1")

    def _upsert_statements(self, target: Table, columns: Sequence[str], rows: str) -> list[str]:
        """What a `MERGE ... WHEN MATCHED THEN UPDATE ... WHEN NOT MATCHED THEN INSERT` does, as an
        UPDATE of the stored rows whose key is among `rows` (one row per key), then an INSERT of
        the others, in the caller's transaction. Columns the load lacks keep their stored values,
        as with Postgres' ON CONFLICT and BigQuery's MERGE. (fakesnow 0.12.1 cannot run a MERGE
        inside a transaction: docs/destinations/snowflake.md.)"""
        quote = self.dialect.quote
        table = self.name(target.name)
        on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in target.primary_keys)
        names = ", ".join(quote(c) for c in columns)
        statements = []
        updated = [c for c in columns if c not in target.primary_keys]
        if updated:
            sets = ", ".join(f"{quote(c)} = s.{quote(c)}" for c in updated)
            statements.append(f"UPDATE {table} AS t SET {sets} FROM ({rows}) AS s WHERE {on}")
        absent = f"NOT EXISTS (SELECT 1 FROM {table} AS t WHERE {on})"
        statements.append(f"INSERT INTO {table} ({names}) SELECT {names} FROM ({rows}) AS s WHERE {absent}")
        return statements

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
        """INSERT ... SELECT over a VALUES list of text parameters (an UPDATE, then an INSERT of the
        new keys, with a key), converted to the column types as a batch load converts staged values."""
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
                for statement in self._upsert_statements(table, columns, source):
                    client.execute(statement, doing, params)
            else:
                names = ", ".join(quote(c) for c in columns)
                client.execute(f"INSERT INTO {self.name(table.name)} ({names}) {source}", doing, params)

    # --- users recognition --------------------------------------------------------------------

    def recognize_users(
        self,
        table: Table,
        anonymous_column: str,
        user_columns: Sequence[str],
        pairs: Mapping[str, Sequence[Any]],
        unset: Sequence[str] = (),
    ) -> None:
        """`UPDATE ... FROM (SELECT ... FROM VALUES (?, ...), ...)`: one text parameter per id and
        value, converted to the column's type as a stream insert converts them (`_typed`); past
        16,000 parameters the pairs go in several statements of one transaction."""
        quote, target = self.dialect.quote, self.name(table.name)
        marks = "(" + ", ".join("?" * (1 + len(user_columns))) + ")"
        values = [f"{_typed(f'column{i + 2}', table.columns[c])} AS u{i}" for i, c in enumerate(user_columns)]
        select = ", ".join(["CAST(column1 AS VARCHAR) AS a", *values])
        sets = ", ".join(f"{quote(c)} = v.u{i}" for i, c in enumerate(user_columns))
        empty = [f"t.{quote(c)} IS NULL" for c in user_columns]
        empty += [f"COALESCE(CAST(t.{quote(c)} AS VARCHAR), '') = ''" for c in unset]
        where = f"CAST(t.{quote(anonymous_column)} AS VARCHAR) = v.a AND " + " AND ".join(empty)
        rows = [[a, *(_text(v) for v in row)] for a, row in pairs.items()]
        per = max(1, 16_000 // (1 + len(user_columns)))
        doing = f"recognizing {len(pairs)} users in {table.name!r}"
        with self._session() as client, client.transaction(doing):
            assert isinstance(client, SnowflakeClient)
            for start in range(0, len(rows), per):
                batch = rows[start : start + per]
                source = f"SELECT {select} FROM VALUES {', '.join([marks] * len(batch))}"
                statement = f"UPDATE {target} AS t SET {sets} FROM ({source}) AS v WHERE {where}"
                client.execute(statement, doing, [v for r in batch for v in r], bulk=True)


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
        if not _FOLDER.fullmatch(google.folder):
            # It is written into the stage path of the COPY, which takes no literal.
            raise TerminalError(f"snowflake: google.folder {google.folder!r} may hold only letters, digits, _ . - /")
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


def _s3_credentials(location: StageLocation, literal: Callable[[str], str]) -> str:
    """The COPY's CREDENTIALS: the configured keys, else what boto3's chain finds now (environment,
    profile, instance role; a session token goes with temporary keys); '' when nothing is found
    (then only a public bucket can be read)."""
    key_id, secret, token = location.s3_key_id, location.s3_secret, ""
    if not key_id:
        key_id, secret, token = _default_aws_keys()
    if not key_id:
        return ""
    parts = f"AWS_KEY_ID = {literal(key_id)} AWS_SECRET_KEY = {literal(secret)}"
    if token:
        parts += f" AWS_TOKEN = {literal(token)}"
    return f" CREDENTIALS = ({parts})"


def _default_aws_keys() -> tuple[str, str, str]:
    """The keys boto3 finds (environment, profile, instance role), read at each COPY so that
    temporary ones are fresh."""
    try:
        import boto3

        found = boto3.Session().get_credentials()
    except Exception:  # no boto3 or no credentials: the COPY will say so
        return "", "", ""
    if found is None:
        return "", "", ""
    frozen = found.get_frozen_credentials()
    return frozen.access_key, frozen.secret_key, frozen.token or ""


def _json(value: Any) -> str:
    import orjson

    return orjson.dumps(value).decode()
