"""DuckDB adapter: executors write chunks as Parquet files; the driver, the only process that opens
the database file, reads them into the target in one transaction per destination/table pair."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import duckdb

from eventspark.destinations.base import (
    LOADS_TABLE,
    DestinationAdapter,
    Load,
    StagedChunk,
    TerminalError,
    TransientError,
    job_started_at,
)
from eventspark.destinations.duckdb.capabilities import CAPABILITIES
from eventspark.destinations.duckdb.configuration import DuckDBDestination
from eventspark.destinations.duckdb.dialect import DIALECT
from eventspark.destinations.load_sql import cast_expr, insert_plan, insert_select
from eventspark.steps.diff import Table, TablePatch
from eventspark.steps.typing import DataType, coerce

_ARROW_TYPES = {
    DataType.BOOL: "bool_",
    DataType.INT64: "int64",
    DataType.FLOAT64: "float64",
    DataType.TIMESTAMP: "string",
    DataType.STRING: "string",
}


@contextmanager
def translated_errors(doing: str) -> Iterator[None]:
    """DuckDB errors as TransientError (another process holds the file's lock) or TerminalError."""
    try:
        yield
    except duckdb.IOException as exc:
        kind = TransientError if "lock" in str(exc).lower() else TerminalError
        raise kind(f"duckdb: {doing}: {exc}") from exc
    except duckdb.Error as exc:
        raise TerminalError(f"duckdb: {doing}: {exc}") from exc


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@dataclass(frozen=True, slots=True)
class ParquetStageTarget:
    """Picklable: the folder where executors of one job write Parquet chunks."""

    folder: str

    json_lines: ClassVar[bool] = False

    def open(self) -> ParquetStageWriter:
        return ParquetStageWriter(Path(self.folder))


class ParquetStageWriter:
    def __init__(self, folder: Path) -> None:
        self._folder = folder

    def write(self, columns: Mapping[str, DataType], rows: Sequence[Sequence[Any]]) -> StagedChunk:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = self._folder / f"{uuid.uuid4().hex}.parquet"
        try:
            arrays = [_arrow_column([row[i] for row in rows], t) for i, t in enumerate(columns.values())]
            table = pa.Table.from_arrays(arrays, names=list(columns))
            self._folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            pq.write_table(table, tmp, compression="zstd")
            tmp.rename(path)
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise TerminalError(f"duckdb: staging {len(rows)} rows in {self._folder}: {exc}") from exc
        return StagedChunk(str(path), dict(columns), len(rows))

    def close(self) -> None:
        return None


def _arrow_column(values: list[Any], stage: DataType) -> Any:
    import pyarrow as pa

    arrow_type = getattr(pa, _ARROW_TYPES[stage])()
    try:
        return pa.array(values, arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        # A promoted column mixes Python types (bool in an int64 column): convert them one by one.
        return pa.array([coerce(v, stage) if stage is not DataType.TIMESTAMP else v for v in values], arrow_type)


class DuckDBAdapter(DestinationAdapter):
    """A DuckDB file (its folder created when missing) and a schema in it."""

    dialect = DIALECT
    capabilities = CAPABILITIES

    def __init__(self, dest_id: str, path: Path, schema: str, staging_dir: Path) -> None:
        self.dest_id = dest_id
        self.path = path
        self.schema = schema
        self.staging_dir = staging_dir
        self._conn: duckdb.DuckDBPyConnection | None = None

    def _connection(self) -> duckdb.DuckDBPyConnection:
        if self._conn is None:
            with translated_errors(f"opening {self.path}"):
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = duckdb.connect(str(self.path))
                conn.execute("SET TimeZone = 'UTC'")
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self._q(self.schema)}")
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {self._name(LOADS_TABLE)} (dest_id VARCHAR, file VARCHAR, "
                    "table_name VARCHAR, loaded_at TIMESTAMPTZ DEFAULT now(), "
                    "PRIMARY KEY (dest_id, file, table_name))"
                )
                self._conn = conn
        return self._conn

    @staticmethod
    def _q(name: str) -> str:
        return DIALECT.quote(name)

    def _name(self, table: str) -> str:
        return f"{self._q(self.schema)}.{self._q(table)}"

    def read_tables(self) -> dict[str, Table]:
        return self._read(None)

    def read_table(self, name: str) -> Table | None:
        return self._read(name).get(name)

    def _read(self, name: str | None) -> dict[str, Table]:
        conn = self._connection()
        where = "table_schema = ? AND (? IS NULL OR table_name = ?)"
        with translated_errors("reading tables"):
            columns = conn.execute(
                f"SELECT table_name, column_name, data_type FROM information_schema.columns WHERE {where} "
                "ORDER BY table_name, ordinal_position",
                [self.schema, name, name],
            ).fetchall()
            keys = conn.execute(
                "SELECT table_name, constraint_column_names FROM duckdb_constraints() "
                "WHERE schema_name = ? AND constraint_type = 'PRIMARY KEY'",
                [self.schema],
            ).fetchall()
        tables: dict[str, Table] = {}
        for table, column, sql_type in columns:
            if table != LOADS_TABLE:
                tables.setdefault(table, Table(table)).columns[column] = sql_type
        for table, key_columns in keys:
            if table in tables:
                tables[table].primary_keys = tuple(key_columns)
        return tables

    def patch(self, patch: TablePatch) -> None:
        table = self._name(patch.table)
        columns = [f"{self._q(c)} {t}" for c, t in patch.add_columns.items()]
        if patch.primary_keys and not patch.create and self._has_key(patch.table):
            raise TerminalError(f"duckdb: table {patch.table!r} has a primary key; DuckDB cannot change it")
        conn = self._connection()
        with translated_errors(f"patching table {patch.table!r}"):
            conn.execute("BEGIN")
            try:
                if patch.create:
                    conn.execute(f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(columns)})")
                else:
                    for column in columns:
                        conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column}")
                if patch.primary_keys:
                    keys = ", ".join(self._q(k) for k in patch.primary_keys)
                    conn.execute(f"ALTER TABLE {table} ADD PRIMARY KEY ({keys})")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def _has_key(self, table: str) -> bool:
        existing = self.read_table(table)
        return existing is not None and bool(existing.primary_keys)

    def stage_target(self, job_id: str, pass_bytes: int = 0) -> ParquetStageTarget:
        return ParquetStageTarget(str(self.staging_dir / job_id / self.dest_id))

    def commit(self, load: Load) -> None:
        statement = insert_select(load, self._q, self._name(load.table.name), self._stage_source)
        markers = [[load.dest_id, f, load.table.name] for f in load.files]
        conn = self._connection()
        with translated_errors(f"loading table {load.table.name!r}"):
            conn.execute("BEGIN")
            try:
                conn.execute(statement)
                if markers:
                    conn.executemany(
                        f"INSERT INTO {self._name(LOADS_TABLE)} (dest_id, file, table_name) VALUES (?, ?, ?)",
                        markers,
                    )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        for chunk in load.chunks:
            Path(chunk.ref).unlink(missing_ok=True)

    @staticmethod
    def _stage_source(chunk: StagedChunk) -> str:
        return f"read_parquet({_literal(chunk.ref)})"

    def loaded_files(self, dest_id: str, files: Iterable[str]) -> set[tuple[str, str]]:
        conn = self._connection()
        with translated_errors("reading load markers"):
            rows = conn.execute(
                f"SELECT file, table_name FROM {self._name(LOADS_TABLE)} WHERE dest_id = ? AND list_contains(?, file)",
                [dest_id, list(files)],
            ).fetchall()
        return {(f, t) for f, t in rows}

    def drop_stages(self, job_id: str) -> None:
        shutil.rmtree(self.staging_dir / job_id / self.dest_id, ignore_errors=True)

    def drop_stale_stages(self, before: float) -> None:
        if not self.staging_dir.is_dir():
            return
        for folder in self.staging_dir.iterdir():
            if (job_started_at(folder.name) or before) < before:
                shutil.rmtree(folder / self.dest_id, ignore_errors=True)

    def insert(self, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
        """One `INSERT ... SELECT` over `unnest`ed text lists, one per column, in one transaction;
        values are cast to the column types (see `_insert_columns` for rows with different columns
        and primary keys)."""
        columns, lists = _insert_columns(table, rows)
        if not columns:
            return
        conn = self._connection()
        with translated_errors(f"inserting {len(rows)} rows into {table.name!r}"):
            conn.execute("BEGIN")
            try:
                conn.execute(self._insert_statement(table, columns), lists)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def _insert_statement(self, table: Table, columns: list[str]) -> str:
        names = ", ".join(self._q(c) for c in columns)
        values = ", ".join(cast_expr(f"u.c{i}", DataType.STRING, table.columns[c]) for i, c in enumerate(columns))
        lists = ", ".join(f"unnest(?::VARCHAR[]) AS c{i}" for i in range(len(columns)))
        statement = f"INSERT INTO {self._name(table.name)} ({names}) SELECT {values} FROM (SELECT {lists}) AS u"
        if table.primary_keys:
            statement += f" ON CONFLICT ({', '.join(self._q(k) for k in table.primary_keys)}) DO "
            updates = [f"{self._q(c)} = EXCLUDED.{self._q(c)}" for c in columns if c not in table.primary_keys]
            statement += f"UPDATE SET {', '.join(updates)}" if updates else "NOTHING"
        return statement

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


# --- stream inserts: rows as text column lists ----------------------------------------------------


def _insert_columns(table: Table, rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str | None]]]:
    """The columns of `rows` (see `load_sql.insert_plan`) and one text list per column (absent values are NULL)."""
    columns, rows = insert_plan("duckdb", table, rows)
    return columns, [[_sql_text(row.get(c)) for row in rows] for c in columns]


def _sql_text(value: Any) -> str | None:
    """A value as the text the warehouse casts to the column type (datetimes print as ISO 8601)."""
    if value is None or type(value) is str:
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def build(dest_id: str, dest: DuckDBDestination, events_dir: Path) -> DuckDBAdapter:
    """Relative paths live under `events_dir` (`log.path`), and so does the `staging/` folder."""
    path = Path(dest.duckdb.path)
    path = path if path.is_absolute() else events_dir / path
    return DuckDBAdapter(dest_id, path, dest.duckdb.schema_ or "main", events_dir / "staging")
