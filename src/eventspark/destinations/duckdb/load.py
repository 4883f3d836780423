"""DuckDB: what differs from the shared SQL load (`sql.warehouse.SqlWarehouse`).

Executors write chunks as Parquet files (one process at a time may open the database file); the
shared commit reads them into the target with INSERT ... SELECT from `read_parquet`, standard
CASTs and `ON CONFLICT`. Stream rows go as one text list per column, `unnest`ed and cast.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eventspark.destinations.base import StagedChunk, TerminalError
from eventspark.destinations.duckdb.capabilities import CAPABILITIES
from eventspark.destinations.duckdb.client import DuckDBClient, ParquetStageTarget
from eventspark.destinations.duckdb.configuration import DuckDBDestination
from eventspark.destinations.duckdb.dialect import DIALECT
from eventspark.destinations.sql.stages import file_stage_folder
from eventspark.destinations.sql.statements import cast_expr
from eventspark.destinations.sql.warehouse import SqlClient, SqlWarehouse
from eventspark.steps.diff import Table
from eventspark.steps.typing import DataType

_WHERE = "table_schema = ? AND (? IS NULL OR table_name = ?)"


def build(dest_id: str, dest: DuckDBDestination, events_dir: Path) -> DuckDBWarehouse:
    """Relative paths live under `events_dir` (`log.path`), and so does the `staging/` folder."""
    path = Path(dest.duckdb.path)
    path = path if path.is_absolute() else events_dir / path
    return DuckDBWarehouse(dest_id, path, dest.duckdb.schema_ or "main", events_dir / "staging")


class DuckDBWarehouse(SqlWarehouse):
    """A DuckDB file (its folder created when missing) and a schema in it."""

    dialect = DIALECT
    capabilities = CAPABILITIES
    MARKER_TABLE = (
        "CREATE TABLE IF NOT EXISTS {name} (dest_id VARCHAR, file VARCHAR, table_name VARCHAR, "
        "loaded_at TIMESTAMPTZ DEFAULT now(), PRIMARY KEY (dest_id, file, table_name))"
    )

    def __init__(self, dest_id: str, path: Path, schema: str, staging_dir: Path) -> None:
        super().__init__(dest_id, schema, staging_dir)
        self.path = path

    def _connect(self) -> DuckDBClient:
        return DuckDBClient(self.path)

    def _catalog(self, client: SqlClient, name: str | None) -> tuple[list[Any], list[tuple[str, Sequence[str]]]]:
        assert isinstance(client, DuckDBClient)
        columns = client.rows(
            f"SELECT table_name, column_name, data_type FROM information_schema.columns WHERE {_WHERE} "
            "ORDER BY table_name, ordinal_position",
            "reading tables",
            [self.schema, name, name],
        )
        keys = client.rows(
            "SELECT table_name, constraint_column_names FROM duckdb_constraints() "
            "WHERE schema_name = ? AND constraint_type = 'PRIMARY KEY'",
            "reading tables",
            [self.schema],
        )
        return columns, keys

    def _key_statements(self, client: SqlClient, table: str, keys: tuple[str, ...]) -> list[str]:
        current = self._read(table).get(table)
        if current is not None and current.primary_keys:
            raise TerminalError(f"duckdb: table {table!r} has a primary key; DuckDB cannot change it")
        return [f"ALTER TABLE {self.name(table)} ADD PRIMARY KEY ({', '.join(self.dialect.quote(k) for k in keys)})"]

    def _value(self, column: str, stage: DataType | None, target_sql: str) -> str:
        return cast_expr(column, stage, target_sql)

    def stage_target(self, job_id: str, pass_bytes: int = 0) -> ParquetStageTarget:
        assert self.staging_dir is not None
        return ParquetStageTarget(str(file_stage_folder(self.staging_dir, job_id, self.dest_id)))

    def _stage_source(self, chunk: StagedChunk) -> str:
        return f"read_parquet({self.literal(chunk.ref)})"

    def _insert_rows(
        self, client: SqlClient, table: Table, columns: Sequence[str], rows: Sequence[Mapping[str, Any]], doing: str
    ) -> None:
        """One INSERT ... SELECT over `unnest`ed text lists, one per column, cast to the column types."""
        assert isinstance(client, DuckDBClient)
        quote = self.dialect.quote
        names = ", ".join(quote(c) for c in columns)
        values = ", ".join(cast_expr(f"u.c{i}", DataType.STRING, table.columns[c]) for i, c in enumerate(columns))
        lists = ", ".join(f"unnest(?::VARCHAR[]) AS c{i}" for i in range(len(columns)))
        statement = f"INSERT INTO {self.name(table.name)} ({names}) SELECT {values} FROM (SELECT {lists}) AS u"
        texts = [[_sql_text(row.get(c)) for row in rows] for c in columns]
        client.execute(statement + self._upsert(table, columns), doing, texts)

    def recognize_users(
        self,
        table: Table,
        anonymous_column: str,
        user_columns: Sequence[str],
        pairs: Mapping[str, Sequence[Any]],
        unset: Sequence[str] = (),
    ) -> None:
        """One `UPDATE ... FROM` over `unnest`ed text lists (`docs/users-recognition.md`)."""
        quote, types = self.dialect.quote, table.columns
        sets = ", ".join(
            f"{quote(c)} = {cast_expr(f'v.u{i}', DataType.STRING, types[c])}" for i, c in enumerate(user_columns)
        )
        names = ["a"] + [f"u{i}" for i in range(len(user_columns))]
        lists = ", ".join(f"unnest(?::VARCHAR[]) AS {name}" for name in names)
        target = self.name(table.name)
        empty = " AND ".join(
            [f"{target}.{quote(c)} IS NULL" for c in user_columns]
            + [f"COALESCE(CAST({target}.{quote(c)} AS VARCHAR), '') = ''" for c in unset]
        )
        statement = (
            f"UPDATE {self.name(table.name)} SET {sets} FROM (SELECT {lists}) AS v "
            f"WHERE CAST({self.name(table.name)}.{quote(anonymous_column)} AS VARCHAR) = v.a AND {empty}"
        )
        texts = [list(pairs)] + [[_sql_text(v[i]) for v in pairs.values()] for i in range(len(user_columns))]
        with self._session() as client:
            client.execute(statement, f"recognizing {len(pairs)} users in {table.name!r}", texts)


def _sql_text(value: Any) -> str | None:
    """A value as the text the warehouse casts to the column type (datetimes print as ISO 8601)."""
    if value is None or type(value) is str:
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
