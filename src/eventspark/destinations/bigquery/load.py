"""BigQuery: what differs from the shared SQL load (`sql.warehouse.SqlWarehouse`).

- Batch: executors write newline-delimited JSON chunks (objects in `gcs_bucket`, else files
  under `<log.path>/staging/`). The commit loads them into staging tables (one per set of chunk
  column types, so one load job per pair in the usual case), then runs one script
  `BEGIN TRANSACTION; INSERT ... SELECT | MERGE ...; INSERT <markers>; COMMIT TRANSACTION;`: the
  pair's rows and its load markers become visible together or not at all. Staging tables and
  staged files are removed afterwards (tables also expire by themselves after a day).
  The script runs as a query job whose id derives from the destination, table and files
  (`commit_job_id`): a rerun of the same commit finds an earlier job and waits for it instead of
  loading the rows twice, and a commit whose answer was lost waits for its job before reporting.
- Schema: CREATE TABLE as DDL; new columns as DDL *and* a schema patch (`update_table`), see
  `patch`; the primary key as a line of the table's description (no table constraint).
- Stream: the streaming insert API (`insert_rows_json`, row ids = event ids); with a primary key,
  which that API cannot upsert, one MERGE query per micro-batch from a JSON parameter, one at a
  time per table in this process.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
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
    STAGE_PREFIX,
    DestinationError,
    Load,
    StagedChunk,
    TerminalError,
    new_job_id,
)
from eventspark.destinations.bigquery.capabilities import CAPABILITIES
from eventspark.destinations.bigquery.client import (
    GCS_STAGE_FOLDER,
    BigQueryClient,
    GoogleSettings,
    NdjsonStageTarget,
    OutcomeUnknown,
    chunk_job,
    delete_objects,
    delete_stage_objects,
    key_in_description,
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
SCHEMA_SETTLE_SECONDS = 15 * 60.0
"""How long, from the first refusal, a streaming insert refused for a table or column that the
tables API already shows counts as transient (the streaming backend learns new tables and
columns minutes after the tables API does); after that, as any refusal."""
MAX_COMMIT_JOBS = 200
"""Ids tried for one commit (`commit_job_id`, then `_1`, `_2`... after failed jobs)."""
ONE_ALTER_ONLY = "Only one ALTER command per statement"
"""bqemulator's refusal of an ALTER TABLE with several ADD COLUMN (BigQuery takes them)."""
_TABLE_LOCKS: dict[tuple[str, str, str], threading.Lock] = {}
_TABLE_LOCKS_GUARD = threading.Lock()


def _table_lock(project: str, dataset: str, table: str) -> threading.Lock:
    """The process-wide lock of one table: one stream MERGE at a time (BigQuery queues at most
    2 running and 20 pending mutating DML statements per table, and conflicting ones abort)."""
    with _TABLE_LOCKS_GUARD:
        return _TABLE_LOCKS.setdefault((project, dataset, table), threading.Lock())


def commit_job_id(project: str, dataset: str, load: Load) -> str:
    """The query job id of a commit: a hash of where it goes and of its files (order aside)."""
    key = json.dumps([project, dataset, load.dest_id, load.table.name, sorted(set(load.files))])
    return "eventspark_commit_" + hashlib.sha256(key.encode()).hexdigest()[:40]


