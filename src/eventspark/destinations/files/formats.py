"""Per format, what an executor keeps for one object and how the object is encoded.

- `json`: the event after enrichment (lookups), before mapping and flattening, one per line.
  `EventBuffer` encodes each event the moment it arrives; the object is those lines.
- `flat_json`, `csv`, `parquet`: the flattened row after mapping, typed like a warehouse batch
  (`batch.chunks.ChunkBuffer`: a value that cannot be typed fails its event alone). `FlatBuffer`
  keeps rows as JSON lines in parts of `chunk_rows` rows, each with its BatchHeader; the object's
  columns are the merged header's, values of a part converted when the merge promoted their column.
  `flat_json`: one object per line (values in their column's type, timestamps as RFC 3339 text);
  `csv`: a header row, then one row per event (NULL as an empty field, booleans `true`/`false`);
  `parquet`: one typed column per field (bool, int64, double, string, timestamp[us, UTC]).

`compression: gzip` gzips `json`, `flat_json` and `csv` objects (`.gz`, written with mtime 0, so
a rerun writes the same bytes); Parquet objects use Parquet's own GZIP codec instead (the file
stays readable by every Parquet reader), else Snappy.
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from eventspark.batch.chunks import ChunkBuffer, to_stage
from eventspark.steps.typing import BatchHeader, DataType, parse_timestamp

_dumps = orjson.dumps
_NEWLINE = orjson.OPT_APPEND_NEWLINE
CONTENT_TYPES = {
    "json": "application/x-ndjson",
    "flat_json": "application/x-ndjson",
    "csv": "text/csv",
    "parquet": "application/vnd.apache.parquet",
}


class EventBuffer:
    """`json`: events as JSON lines, encoded on arrival."""

    __slots__ = ("count", "lines", "table", "total")

    def __init__(self, table: str) -> None:
        self.table = table
        self.lines = bytearray()
        self.count = 0
        self.total = 0

    def add(self, values: dict[str, Any], casts: Mapping[str, str], seq: int = 0) -> str | None:
        try:
            self.lines += _dumps(values, option=_NEWLINE)
        except TypeError as exc:
            return f"the event cannot be written as JSON: {exc}"
        self.count += 1
        self.total += 1
        return None

    def __len__(self) -> int:
        return self.count

    def spill(self) -> None:
        self.count = 0  # the lines are already as compact as they get

    def encode(self, fmt: str, compression: str = "") -> tuple[bytes, BatchHeader]:
        return bytes(self.lines), BatchHeader(self.table)


class FlatBuffer(ChunkBuffer):
    """`flat_json`, `csv`, `parquet`: typed flattened rows, as JSON lines in parts."""

    __slots__ = ("parts", "spilled")

    def __init__(self, table: str) -> None:
        super().__init__(table, None, (), json_lines=True)
        self.parts: list[tuple[bytearray, BatchHeader]] = []
        self.spilled = 0

    @property
    def total(self) -> int:
        return self.spilled + self.count

    def spill(self) -> None:
        count = self.count
        if count:
            _types, lines, header = self.take_json()
            self.parts.append((lines, header))
            self.spilled += count

    def encode(self, fmt: str, compression: str = "") -> tuple[bytes, BatchHeader]:
        self.spill()
        header = BatchHeader(self.table)
        for _lines, part in self.parts:
            header.merge(part)
        types = {name: field.type for name, field in header.fields.items()}
        if fmt == "flat_json":
            return _flat_json(self.parts, types), header
        if fmt == "csv":
            return _csv(self._rows(types), types), header
        groups = (self._part_rows(lines, part, types) for lines, part in self.parts)
        return _parquet(groups, types, "gzip" if compression == "gzip" else "snappy"), header

    def _rows(self, types: Mapping[str, DataType]) -> Iterator[dict[str, Any]]:
        for lines, part in self.parts:
            yield from self._part_rows(lines, part, types)

    @staticmethod
    def _part_rows(lines: bytearray, part: BatchHeader, types: Mapping[str, DataType]) -> Iterator[dict[str, Any]]:
        convert = _promoted(part, types)
        for line in lines.split(b"\n")[:-1]:  # orjson escapes newlines inside strings
            row = orjson.loads(line)
            for name in convert:
                value = row.get(name)
                if value is not None:
                    row[name] = to_stage(value, types[name])
            yield row


def new_buffer(fmt: str, table: str) -> EventBuffer | FlatBuffer:
    return EventBuffer(table) if fmt == "json" else FlatBuffer(table)


def encode(buffer: EventBuffer | FlatBuffer, fmt: str, compression: str) -> tuple[bytes, BatchHeader]:
    """The object's bytes and the header of its columns: the format, then gzip (not for Parquet,
    which compresses inside)."""
    data, header = buffer.encode(fmt, compression)
    if compression == "gzip" and fmt != "parquet":
        data = gzip.compress(data, compresslevel=6, mtime=0)
    return data, header


def _promoted(part: BatchHeader, types: Mapping[str, DataType]) -> list[str]:
    """Columns whose type in this part is not the object's: their values are converted."""
    return [name for name, field in part.fields.items() if field.type is not types[name]]


def _flat_json(parts: list[tuple[bytearray, BatchHeader]], types: Mapping[str, DataType]) -> bytes:
    out = bytearray()
    for lines, part in parts:
        convert = _promoted(part, types)
        if not convert:
            out += lines
            continue
        for line in lines.split(b"\n")[:-1]:
            row = orjson.loads(line)
            for name in convert:
                value = row.get(name)
                if value is not None:
                    row[name] = to_stage(value, types[name])
            out += _dumps(row, option=_NEWLINE)
    return bytes(out)


def _csv_text(value: Any) -> str:
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is float:
        return repr(value)
    return str(value)


def _csv(rows: Iterator[dict[str, Any]], types: Mapping[str, DataType]) -> bytes:
    text = io.StringIO(newline="")
    writer = csv.writer(text, lineterminator="\n")
    columns = list(types)
    writer.writerow(columns)
    floats = {name for name, t in types.items() if t is DataType.FLOAT64}  # may hold ints: 1 → 1.0
    for row in rows:
        writer.writerow(
            [
                _csv_text(float(v) if name in floats and type(v) is int else v)
                for name in columns
                for v in (row.get(name),)
            ]
        )
    return text.getvalue().encode("utf-8")


def _parquet(groups: Iterator[Iterator[dict[str, Any]]], types: Mapping[str, DataType], compression: str) -> bytes:
    """One row group per part (`chunk_rows` rows at most): only one part's columns are held as
    Python objects at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrow = {
        DataType.BOOL: pa.bool_(),
        DataType.INT64: pa.int64(),
        DataType.FLOAT64: pa.float64(),
        DataType.STRING: pa.string(),
        DataType.TIMESTAMP: pa.timestamp("us", tz="UTC"),
    }
    schema = pa.schema([pa.field(name, arrow[t]) for name, t in types.items()])
    timestamps = [name for name, t in types.items() if t is DataType.TIMESTAMP]
    out = io.BytesIO()
    with pq.ParquetWriter(out, schema, compression=compression) as writer:
        for rows in groups:
            columns: dict[str, list[Any]] = {name: [] for name in types}
            for row in rows:
                for name, values in columns.items():
                    values.append(row.get(name))
                for name in timestamps:
                    text = columns[name][-1]
                    if text is not None:
                        columns[name][-1] = parse_timestamp(text)
            arrays = [pa.array(columns[name], arrow[t]) for name, t in types.items()]
            writer.write_table(pa.Table.from_arrays(arrays, schema=schema))
    return out.getvalue()
