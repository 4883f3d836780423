"""Redshift: what differs from the shared SQL load (`sql.warehouse.SqlWarehouse`).

Staged values are text in hash-named columns (`client.stage_column`), cast to the target's
types at commit (`text_value`). Batch, with `s3`: executors upload gzip JSON objects, the commit
runs one `COPY ... MANIFEST` per pair into a temporary table; without `s3`: executors fill a
staging table per chunk with multi-row INSERTs. Either way the commit then deletes the stored
rows whose keys come again (`DELETE ... USING`), inserts the last row of each key
(ROW_NUMBER() over the order column) and writes the load markers, in one transaction that first
locks the target (`LOCK TABLE`: concurrent writers wait instead of failing with Redshift's
serializable isolation violation): Redshift has no ON CONFLICT and does not enforce primary keys.
The stream inserts the same way, with parameters.

Written to Redshift's documented syntax and kept to what PostgreSQL 15 also runs: every statement
but the COPY from S3 runs there in the tests, and a test records every statement psycopg sends
(no savepoint, DEALLOCATE, ON CONFLICT, text-to-boolean cast, LEFT() or owner-only
information_schema view; connections never prepare statements). Not checked there: that Redshift
parses them (no Redshift was available), and leader-node versus compute-node function limits.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eventspark.destinations.base import LOADS_TABLE, ORDER_COLUMN, STAGE_PREFIX, DestinationError, Load
from eventspark.destinations.redshift import s3
from eventspark.destinations.redshift.capabilities import CAPABILITIES, S3_CAPABILITIES
from eventspark.destinations.redshift.client import (
    MAX_PARAMETERS,
    MAX_VARCHAR_BYTES,
    REDSHIFT_NAME_BYTES,
    RedshiftClient,
    RedshiftStageTarget,
    conninfo_of,
    cut_to_bytes,
    insert_batches,
    is_serialization_conflict,
    stage_column,
    stage_defs,
    stage_text,
)
from eventspark.destinations.redshift.configuration import RedshiftDestination
from eventspark.destinations.redshift.dialect import DIALECT
from eventspark.destinations.sql import stages
from eventspark.destinations.sql.statements import load_columns
from eventspark.destinations.sql.warehouse import SqlClient, SqlWarehouse
from eventspark.steps.diff import Table
from eventspark.steps.typing import DataType

log = logging.getLogger(__name__)

_COLUMNS_QUERY = """
SELECT table_name, column_name, data_type, character_maximum_length, numeric_precision, numeric_scale
FROM information_schema.columns WHERE table_schema = %s{table}
ORDER BY table_name, ordinal_position
"""
_KEYS_QUERY = """
SELECT c.relname, con.conname, con.conkey, a.attnum, a.attname
FROM pg_constraint con
JOIN pg_class c ON c.oid = con.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = con.conrelid
WHERE n.nspname = %s AND con.contype = 'p' AND a.attnum > 0{table}
"""
"""Primary keys from pg_constraint (information_schema's key views show only the tables the
current user owns on Redshift, whose catalog is PostgreSQL 8.0's); the key's column numbers
(`conkey`) are resolved to names here, not with unnest/ORDINALITY (not on Redshift's leader node)."""
_STAGES_QUERY = "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
"""Every table name of the schema: staging tables are picked in Python (no LEFT() on the leader node)."""
_SIZED = ("character varying", "character")


def build(dest_id: str, dest: RedshiftDestination, events_dir: Path) -> RedshiftWarehouse:
    return RedshiftWarehouse(dest_id, dest)


def text_value(column: str, target_sql: str) -> str:
    """SQL giving staged text `column` (quoted, or a placeholder) as a value of `target_sql`:
    `true`/`false` count as 1/0 in numbers (a bool column promoted to a number), RFC 3339 text
    goes through TIMESTAMPTZ so that its offset counts (the session is in UTC)."""
    target = DIALECT.data_type_of(target_sql)
    if target is DataType.STRING:
        return column
    if target in (DataType.INT64, DataType.FLOAT64):
        return f"CAST(CASE {column} WHEN 'true' THEN '1' WHEN 'false' THEN '0' ELSE {column} END AS {target_sql})"
    if target is DataType.TIMESTAMP:
        return f"CAST(CAST({column} AS TIMESTAMPTZ) AS {target_sql})"
    if target is DataType.BOOL:
        return bool_value(column)
    if target_sql.strip().lower() == "super":  # a CAST would store the text as a SUPER string
        return f"JSON_PARSE({column})"
    return f"CAST({column} AS {target_sql})"


def bool_value(column: str) -> str:
    """Staged text as a boolean without a cast (Redshift cannot cast varchar to boolean): `true`
    / `1` as TRUE, `false` / `0` as FALSE, anything else NULL."""
    return f"CASE {column} WHEN 'true' THEN TRUE WHEN '1' THEN TRUE WHEN 'false' THEN FALSE WHEN '0' THEN FALSE END"


def parameter_value(target_sql: str) -> str:
    """A stream value: a text parameter already in its column's type (`client.stage_text`)."""
    target = DIALECT.data_type_of(target_sql)
    if target is DataType.STRING:
        return "%s"
    if target is DataType.TIMESTAMP:
        return f"CAST(CAST(%s AS TIMESTAMPTZ) AS {target_sql})"
    if target is DataType.BOOL:
        return bool_value("%s")
    if target_sql.strip().lower() == "super":  # JSON text (docs/json-columns.md)
        return "JSON_PARSE(%s)"
    return f"CAST(%s AS {target_sql})"


class RedshiftWarehouse(SqlWarehouse):
    """A Redshift schema (created when missing), staging through S3 when configured."""

    dialect = DIALECT
    capabilities = CAPABILITIES
    MARKER_TABLE = (
        "CREATE TABLE IF NOT EXISTS {name} (dest_id character varying(1024) NOT NULL, "
        "file character varying(1024) NOT NULL, table_name character varying(1024) NOT NULL, "
        "loaded_at timestamp, PRIMARY KEY (dest_id, file, table_name))"
    )
    """`loaded_at` is written by the commit: a DEFAULT would need GETDATE() (Redshift only) or
    CURRENT_TIMESTAMP (leader-node only on Redshift)."""

    def __init__(self, dest_id: str, dest: RedshiftDestination) -> None:
        # Redshift folds quoted names to lower case (unless enable_case_sensitive_identifier is on).
        super().__init__(dest_id, (dest.datasource.schema_ or "public").lower())
        self.conninfo = conninfo_of(dest)
        self.s3 = s3.S3Settings.of(dest.s3) if dest.s3 is not None else None
        self._storage: Any = None
        if self.s3 is not None:
            self.capabilities = S3_CAPABILITIES

    def _connect(self) -> RedshiftClient:
        return RedshiftClient(self.conninfo)

    def _connection(self) -> SqlClient:
        """Without advisory locks, nodes connecting at once may race on `CREATE ... IF NOT
        EXISTS` of the schema or the marker table (on PostgreSQL a unique violation in the
        catalog, on Redshift presumably a serializable isolation violation): the loser prepares
        again, and finds them (the schema, then the table: up to three attempts)."""
        for _attempt in range(2):
            try:
                return super()._connection()
            except DestinationError as exc:
                cause = exc.__cause__
                if getattr(cause, "sqlstate", None) != "23505" and not is_serialization_conflict(cause or exc):
                    raise
        return super()._connection()

    def close(self) -> None:
        self._storage = None
        super().close()

    def _s3_client(self) -> Any:
        """One boto3 client for the manifests and deletions of this adapter."""
        assert self.s3 is not None
        if self._storage is None:
            self._storage = self.s3.client()
        return self._storage

    # --- catalog ------------------------------------------------------------------------------

    def _catalog(self, client: SqlClient, name: str | None) -> tuple[list[Any], list[tuple[str, Sequence[str]]]]:
        """Columns from information_schema.columns, keys from pg_constraint (`_primary_keys`).
        No transaction of its own: inside a patch's transaction psycopg would nest it as a
        SAVEPOINT, which Redshift does not have."""
        assert isinstance(client, RedshiftClient)
        where = " AND table_name = %s" if name is not None else ""
        stored = client.stored_name(name) if name is not None else None
        args = [self.schema] if stored is None else [self.schema, stored]
        found = client.rows(_COLUMNS_QUERY.format(table=where), "reading tables", args)
        as_asked = {stored: name} if name is not None else {}
        columns = [(as_asked.get(table, table), column, _sql_type(*rest)) for table, column, *rest in found]
        keys = {as_asked.get(t, t): cols for t, (_constraint, cols) in self._primary_keys(client, stored).items()}
        return columns, list(keys.items())

    def _primary_keys(self, client: RedshiftClient, stored: str | None) -> dict[str, tuple[str, list[str]]]:
        """table (as stored) -> (constraint name, key columns in key order), of one table or all."""
        where = " AND c.relname = %s" if stored is not None else ""
        args = [self.schema] if stored is None else [self.schema, stored]
        rows = client.rows(_KEYS_QUERY.format(table=where), "reading primary keys", args)
        names: dict[tuple[str, str], dict[int, str]] = {}
        order: dict[tuple[str, str], list[int]] = {}
        for table, constraint, conkey, attnum, attname in rows:
            names.setdefault((table, constraint), {})[int(attnum)] = attname
            order[(table, constraint)] = _attnums(conkey)
        return {
            table: (constraint, [names[(table, constraint)][n] for n in order[(table, constraint)]])
            for table, constraint in sorted(order)
        }

    def _stage_tables(self, client: SqlClient) -> list[tuple[str, str]]:
        assert isinstance(client, RedshiftClient)
        rows = client.rows(_STAGES_QUERY, "listing staging tables", (self.schema,))
        return [(name, "") for (name,) in rows if name.startswith(STAGE_PREFIX)]

    # --- tables -------------------------------------------------------------------------------

    def _key_clause(self, table: str, keys: Sequence[str]) -> str:
        # EventNative's constraint name: `<schema>_<table>_pk`, cut to Redshift's 127 bytes.
        constraint = self.dialect.quote(cut_to_bytes(f"{self.schema}_{table}_pk", REDSHIFT_NAME_BYTES))
        return f"CONSTRAINT {constraint} {super()._key_clause(table, keys)}"

    def _key_statements(self, client: SqlClient, table: str, keys: tuple[str, ...]) -> list[str]:
        """The current key (whatever its name) is replaced (Redshift keys are informational)."""
        assert isinstance(client, RedshiftClient)
        current = {
            constraint for constraint, _columns in self._primary_keys(client, client.stored_name(table)).values()
        }
        drops = [f"DROP CONSTRAINT {self.dialect.quote(constraint)}" for constraint in sorted(current)]
        return [
            f"ALTER TABLE {self.name(table)} {clause}" for clause in [*drops, f"ADD {self._key_clause(table, keys)}"]
        ]

    def _add_column(self, client: SqlClient, table: str, column: str, sql_type: str, doing: str) -> None:
        """No `ADD COLUMN IF NOT EXISTS` and no savepoints: a failed ALTER aborts the patch's
        transaction, so a column another node added first is looked up before (in the same
        transaction, not nested). A duplicate-column error (a column added between the lookup and
        the ALTER) is not swallowed: it fails the patch as a whole, and the next pass reads the
        table again and patches what is still missing (`_is_duplicate_column` stays False)."""
        current = self._catalog(client, table)[0]
        if any(c == column for _t, c, _type in current):
            return
        super()._add_column(client, table, column, sql_type, doing)

    # --- batch --------------------------------------------------------------------------------

    def stage_target(self, job_id: str, pass_bytes: int = 0) -> RedshiftStageTarget | s3.S3StageTarget:
        if self.s3 is not None:
            return s3.S3StageTarget(self.s3, job_id, self.dest_id)
        self._connection()  # the schema must exist before executors create tables in it
        return RedshiftStageTarget(self.conninfo, self.schema, job_id)

    def commit(self, load: Load) -> None:
        """Copy, markers (with their time) and staging-table drops in one transaction; staged S3
        objects are deleted after it (a failure there loses nothing: drop_stale_stages retries)."""
        doing = f"loading table {load.table.name!r}"
        with self._session() as client, client.transaction(doing):
            self._lock(client, load.table.name, doing)
            self._copy(client, load, doing)
            if load.files:
                client.execute(self._marker_insert(load), doing)
            if self.s3 is None:
                self._drop_chunks(client, load.chunks, doing)
        if self.s3 is not None and load.chunks:
            self._discard_objects(load)

    def _lock(self, client: SqlClient, table: str, doing: str) -> None:
        """Locks the target for the rest of the transaction: a stream insert and a batch commit
        (or two commits) writing one table then wait for each other, where Redshift would abort
        one with a serializable isolation violation (which is retried, but only later)."""
        client.execute(f"LOCK TABLE {self.name(table)}", doing)

    def _marker_insert(self, load: Load) -> str:
        lit = self.literal
        at = f"CAST({lit(datetime.now(UTC).replace(tzinfo=None).isoformat())} AS timestamp)"
        rows = ", ".join(f"({lit(load.dest_id)}, {lit(f)}, {lit(load.table.name)}, {at})" for f in load.files)
        return f"INSERT INTO {self.name(LOADS_TABLE)} (dest_id, file, table_name, loaded_at) VALUES {rows}"

    def _copy(self, client: SqlClient, load: Load, doing: str) -> None:
        assert isinstance(client, RedshiftClient)
        if not load.chunks:
            return
        if self.s3 is None:
            sources = [(self.name(c.ref), c.columns.keys()) for c in load.chunks]
            for statement in self.move_statements(load, sources):
                client.execute(statement, doing)
            return
        # One temporary table for the pair, one COPY of every object into it.
        staging = self.dialect.quote(f"{STAGE_PREFIX}copy_{uuid.uuid4().hex[:16]}")
        present = {c: None for chunk in load.chunks for c in chunk.columns}
        client.execute(f"CREATE TEMPORARY TABLE {staging} ({stage_defs(present)})", doing)
        key = self._upload_manifest(load)
        self._copy_from_s3(client, staging, key, doing)
        for statement in self.move_statements(load, [(staging, present.keys())]):
            client.execute(statement, doing)
        client.execute(f"DROP TABLE {staging}", doing)

    def _upload_manifest(self, load: Load) -> str:
        assert self.s3 is not None
        key = s3.manifest_key(load.chunks)
        with s3.translated_errors(f"writing the manifest {self.s3.url(key)}"):
            self._s3_client().put_object(Bucket=self.s3.bucket, Key=key, Body=s3.manifest(self.s3, load.chunks))
        return key

    def _copy_from_s3(self, client: RedshiftClient, staging: str, manifest_key: str, doing: str) -> None:
        """Redshift reads the manifest's objects into `staging`: the COPY, authorized by the
        role or keys (`S3Settings.copy_authorization`). A failure is raised again with the keys
        masked and nothing chained: the driver's error may quote the statement."""
        assert self.s3 is not None
        authorization = self.s3.copy_authorization()
        statement = s3.copy_statement(staging, self.s3.url(manifest_key), authorization, self.s3.region)
        failure: DestinationError | None = None
        try:
            self._run_copy(client, statement, staging, manifest_key, doing)
        except DestinationError as exc:
            failure = type(exc)(s3.mask(str(exc), authorization))
        if failure is not None:
            raise failure  # outside the except block: no __context__ either

    def _run_copy(self, client: RedshiftClient, statement: str, staging: str, manifest_key: str, doing: str) -> None:
        """The server-side step. The tests replace this method only (no emulator runs a COPY
        from S3): `statement` is built, and failures masked, by the real `_copy_from_s3`."""
        client.execute(statement, doing)

    def move_statements(self, load: Load, sources: Sequence[tuple[str, Collection[str]]]) -> list[str]:
        """The statements moving staged rows into the target: `sources` are (staging table,
        columns it has). Without a key one INSERT ... SELECT per source; with one, a DELETE ...
        USING per source of the stored rows whose keys come again, then one INSERT of the last
        row of each key (ROW_NUMBER() over the order column, named like it in the subquery: no
        user column can take that name)."""
        quote = self.dialect.quote
        columns = load_columns(load)
        target = self.name(load.table.name)
        names = ", ".join(quote(c) for c in columns)
        keys = load.table.primary_keys

        def value(source: str, column: str, present: Collection[str]) -> str:
            target_sql = load.table.columns[column]
            if column not in present:
                return f"CAST(NULL AS {target_sql})"
            return text_value(f"{source}.{quote(stage_column(column))}", target_sql)

        def select(source: str, present: Collection[str], ordered: bool) -> str:
            exprs = [f"{value(source, c, present)} AS {quote(c)}" for c in columns]
            if ordered:
                order = quote(ORDER_COLUMN)
                exprs.append(f"{source}.{order} AS {order}" if ORDER_COLUMN in present else f"0 AS {order}")
            return f"SELECT {', '.join(exprs)} FROM {source}"

        if not keys:
            return [f"INSERT INTO {target} ({names}) {select(s, p, False)}" for s, p in sources]
        # Redshift keeps NULL in a key column: a NULL key matches a NULL key, in a second DELETE
        # of the stored rows with a NULL in their key only (the first keeps its hash join).
        deletes = []
        for s, p in sources:
            equal = [f"{target}.{quote(k)} = {value(s, k, p)}" for k in keys]
            deletes.append(f"DELETE FROM {target} USING {s} WHERE " + " AND ".join(equal))
            some_null = " OR ".join(f"{target}.{quote(k)} IS NULL" for k in keys)
            null_safe = " AND ".join(
                f"({e} OR ({target}.{quote(k)} IS NULL AND {value(s, k, p)} IS NULL))"
                for e, k in zip(equal, keys, strict=True)
            )
            deletes.append(f"DELETE FROM {target} USING {s} WHERE ({some_null}) AND {null_safe}")
        union = " UNION ALL ".join(select(s, p, True) for s, p in sources)
        order = quote(ORDER_COLUMN)
        partition = ", ".join(f"s.{quote(k)}" for k in keys)
        ranked = (
            f"SELECT {', '.join(f's.{quote(c)}' for c in columns)}, "
            f"ROW_NUMBER() OVER (PARTITION BY {partition} ORDER BY s.{order} DESC) AS {order} FROM ({union}) AS s"
        )
        return [*deletes, f"INSERT INTO {target} ({names}) SELECT {names} FROM ({ranked}) AS d WHERE d.{order} = 1"]

    def _discard_objects(self, load: Load) -> None:
        assert self.s3 is not None
        keys = [c.ref for c in load.chunks] + [s3.manifest_key(load.chunks)]
        try:
            with s3.translated_errors("deleting staged objects"):
                s3.delete_keys(self._s3_client(), self.s3.bucket, keys)
        except DestinationError as exc:
            log.warning("redshift: could not delete staged objects: %s", exc)

    def _drop_stages_where(self, test: Callable[[str], Callable[[str], bool]]) -> None:
        """S3 objects of the matching jobs (with `s3`), and staging tables (without it, or left
        from before it was configured)."""
        if self.s3 is not None:
            s3.drop_job_stages(self.s3, self.dest_id, test(""))
        doing = "dropping staging tables"
        with self._session() as client:
            for name, engine in self._stage_tables(client):
                job = stages.stage_job(name)
                if job is not None and test(engine)(job):
                    client.execute(f"DROP TABLE IF EXISTS {self.name(name)}", doing)

    # --- stream -------------------------------------------------------------------------------

    def _insert_rows(
        self, client: SqlClient, table: Table, columns: Sequence[str], rows: Sequence[Mapping[str, Any]], doing: str
    ) -> None:
        """After locking the table (`_lock`): with a key, DELETEs of the stored rows with the new
        rows' keys (a NULL key matching a NULL key); then multi-row INSERTs, every value a text
        parameter cast to its column's type (`parameter_value`)."""
        assert isinstance(client, RedshiftClient)
        quote = self.dialect.quote
        self._lock(client, table.name, doing)
        target = self.name(table.name).replace("%", "%%")
        types = {c: self.dialect.data_type_of(table.columns[c]) or DataType.STRING for c in columns}
        if table.primary_keys:
            self._delete_keys(client, table, rows, types, doing)
        names = ", ".join(quote(c) for c in columns).replace("%", "%%")
        row_sql = "(" + ", ".join(parameter_value(table.columns[c]) for c in columns) + ")"
        values = [[stage_text(row.get(c), types[c]) for c in columns] for row in rows]
        for statement, params in insert_batches(
            f"INSERT INTO {target} ({names}) VALUES ", len(columns), values, row_sql
        ):
            client.execute(statement, doing, params)

    # --- users recognition --------------------------------------------------------------------

    def recognize_users(
        self,
        table: Table,
        anonymous_column: str,
        user_columns: Sequence[str],
        pairs: Mapping[str, Sequence[Any]],
        unset: Sequence[str] = (),
    ) -> None:
        """`UPDATE ... FROM` a `UNION ALL` of one parameter row per anonymous id (Redshift takes
        VALUES lists in INSERT only, and has no JSON table function), under the table's lock
        (`_lock`: a stream insert waits instead of a serializable isolation violation). Past
        MAX_PARAMETERS the pairs go in several statements of the same transaction."""
        target = self.name(table.name).replace("%", "%%")

        def column(name: str) -> str:  # `%` is the driver's placeholder mark: escaped in names
            return f"{target}.{self.dialect.quote(name).replace('%', '%%')}"

        def text(sql: str) -> str:
            return f"CAST({sql} AS VARCHAR({MAX_VARCHAR_BYTES}))"

        types = [self.dialect.data_type_of(table.columns[c]) or DataType.STRING for c in user_columns]
        exprs = [text("%s"), *(parameter_value(table.columns[c]) for c in user_columns)]
        names = ["a", *(f"u{i}" for i in range(len(user_columns)))]
        head = "SELECT " + ", ".join(f"{e} AS {n}" for e, n in zip(exprs, names, strict=True))
        row = "SELECT " + ", ".join(exprs)
        sets = ", ".join(f"{self.dialect.quote(c).replace('%', '%%')} = v.u{i}" for i, c in enumerate(user_columns))
        empty = [f"{column(c)} IS NULL" for c in user_columns]
        empty += [f"COALESCE({text(column(c))}, '') = ''" for c in unset]
        where = f"{text(column(anonymous_column))} = v.a AND " + " AND ".join(empty)
        rows = [[a, *(stage_text(v, t) for v, t in zip(values, types, strict=True))] for a, values in pairs.items()]
        per = max(1, MAX_PARAMETERS // len(names))
        doing = f"recognizing {len(pairs)} users in {table.name!r}"
        with self._session() as client, client.transaction(doing):
            self._lock(client, table.name, doing)
            for start in range(0, len(rows), per):
                batch = rows[start : start + per]
                source = " UNION ALL ".join([head] + [row] * (len(batch) - 1))
                statement = f"UPDATE {target} SET {sets} FROM ({source}) AS v WHERE {where}"
                client.execute(statement, doing, [v for r in batch for v in r])

    def _delete_keys(
        self,
        client: RedshiftClient,
        table: Table,
        rows: Sequence[Mapping[str, Any]],
        types: Mapping[str, DataType],
        doing: str,
    ) -> None:
        """One key column: `k IN (...)` (and `k IS NULL` when a row has none); several: an OR of
        one condition per row, `k = ...` or `k IS NULL` per column; at most MAX_PARAMETERS each."""
        keys = table.primary_keys
        head = f"DELETE FROM {self.name(table.name).replace('%', '%%')} WHERE "
        quoted = {k: self.dialect.quote(k).replace("%", "%%") for k in keys}
        key_rows = [[stage_text(row.get(k), types.get(k) or DataType.STRING) for k in keys] for row in rows]
        if len(keys) == 1:
            (key,) = keys
            values = [v for (v,) in key_rows if v is not None]
            if len(values) < len(key_rows):
                client.execute(f"{head}{quoted[key]} IS NULL", doing)
            one = parameter_value(table.columns[key])
            for start in range(0, len(values), MAX_PARAMETERS):
                batch = values[start : start + MAX_PARAMETERS]
                client.execute(f"{head}{quoted[key]} IN ({', '.join([one] * len(batch))})", doing, batch)
            return
        per = max(1, MAX_PARAMETERS // len(keys))
        for start in range(0, len(key_rows), per):
            batch = key_rows[start : start + per]
            conditions = []
            for row in batch:
                parts = [
                    f"{quoted[k]} IS NULL" if v is None else f"{quoted[k]} = {parameter_value(table.columns[k])}"
                    for k, v in zip(keys, row, strict=True)
                ]
                conditions.append("(" + " AND ".join(parts) + ")")
            client.execute(head + " OR ".join(conditions), doing, [v for row in batch for v in row if v is not None])


def _attnums(conkey: Any) -> list[int]:
    """pg_constraint.conkey as column numbers: a list from psycopg, or `{1,2}` text."""
    if isinstance(conkey, str):
        return [int(n) for n in conkey.strip("{}").split(",") if n.strip()]
    return [int(n) for n in conkey]


def _sql_type(data_type: str, length: int | None, precision: int | None, scale: int | None) -> str:
    """The column type as written in DDL, from information_schema's parts."""
    if data_type in _SIZED and length is not None:
        return f"{data_type}({length})"
    if data_type == "numeric" and precision is not None:
        return f"numeric({precision},{scale or 0})"
    return data_type
