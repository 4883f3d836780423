"""BigQuery: what differs from the shared SQL load (`sql.warehouse.SqlWarehouse`).

- Batch: executors write newline-delimited JSON chunks (objects in `gcs_bucket`, else files
  under `<log.path>/staging/`). The commit loads them into staging tables (one per set of chunk
  column types, so one load job per pair in the usual case), then runs one script
  `BEGIN TRANSACTION; INSERT ... SELECT | MERGE ...; INSERT <markers>; COMMIT TRANSACTION;`: the
  pair's rows and its load markers become visible together or not at all. Staging tables and
  staged files are removed afterwards (tables also expire by themselves after a day).
- Schema: CREATE TABLE as DDL; new columns as DDL *and* a schema patch (`update_table`), see
  `patch`; the primary key as a (not enforced) table constraint plus a note in the description.
- Stream: the streaming insert API (`insert_rows_json`, row ids = event ids); with a primary key,
  which that API cannot upsert, one MERGE query per micro-batch from a JSON parameter.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
from google.cloud import bigquery

from eventspark.destinations.base import (
    LOADS_TABLE,
    ORDER_COLUMN,
    DestinationError,
    Load,
    StagedChunk,
    TerminalError,
    new_job_id,
)
from eventspark.destinations.bigquery.capabilities import CAPABILITIES
from eventspark.destinations.bigquery.client import (
    GCS_STAGE_FOLDER,
    KEY_NOTE,
    BigQueryClient,
    GoogleSettings,
    NdjsonStageTarget,
    chunk_job,
    delete_objects,
    delete_stage_objects,
    key_of,
)
from eventspark.destinations.bigquery.configuration import BigQueryDestination
from eventspark.destinations.bigquery.dialect import DIALECT, STAGE_FIELD_TYPES, data_type_of_bigquery, sql_type
from eventspark.destinations.sql import stages
from eventspark.destinations.sql.statements import load_columns
from eventspark.destinations.sql.warehouse import SqlClient, SqlWarehouse
from eventspark.steps.diff import Table, TablePatch
from eventspark.steps.typing import DataType

log = logging.getLogger(__name__)

EVENT_ID = "eventn_ctx_event_id"
"""The column whose value is a streamed row's insert id (BigQuery drops a repeated id)."""
CATALOG_THREADS = 8
"""Tables read at once by `read_tables`."""
_EXPIRES = "expiration_timestamp = TIMESTAMP_ADD(CURRENT_TIMESTAMP(), INTERVAL 24 HOUR)"
"""Staging tables expire a day after their creation."""


def build(dest_id: str, dest: BigQueryDestination, events_dir: Path) -> BigQueryWarehouse:
    """Files are staged under `events_dir/staging` when no `gcs_bucket` is configured."""
    return BigQueryWarehouse(dest_id, settings_of(dest), events_dir / "staging")


def settings_of(dest: BigQueryDestination) -> GoogleSettings:
    google = dest.google
    key_path, key_info = key_of(google.key_file)
    project = google.bq_project or str((key_info or {}).get("project_id", ""))
    return GoogleSettings(
        project=project,
        dataset=google.bq_dataset or "default",
        bucket=google.gcs_bucket,
        bq_endpoint=google.bq_endpoint,
        gcs_endpoint=google.gcs_endpoint,
        key_path=key_path,
        key_info=key_info,
    )


