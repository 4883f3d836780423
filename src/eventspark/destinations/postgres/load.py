"""PostgreSQL: what differs from the shared SQL load (`sql.warehouse.SqlWarehouse`).

Executors write each split of an existing table whose values they can check straight into it
(text COPY, with its per-split markers: `postgres.direct`); other chunks are binary-COPYed into
UNLOGGED staging tables, and the shared commit moves them into the target with INSERT ... SELECT
(standard CASTs) and `ON CONFLICT` with a primary key. Stream rows
go as one JSON parameter, read back with `jsonb_array_elements` and cast per column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from eventspark.destinations.base import LOADS_TABLE, STAGE_PREFIX
from eventspark.destinations.postgres.capabilities import CAPABILITIES
from eventspark.destinations.postgres.client import PostgresClient, PostgresStageTarget, conninfo_of
from eventspark.destinations.postgres.configuration import PostgresDestination
from eventspark.destinations.postgres.dialect import DIALECT
from eventspark.destinations.postgres.direct import PostgresDirectTarget
from eventspark.destinations.sql.statements import cast_expr
from eventspark.destinations.sql.warehouse import SqlClient, SqlWarehouse
from eventspark.steps.diff import Table
from eventspark.steps.typing import DataType

_COLUMNS_QUERY = """
SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
  AND (%(table)s::text IS NULL OR c.relname = %(table)s)
