"""DuckDB client: the database file's one connection (only the driver process opens it), error
classification, and the bulk copy executors stage chunks with (Parquet files)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import duckdb

from eventspark.destinations.base import StagedChunk, TerminalError, TransientError
from eventspark.destinations.duckdb.dialect import ARROW_STAGE_TYPES
from eventspark.steps.typing import DataType, coerce


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


class DuckDBClient:
    """The open database file (its folder created when missing), in UTC."""

    def __init__(self, path: Path) -> None:
        with translated_errors(f"opening {path}"):
            path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = duckdb.connect(str(path))
            self.conn.execute("SET TimeZone = 'UTC'")

    def execute(self, statement: str, doing: str, params: Any = None) -> None:
        with translated_errors(doing):
            self.conn.execute(statement, params)

    def rows(self, statement: str, doing: str, params: Any = None) -> list[tuple[Any, ...]]:
        with translated_errors(doing):
            return self.conn.execute(statement, params).fetchall()

    @contextmanager
    def transaction(self, doing: str) -> Iterator[None]:
        with translated_errors(doing):
            self.conn.execute("BEGIN")
            try:
                yield
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        self.conn.close()


# --- bulk copy, on executors ----------------------------------------------------------------------


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

    arrow_type = getattr(pa, ARROW_STAGE_TYPES[stage])()
    try:
        return pa.array(values, arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        # A promoted column mixes Python types (bool in an int64 column): convert them one by one.
        return pa.array([coerce(v, stage) if stage is not DataType.TIMESTAMP else v for v in values], arrow_type)