class BigQueryWarehouse(SqlWarehouse):
    """A BigQuery dataset (the destination's schema, created when missing)."""

    dialect = DIALECT
    capabilities = CAPABILITIES
    MARKER_TABLE = (
        "CREATE TABLE IF NOT EXISTS {name} (dest_id STRING, file STRING, table_name STRING, loaded_at TIMESTAMP)"
    )

    def __init__(self, dest_id: str, settings: GoogleSettings, staging_dir: Path) -> None:
        super().__init__(dest_id, settings.dataset, staging_dir)
        self.settings = settings

    # --- connection and catalog -------------------------------------------------------------------

    def _connect(self) -> BigQueryClient:
        client = BigQueryClient(self.settings)
        try:
            client.ensure_dataset()
        except BaseException:
            client.close()
            raise
        return client

    def _prepare_statements(self) -> list[str]:
        return [self.MARKER_TABLE.format(name=self.name(LOADS_TABLE))]

    def _catalog(self, client: SqlClient, name: str | None) -> tuple[list[Any], list[tuple[str, Sequence[str]]]]:
        """From the tables API, whose schemas use the names of `DIALECT.types`: one call per
        table, a few at a time (a pass reads every table of the dataset)."""
        assert isinstance(client, BigQueryClient)
        doing = "reading tables"
        names = [name] if name is not None else [t for t in client.table_names(doing) if self._is_user_table(t)]
        with ThreadPoolExecutor(max_workers=min(CATALOG_THREADS, len(names) or 1)) as pool:
            found = list(pool.map(lambda table_name: client.table(table_name, doing), names))
        columns: list[tuple[str, str, str]] = []
        keys: list[tuple[str, Sequence[str]]] = []
        for table_name, table in zip(names, found, strict=True):
            if table is None:
                continue
            for f in table.schema:
                columns.append((table_name, f.name, f"ARRAY<{f.field_type}>" if f.mode == "REPEATED" else f.field_type))
            key = primary_key_of(table)
            if key:
                keys.append((table_name, key))
        return columns, keys

    # --- schema -----------------------------------------------------------------------------------

    def patch(self, patch: TablePatch) -> None:
        doing = f"patching table {patch.table!r}"
        quote = self.dialect.quote
        with self._session() as client:
            assert isinstance(client, BigQueryClient)
            if patch.create:
                defs = ", ".join(f"{quote(c)} {sql_type(t)}" for c, t in patch.add_columns.items())
                client.execute(f"CREATE TABLE IF NOT EXISTS {self.name(patch.table)} ({defs})", doing)
            elif patch.add_columns:
                # Both the DDL and a schema patch: on BigQuery either adds the column (the second
                # then finds it and does nothing), while the emulator (bqemulator 1.4) needs both,
                # as each changes only half of its table (the stored data or the API's schema).
                adds = [f"ADD COLUMN IF NOT EXISTS {quote(c)} {sql_type(t)}" for c, t in patch.add_columns.items()]
                self._alter(client, patch.table, adds, doing)
                client.add_fields(patch.table, patch.add_columns, doing)
            if patch.primary_keys:
                # BigQuery does not enforce keys: changing one is only metadata, and MERGE does
                # the upserting.
                client.set_primary_key(patch.table, patch.primary_keys, doing)

    def _alter(self, client: BigQueryClient, table: str, adds: Sequence[str], doing: str) -> None:
        """One ALTER TABLE adding every column (a table's metadata may change only a few times
        in 10 s on BigQuery); one per column where that is refused (bqemulator: "Only one ALTER
        command per statement")."""
        try:
            client.execute(f"ALTER TABLE {self.name(table)} {', '.join(adds)}", doing)
        except TerminalError:
            if len(adds) == 1:
                raise
            for add in adds:
                client.execute(f"ALTER TABLE {self.name(table)} {add}", doing)

    # --- batch ------------------------------------------------------------------------------------

    def stage_target(self, job_id: str, pass_bytes: int = 0) -> NdjsonStageTarget:
        assert self.staging_dir is not None
        folder = str(stages.file_stage_folder(self.staging_dir, job_id, self.dest_id))
        if self.settings.bucket:
            return NdjsonStageTarget(folder, self.settings, f"{GCS_STAGE_FOLDER}/{job_id}/{self.dest_id}")
        return NdjsonStageTarget(folder)

    def commit(self, load: Load) -> None:
        """Staging tables, then one transaction moving their rows into the target with the load
        markers, then the staging tables and staged files removed (a failure there is logged:
        `drop_stages` / `drop_stale_stages` and the tables' expiry catch up)."""
        doing = f"loading table {load.table.name!r}"
        with self._session() as client:
            assert isinstance(client, BigQueryClient)
            loaded: list[tuple[str, Mapping[str, DataType]]] = []
            try:
                self._load_stages(client, load, loaded, doing)
                with client.transaction(doing):
                    if loaded:
                        client.execute(self._move(load, loaded), doing)
                    markers = self._markers(load)
                    if markers is not None:
                        client.execute(markers, doing)
            finally:
                self._drop_quietly(client, [name for name, _ in loaded])
            self._discard_chunks(client, load.chunks)

    def _load_stages(
        self, client: BigQueryClient, load: Load, loaded: list[tuple[str, Mapping[str, DataType]]], doing: str
    ) -> None:
        """One staging table per set of chunk column types, filled by one load job from its
        chunks' files; appended to `loaded` as soon as created (so that it is dropped whatever
        happens next)."""
        groups: dict[frozenset[tuple[str, DataType]], list[StagedChunk]] = {}
        for chunk in load.chunks:
            groups.setdefault(frozenset(chunk.columns.items()), []).append(chunk)
        for chunks in groups.values():
            columns = chunks[0].columns
            name = stages.new_stage_table(chunk_job(chunks[0].ref) or new_job_id(time.time()))
            defs = ", ".join(f"{self.dialect.quote(c)} {sql_type(STAGE_FIELD_TYPES[t])}" for c, t in columns.items())
            # DDL rather than the tables API, which bqemulator fails (HTTP 500) for column names
            # with quotes; the table expires by itself should no pass ever drop it.
            client.execute(f"CREATE TABLE {self.name(name)} ({defs}) OPTIONS ({_EXPIRES})", doing)
            loaded.append((name, columns))
            client.load(name, [c.ref for c in chunks], doing)

    def _move(self, load: Load, loaded: Sequence[tuple[str, Mapping[str, DataType]]]) -> str:
        """INSERT ... SELECT from every staging table; with a key, a MERGE of the last row of each
        key (by the order column)."""
        quote = self.dialect.quote
        table = load.table
        columns = load_columns(load)
        columns += [k for k in table.primary_keys if k not in columns]
        ordered = load.ordered and bool(table.primary_keys)
        selects = []
        for name, stage_columns in loaded:
            exprs = [f"{self._value(quote(c), stage_columns.get(c), table.columns[c])} AS {quote(c)}" for c in columns]
            if ordered:
                order = quote(ORDER_COLUMN)
                exprs.append(f"{order} AS {order}" if ORDER_COLUMN in stage_columns else f"0 AS {order}")
            selects.append(f"SELECT {', '.join(exprs)} FROM {self.name(name)}")
        union = " UNION ALL ".join(selects)
        names = ", ".join(quote(c) for c in columns)
        if not table.primary_keys:
            return f"INSERT INTO {self.name(table.name)} ({names}) {union}"
        # The last row of each key; the row number takes the order column's name, which no user
        # column can have.
        partition = ", ".join(quote(k) for k in table.primary_keys)
        order = quote(ORDER_COLUMN)
        window = f"PARTITION BY {partition}" + (f" ORDER BY {order} DESC" if ordered else "")
        source = (
            f"SELECT {names} FROM (SELECT {names}, ROW_NUMBER() OVER ({window}) AS {order} FROM ({union}) AS u) "
            f"AS r WHERE {order} = 1"
        )
        return self._merge(table, columns, source)

    def _merge(self, table: Table, columns: Sequence[str], source: str) -> str:
        """MERGE of `source` (rows naming `columns`, one per key) into `table` by its key."""
        quote = self.dialect.quote
        on = " AND ".join(f"T.{quote(k)} = S.{quote(k)}" for k in table.primary_keys)
        sets = ", ".join(f"{quote(c)} = S.{quote(c)}" for c in columns if c not in table.primary_keys)
        matched = f" WHEN MATCHED THEN UPDATE SET {sets}" if sets else ""
        names = ", ".join(quote(c) for c in columns)
        values = ", ".join(f"S.{quote(c)}" for c in columns)
        return (
            f"MERGE {self.name(table.name)} AS T USING ({source}) AS S ON {on}{matched} "
            f"WHEN NOT MATCHED THEN INSERT ({names}) VALUES ({values})"
        )

    def _value(self, column: str, stage: DataType | None, target_sql: str) -> str:
        """Staged values are of their stage types (timestamps as RFC 3339 text); BigQuery casts
        BOOL only to INT64 and STRING, so a boolean goes to FLOAT64 through INT64."""
        target = sql_type(target_sql)
        if stage is None:
            return f"CAST(NULL AS {target})"
        wanted = data_type_of_bigquery(target_sql)
        if stage is DataType.BOOL and wanted in (DataType.INT64, DataType.FLOAT64):
            return f"CAST(CAST({column} AS INT64) AS {target})"
        if wanted is None and target.upper() == "JSON":
            return f"PARSE_JSON(CAST({column} AS STRING))"
        return f"CAST({column} AS {target})"

    def _markers(self, load: Load) -> str | None:
        if not load.files:
            return None
        literal = self.literal
        table = literal(load.table.name)
        values = ", ".join(f"({literal(load.dest_id)}, {literal(f)}, {table}, CURRENT_TIMESTAMP())" for f in load.files)
        return f"INSERT INTO {self.name(LOADS_TABLE)} (dest_id, file, table_name, loaded_at) VALUES {values}"

    def _drop_quietly(self, client: BigQueryClient, tables: Sequence[str]) -> None:
        for name in tables:
            try:
                client.drop_table(name, "dropping staging tables")
            except DestinationError as exc:
                log.warning("bigquery: could not drop staging table %s: %s", name, exc)

    def _discard_chunks(self, client: SqlClient, chunks: Sequence[StagedChunk]) -> None:
        remote = [c.ref for c in chunks if c.ref.startswith("gs://")]
        for chunk in chunks:
            if not chunk.ref.startswith("gs://"):
                Path(chunk.ref).unlink(missing_ok=True)
        if remote:
            try:
                delete_objects(self.settings, remote)
            except DestinationError as exc:
                log.warning("bigquery: could not delete staged files: %s", exc)

    def _drop_stages_where(self, test: Callable[[str], Callable[[str], bool]]) -> None:
        """Staged files (local and on GCS) and staging tables a crashed commit left."""
        super()._drop_stages_where(test)
        matches = test("")
        if self.settings.bucket:
            delete_stage_objects(self.settings, self.dest_id, matches)
        doing = "dropping staging tables"
        with self._session() as client:
            assert isinstance(client, BigQueryClient)
            for name in client.table_names(doing):
                job = stages.stage_job(name)
                if job is not None and matches(job):
                    client.drop_table(name, doing)

    # --- stream -----------------------------------------------------------------------------------

    def _insert_rows(
        self, client: SqlClient, table: Table, columns: Sequence[str], rows: Sequence[Mapping[str, Any]], doing: str
    ) -> None:
        """Without a key: the streaming insert API, each row's insert id its event id (BigQuery
        drops a row whose id it saw in the last minute or so: a retried request adds nothing).
        With a key: one MERGE query (a job per micro-batch: slower and billed as a query) from
        the rows sent as one JSON parameter, each value cast to its column's type."""
        assert isinstance(client, BigQueryClient)
        if not table.primary_keys:
            values = [{c: _json_value(row.get(c)) for c in columns} for row in rows]
            ids = [str(row[EVENT_ID]) for row in rows if row.get(EVENT_ID) is not None]
            client.insert_json(table.name, values, ids if len(ids) == len(rows) else None, doing)
            return
        quote = self.dialect.quote
        columns = [*columns, *(k for k in table.primary_keys if k not in columns)]
        param = f"rows_{uuid.uuid4().hex[:12]}"
        values_sql = ", ".join(
            f"CAST(JSON_VALUE(r, '$[{i}]') AS {sql_type(table.columns[c])}) AS {quote(c)}"
            for i, c in enumerate(columns)
        )
        source = f"SELECT {values_sql} FROM UNNEST(JSON_QUERY_ARRAY(@{param})) AS r"
        payload = orjson.dumps([[_json_value(row.get(c)) for c in columns] for row in rows]).decode()
        parameter = bigquery.ScalarQueryParameter(param, "STRING", payload)
        client.execute(self._merge(table, columns, source), doing, [parameter])


def primary_key_of(table: bigquery.Table) -> tuple[str, ...]:
    """The table constraint's key, else the one noted in the description."""
    constraints = table.table_constraints
    if constraints is not None and constraints.primary_key is not None and constraints.primary_key.columns:
        return tuple(constraints.primary_key.columns)
    description = table.description or ""
    if description.startswith(KEY_NOTE):
        try:
            found = json.loads(description[len(KEY_NOTE) :])
        except ValueError:
            return ()
        if isinstance(found, list) and all(isinstance(k, str) for k in found):
            return tuple(found)
    return ()


def _json_value(value: Any) -> Any:
    """A value as JSON takes it: instants as ISO 8601 text, decimals as text."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value