ORDER BY c.relname, a.attnum
"""
_KEYS_QUERY = """
SELECT c.relname, con.conname, array_agg(a.attname ORDER BY k.ord)
FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
WHERE n.nspname = %(schema)s AND con.contype = 'p' AND (%(table)s::text IS NULL OR c.relname = %(table)s)
GROUP BY c.relname, con.conname
"""
_STAGES_QUERY = """
SELECT c.relname, '' FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relkind = 'r' AND left(c.relname, %s) = %s
"""


def build(dest_id: str, dest: PostgresDestination, events_dir: Path) -> PostgresWarehouse:
    return PostgresWarehouse(dest_id, dest)


class PostgresWarehouse(SqlWarehouse):
    """A Postgres schema (created when missing)."""

    dialect = DIALECT
    capabilities = CAPABILITIES
    MARKER_TABLE = (
        "CREATE TABLE IF NOT EXISTS {name} (dest_id text, file text, table_name text, "
        "loaded_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (dest_id, file, table_name))"
    )

    def __init__(self, dest_id: str, dest: PostgresDestination) -> None:
        super().__init__(dest_id, dest.datasource.schema_ or "public")
        self.conninfo = conninfo_of(dest)

    def _connect(self) -> PostgresClient:
        return PostgresClient(self.conninfo)

    def _prepare_statements(self) -> list[str]:
        # Nodes connecting at once would race on CREATE ... IF NOT EXISTS (a unique violation in
        # the catalog): a transaction-scoped advisory lock makes them take turns. Split markers are
        # read by their log's prefix (`loaded_splits`): a pattern index serves the LIKE under any
        # collation, so the read does not scan every marker ever written.
        split_index = (
            f"CREATE INDEX IF NOT EXISTS {self.dialect.quote(LOADS_TABLE + '_split')} "
            f"ON {self.name(LOADS_TABLE)} (dest_id, file text_pattern_ops)"
        )
        lock = "SELECT pg_advisory_xact_lock(hashtext('eventspark.prepare'))"
        return [lock, *super()._prepare_statements(), split_index]

    def _catalog(self, client: SqlClient, name: str | None) -> tuple[list[Any], list[tuple[str, Sequence[str]]]]:
        assert isinstance(client, PostgresClient)
        args = {"schema": self.schema, "table": name}
        with client.transaction("reading tables"):
            columns = client.rows(_COLUMNS_QUERY, "reading tables", args)
            keys = client.rows(_KEYS_QUERY, "reading tables", args)
        return columns, [(table, key_columns) for table, _constraint, key_columns in keys]

    def _stage_tables(self, client: SqlClient) -> list[tuple[str, str]]:
        assert isinstance(client, PostgresClient)
        return client.rows(_STAGES_QUERY, "listing staging tables", (self.schema, len(STAGE_PREFIX), STAGE_PREFIX))

    def _key_clause(self, table: str, keys: Sequence[str]) -> str:
        # EventNative's constraint name: `<schema>_<table>_pk`.
        constraint = self.dialect.quote(f"{self.schema}_{table}_pk"[:63])
        return f"CONSTRAINT {constraint} {super()._key_clause(table, keys)}"

    def _key_statements(self, client: SqlClient, table: str, keys: tuple[str, ...]) -> list[str]:
        # The current key (whatever its name) is replaced.
        assert isinstance(client, PostgresClient)
        current = client.rows(_KEYS_QUERY, "reading the primary key", {"schema": self.schema, "table": table})
        drops = [f"DROP CONSTRAINT {self.dialect.quote(constraint)}" for _t, constraint, _c in current]
        return [
            f"ALTER TABLE {self.name(table)} {clause}" for clause in [*drops, f"ADD {self._key_clause(table, keys)}"]
        ]

    def _value(self, column: str, stage: DataType | None, target_sql: str) -> str:
        return cast_expr(column, stage, target_sql)

    def stage_target(self, job_id: str, pass_bytes: int = 0) -> PostgresStageTarget:
        self._connection()  # the schema must exist before executors create tables in it
        return PostgresStageTarget(self.conninfo, self.schema, job_id)

    def direct_target(self, job_id: str) -> PostgresDirectTarget:
        self._connection()  # the schema and the marker table must exist before executors write
        return PostgresDirectTarget(self.conninfo, self.schema, LOADS_TABLE, self.dest_id)

    def _insert_rows(
        self, client: SqlClient, table: Table, columns: Sequence[str], rows: Sequence[Mapping[str, Any]], doing: str
    ) -> None:
        """One INSERT ... SELECT over `jsonb_array_elements` of all the rows sent as one JSON
        parameter; each value is read as text and cast to its column's type."""
        assert isinstance(client, PostgresClient)
        quote = self.dialect.quote
        names = ", ".join(quote(c) for c in columns)
        values = ", ".join(cast_expr(f"(r.v->>{i})", DataType.STRING, table.columns[c]) for i, c in enumerate(columns))
        # `%` is the driver's placeholder mark: escape it in names.
        head = f"INSERT INTO {self.name(table.name)} ({names}) SELECT {values} FROM jsonb_array_elements("
        head = head.replace("%", "%%")
        tail = ") AS r(v)" + self._upsert(table, columns).replace("%", "%%")
        payload = orjson.dumps([[row.get(c) for c in columns] for row in rows], default=str).decode()
        client.execute(f"{head}%s::jsonb{tail}", doing, [payload])

    def recognize_users(
        self,
        table: Table,
        anonymous_column: str,
        user_columns: Sequence[str],
        pairs: Mapping[str, Sequence[Any]],
        unset: Sequence[str] = (),
    ) -> None:
        """One `UPDATE ... FROM` over the pairs sent as one JSON parameter (`docs/users-recognition.md`)."""
        quote, types = self.dialect.quote, table.columns
        sets = ", ".join(
            f"{quote(c)} = {cast_expr(f'(v.r->>{i})', DataType.STRING, types[c])}"
            for i, c in enumerate(user_columns, start=1)
        )
        empty = " AND ".join(
            [f"t.{quote(c)} IS NULL" for c in user_columns] + [f"COALESCE(t.{quote(c)}::text, '') = ''" for c in unset]
        )
        anonymous = quote(anonymous_column)
        # `%` is the driver's placeholder mark: escape it in names.
        head = f"UPDATE {self.name(table.name)} AS t SET {sets} FROM jsonb_array_elements(".replace("%", "%%")
        tail = f"::jsonb) AS v(r) WHERE t.{anonymous}::text = (v.r->>0) AND {empty}".replace("%", "%%")
        payload = orjson.dumps([[anonymous_id, *values] for anonymous_id, values in pairs.items()]).decode()
        doing = f"recognizing {len(pairs)} users in {table.name!r}"
        with self._session() as client:
            client.execute(f"{head}%s{tail}", doing, [payload])