def dest_tag(dest_id: str) -> str:
    """8 hex digits naming a destination in its staging tables' names (ids may hold any text)."""
    return hashlib.sha256(dest_id.encode()).hexdigest()[:8]


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
        location=google.bq_location,
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
        self._stage_tag = dest_tag(dest_id)
        self._refused_since: dict[tuple[str, frozenset[str]], float] = {}
        """(table, columns) → when the streaming API first refused them while the tables API
        showed them (see `_settling`)."""

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
        in 10 s on BigQuery); one per column only after bqemulator's `ONE_ALTER_ONLY` refusal."""
        try:
            client.execute(f"ALTER TABLE {self.name(table)} {', '.join(adds)}", doing)
        except TerminalError as exc:
            if len(adds) == 1 or not one_alter_only(exc):
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
        markers, run as a job with a chosen id (`_commit_job`), then the staging tables and
        staged files removed (a failure there is logged: `drop_stages` / `drop_stale_stages` and
        the tables' expiry catch up). When the job's end could not be learnt (`OutcomeUnknown`)
        the staging tables are kept: the job may still read them."""
        doing = f"loading table {load.table.name!r}"
        with self._session() as client:
            assert isinstance(client, BigQueryClient)
            job_id = self._commit_job(client, load, doing)
            if job_id == "":  # an earlier run of this commit did it
                self._discard_chunks(client, load.chunks)
                return
            loaded: list[tuple[str, Mapping[str, DataType]]] = []
            keep = False
            try:
                self._load_stages(client, load, loaded, doing)
                with client.transaction(doing, job_id):
                    if loaded:
                        client.execute(self._move(load, loaded), doing)
                    markers = self._markers(load)
                    if markers is not None:
                        client.execute(markers, doing)
            except OutcomeUnknown:
                keep = True
                raise
            finally:
                if not keep:
                    self._drop_quietly(client, [name for name, _ in loaded])
            self._discard_chunks(client, load.chunks)

    def _commit_job(self, client: BigQueryClient, load: Load, doing: str) -> str | None:
        """The id for the commit's job: `commit_job_id`, or after failed jobs of earlier runs
        `<id>_1`, `<id>_2`...; "" when a job of an earlier run succeeded and the markers of the
        load are in (a pass that lost the job's answer, or read the markers before the job
        ended); None (any id) for a load without files (nothing to recognise it by)."""
        if not load.files:
            return None
        base = commit_job_id(client.client.project, self.schema, load)
        for attempt in range(MAX_COMMIT_JOBS):
            job_id = base if attempt == 0 else f"{base}_{attempt}"
            job = client.find_job(job_id, doing)
            if job is None:
                return job_id
            if client.wait_for(job, doing) and self._committed(load):
                log.info("bigquery: %s: job %s of an earlier run committed it", doing, job_id)
                return ""
        log.warning(
            "bigquery: %s: %d earlier jobs of this commit failed: using a random job id", doing, MAX_COMMIT_JOBS
        )
        return None

    def _committed(self, load: Load) -> bool:
        wanted = {(f, load.table.name) for f in load.files}
        return wanted <= self.loaded_files(load.dest_id, load.files)

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
            name = self.stage_table_name(chunk_job(chunks[0].ref) or new_job_id(time.time()))
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

    def stage_table_name(self, job_id: str) -> str:
        """A new staging table of job `job_id`: `_es_stage_<job>_<destination tag>_<random>`, so
        that destinations sharing a dataset each drop only their own."""
        return f"{STAGE_PREFIX}{job_id}_{self._stage_tag}_{uuid.uuid4().hex[:12]}"

    def _drop_stages_where(self, test: Callable[[str], Callable[[str], bool]]) -> None:
        """Staged files (local and on GCS) and staging tables a crashed commit left."""
        super()._drop_stages_where(test)
        matches = test("")
        if self.settings.bucket:
            delete_stage_objects(self.settings, self.dest_id, matches)
        doing = "dropping staging tables"
        mine = re.compile(rf"_{self._stage_tag}_[0-9a-f]{{12}}$")
        with self._session() as client:
            assert isinstance(client, BigQueryClient)
            for name in client.table_names(doing):
                job = stages.stage_job(name)
                if job is not None and mine.search(name) and matches(job):
                    client.drop_table(name, doing)

    # --- stream -----------------------------------------------------------------------------------

    def insert(self, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
        """With a key, under the table's process-wide lock (`_table_lock`): the MERGE job runs
        when the shared `insert` leaves its transaction, so the lock is taken around it whole."""
        if not table.primary_keys:
            super().insert(table, rows)
            return
        with _table_lock(self.settings.project, self.schema, table.name):
            super().insert(table, rows)

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
            row_ids = ids if len(ids) == len(rows) else None

            def settling(fields: frozenset[str]) -> bool:
                return self._settling(client, table.name, fields)

            client.insert_json(table.name, values, row_ids, doing, settling)
            for key in [k for k in self._refused_since if k[0] == table.name]:
                del self._refused_since[key]
            return
        quote = self.dialect.quote
        columns = [*columns, *(k for k in table.primary_keys if k not in columns)]
        param = f"rows_{uuid.uuid4().hex[:12]}"
        # Every value travels as JSON text (or null), cast from it: no JSON number is read as a
        # double on the way (integers beyond 2^53 shown exact on the emulator; JSON_VALUE of a
        # JSON string returns its text, so the same is expected of BigQuery, untested).
        values_sql = ", ".join(
            f"{self._from_text(_element(i), table.columns[c])} AS {quote(c)}" for i, c in enumerate(columns)
        )
        source = f"SELECT {values_sql} FROM UNNEST(JSON_QUERY_ARRAY(@{param})) AS r"
        payload = orjson.dumps([[_text(row.get(c)) for c in columns] for row in rows]).decode()
        parameter = bigquery.ScalarQueryParameter(param, "STRING", payload)
        client.execute(self._merge(table, columns, source), doing, [parameter])

    # --- users recognition ------------------------------------------------------------------------

    def recognize_users(
        self,
        table: Table,
        anonymous_column: str,
        user_columns: Sequence[str],
        pairs: Mapping[str, Sequence[Any]],
        unset: Sequence[str] = (),
    ) -> None:
        """One `UPDATE ... FROM` query job from the pairs sent as one JSON parameter (as a keyed
        stream insert sends its rows), under the table's process-wide lock (`_table_lock`). Rows
        still in the streaming buffer (a stream without a key, the last 30-90 minutes) cannot be
        updated: BigQuery refuses, a transient error, and recognition retries later."""
        quote = self.dialect.quote
        param = f"pairs_{uuid.uuid4().hex[:12]}"
        values = [f"{self._from_text(_element(i + 1), table.columns[c])} AS u{i}" for i, c in enumerate(user_columns)]
        select = ", ".join([f"{_element(0)} AS a", *values])
        source = f"SELECT {select} FROM UNNEST(JSON_QUERY_ARRAY(@{param})) AS r"
        sets = ", ".join(f"{quote(c)} = v.u{i}" for i, c in enumerate(user_columns))
        empty = [f"t.{quote(c)} IS NULL" for c in user_columns]
        empty += [f"COALESCE(CAST(t.{quote(c)} AS STRING), '') = ''" for c in unset]
        where = f"CAST(t.{quote(anonymous_column)} AS STRING) = v.a AND " + " AND ".join(empty)
        statement = f"UPDATE {self.name(table.name)} AS t SET {sets} FROM ({source}) AS v WHERE {where}"
        payload = orjson.dumps([[a, *(_text(v) for v in row)] for a, row in pairs.items()]).decode()
        parameter = bigquery.ScalarQueryParameter(param, "STRING", payload)
        doing = f"recognizing {len(pairs)} users in {table.name!r}"
        with _table_lock(self.settings.project, self.schema, table.name), self._session() as client:
            client.execute(statement, doing, [parameter])

    def _from_text(self, text_sql: str, column_type: str) -> str:
        """The SQL of a value of `column_type` from SQL text `text_sql`: PARSE_JSON for JSON
        columns (as the batch load does), else CAST."""
        target = sql_type(column_type)
        if data_type_of_bigquery(column_type) is None and target.upper() == "JSON":
            return f"PARSE_JSON({text_sql})"
        return f"CAST({text_sql} AS {target})"

    def _settling(self, client: BigQueryClient, table: str, fields: frozenset[str]) -> bool:
        """Whether a streaming insert refused for `table` (fields empty: "not found") or for its
        columns `fields` ("no such field") is the streaming API's delay: the tables API shows the
        table and columns, and the first such refusal was less than `SCHEMA_SETTLE_SECONDS` ago."""
        found = client.table(table, f"reading table {table!r} after a refused insert")
        if found is None:
            return False
        have = {f.name.lower() for f in found.schema}
        if not {f.lower() for f in fields} <= have:
            return False
        first = self._refused_since.setdefault((table, fields), time.monotonic())
        return time.monotonic() - first < SCHEMA_SETTLE_SECONDS


def primary_key_of(table: bigquery.Table) -> tuple[str, ...]:
    """The key noted in the table's description (a PRIMARY KEY constraint, if the table has
    one, is the user's: eventspark neither sets nor reads it)."""
    return key_in_description(table.description)


def one_alter_only(exc: TerminalError) -> bool:
    """Whether `exc` is bqemulator's refusal of several ADD COLUMN in one ALTER TABLE."""
    return ONE_ALTER_ONLY.lower() in str(exc).lower() or ONE_ALTER_ONLY.lower() in str(exc.__cause__ or "").lower()


def _element(index: int) -> str:
    """The SQL text of element `index` of the JSON array `r`."""
    return f"JSON_VALUE(r, '$[{index}]')"


def _text(value: Any) -> str | None:
    """A value as the text its column's CAST (or PARSE_JSON) reads: booleans as true/false,
    numbers exactly (floats as their shortest round-trip text), instants as ISO 8601, objects
    and arrays (JSON columns) as JSON text."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | Decimal):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    return orjson.dumps(value, default=str).decode()


def _json_value(value: Any) -> Any:
    """A value as JSON takes it: instants as ISO 8601 text, decimals as text."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value
