"""Per format, what an executor keeps for one object and how the object is encoded.

- `json`: the event after enrichment (lookups), before mapping and flattening, one per line.
  `EventBuffer` encodes each event the moment it arrives; the object is those lines.
- `flat_json`, `csv`, `parquet`: the flattened row after mapping, typed like a warehouse batch
  (`batch.chunks.ChunkBuffer`: a value that cannot be typed fails its event alone). `FlatBuffer`
  keeps rows as JSON lines in parts of `chunk_rows` rows (or `PART_BYTES`), each with its
  BatchHeader; the object's columns are the merged header's, values of a part converted when the
  merge promoted their column.

Both buffers spill their parts to a spooled temporary file, and `encode_file` writes the object
into another (gzip, CSV and Parquet writers stream into it) that the store uploads from: what an
executor holds of an object is one part and the encoding of one part, whatever the split's size.
  `flat_json`: one object per line (values in their column's type, timestamps as RFC 3339 text in
  UTC with microseconds, as the warehouses' stages write them: `steps.typing.format_timestamp`);
  `csv`: RFC 4180 (CRLF line ends, fields quoted when they hold `,` `"` CR or LF), a header row,
  then one row per event: NULL as an empty field, an empty string as `""` (PostgreSQL's COPY
  convention), booleans `true`/`false`, timestamps as flat_json's;
  `parquet`: one typed column per field (bool, int64, double, string, timestamp[us, UTC]).

`compression: gzip` gzips `json`, `flat_json` and `csv` objects (`.gz`, written with mtime 0, so
a rerun writes the same bytes); Parquet objects use Parquet's own GZIP codec instead (the file
stays readable by every Parquet reader), else Snappy.
"""

from __future__ import annotations

import gzip
import io
import re
import tempfile
from collections.abc import Iterator, Mapping
from typing import IO, Any

import orjson

from eventspark.batch.chunks import ChunkBuffer, to_stage
from eventspark.steps.typing import BatchHeader, DataType, format_timestamp, parse_timestamp

_dumps = orjson.dumps
_NEWLINE = orjson.OPT_APPEND_NEWLINE
CONTENT_TYPES = {
    "json": "application/x-ndjson",
    "flat_json": "application/x-ndjson",
    "csv": "text/csv",
    "parquet": "application/vnd.apache.parquet",
}


SPOOL_BYTES = 8 * 1024 * 1024
"""What a buffer's spilled parts, and an encoded object, hold in memory before they go to a
temporary file (`tempfile.SpooledTemporaryFile`, in the executor's TMPDIR, unlinked at once)."""
_COPY_BYTES = 1024 * 1024
PART_BYTES = 16 * 1024 * 1024
"""A buffer spills its rows (a part: a Parquet row group) once they take this many bytes as JSON
lines, or every `chunk_rows` rows, whichever comes first: what an executor holds of one object
does not grow with the split."""


def _spool(first: int = 0) -> IO[bytes]:
    """A spooled file; straight on disk when its first write (`first` bytes) would roll it over
    anyway, which saves the in-memory copy."""
    if first >= SPOOL_BYTES:
        return tempfile.TemporaryFile()  # closed by its buffer or caller
    return tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)


class EventBuffer:
    """`json`: events as JSON lines, encoded on arrival; spilled to `spooled` every `chunk_rows`."""

    __slots__ = ("count", "lines", "spooled", "table", "total")

    def __init__(self, table: str) -> None:
        self.table = table
        self.lines = bytearray()
        self.spooled: IO[bytes] | None = None
        self.count = 0
        self.total = 0

    def add(self, values: dict[str, Any], casts: Mapping[str, str], seq: int = 0) -> str | None:
        try:
            self.lines += _dumps(values, option=_NEWLINE)
        except TypeError as exc:
            return f"the event cannot be written as JSON: {exc}"
        self.count += 1
        self.total += 1
        if len(self.lines) >= PART_BYTES:
            self.spill()
        return None

    def __len__(self) -> int:
        return self.count

    def spill(self) -> None:
        if self.lines:
            if self.spooled is None:
                self.spooled = _spool(len(self.lines))
            self.spooled.write(self.lines)
            self.lines = bytearray()
        self.count = 0

    def encode_into(self, out: IO[bytes], fmt: str, compression: str) -> BatchHeader:
        self.spill()
        if self.spooled is not None:
            self.spooled.seek(0)
            while block := self.spooled.read(_COPY_BYTES):
                out.write(block)
        return BatchHeader(self.table)

    def close(self) -> None:
        if self.spooled is not None:
            self.spooled.close()
            self.spooled = None


class FlatBuffer(ChunkBuffer):
    """`flat_json`, `csv`, `parquet`: typed flattened rows, as JSON lines in parts of `chunk_rows`
    rows spilled to `spooled`, each part with its BatchHeader."""

    __slots__ = ("parts", "spilled", "spooled")

    def __init__(self, table: str) -> None:
        super().__init__(table, None, (), json_lines=True)
        self.parts: list[tuple[int, int, BatchHeader]] = []
        """(offset in `spooled`, length, header) of every part."""
        self.spooled: IO[bytes] | None = None
        self.spilled = 0

    @property
    def total(self) -> int:
        return self.spilled + self.count

    def add(self, values: dict[str, Any], casts: Mapping[str, str], seq: int = 0) -> str | None:
        error = super().add(values, casts, seq)
        if error is None and len(self.lines) >= PART_BYTES:  # type: ignore[arg-type]
            self.spill()
        return error

    def spill(self) -> None:
        count = self.count
        if count:
            _types, lines, header = self.take_json()
            if self.spooled is None:
                self.spooled = _spool(len(lines))
            offset = self.spooled.seek(0, io.SEEK_END)
            self.spooled.write(lines)
            self.parts.append((offset, len(lines), header))
            self.spilled += count

    def _part_lines(self) -> Iterator[tuple[bytes, BatchHeader]]:
        """The parts back, one at a time."""
        assert self.spooled is not None or not self.parts
        for offset, length, header in self.parts:
            self.spooled.seek(offset)  # type: ignore[union-attr]
            yield self.spooled.read(length), header  # type: ignore[union-attr]

    def encode_into(self, out: IO[bytes], fmt: str, compression: str) -> BatchHeader:
        self.spill()
        header = BatchHeader(self.table)
        for _offset, _length, part in self.parts:
            header.merge(part)
        types = {name: field.type for name, field in header.fields.items()}
        if fmt == "flat_json":
            _flat_json(self._part_lines(), types, out)
        elif fmt == "csv":
            _csv(self._rows(types, utc=True), types, out)
        else:
            groups = (self._part_rows(lines, part, types, utc=False) for lines, part in self._part_lines())
            _parquet(groups, types, "gzip" if compression == "gzip" else "snappy", out)
        return header

    def _rows(self, types: Mapping[str, DataType], utc: bool) -> Iterator[dict[str, Any]]:
        for lines, part in self._part_lines():
            yield from self._part_rows(lines, part, types, utc)

    @staticmethod
    def _part_rows(
        lines: bytes, part: BatchHeader, types: Mapping[str, DataType], utc: bool
    ) -> Iterator[dict[str, Any]]:
        convert = _converted(part, types, utc)
        for line in lines.split(b"\n")[:-1]:  # orjson escapes newlines inside strings
            row = orjson.loads(line)
            for name in convert:
                value = row.get(name)
                if value is not None:
                    row[name] = _value(value, types[name])
            yield row

    def close(self) -> None:
        if self.spooled is not None:
            self.spooled.close()
            self.spooled = None


def new_buffer(fmt: str, table: str) -> EventBuffer | FlatBuffer:
    return EventBuffer(table) if fmt == "json" else FlatBuffer(table)


def encode_file(buffer: EventBuffer | FlatBuffer, fmt: str, compression: str) -> tuple[IO[bytes], int, BatchHeader]:
    """The object as a spooled file at offset 0 (in memory up to `SPOOL_BYTES`, then on disk),
    its size and the header of its columns: the format, then gzip (not for Parquet, which
    compresses inside). The caller closes the file."""
    out = _spool()
    try:
        if compression == "gzip" and fmt != "parquet":
            with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6, mtime=0) as zipped:
                header = buffer.encode_into(zipped, fmt, compression)  # type: ignore[arg-type]
        else:
            header = buffer.encode_into(out, fmt, compression)
        size = out.seek(0, io.SEEK_END)
        out.seek(0)
    except BaseException:
        out.close()
        raise
    return out, size, header


def encode(buffer: EventBuffer | FlatBuffer, fmt: str, compression: str) -> tuple[bytes, BatchHeader]:
    """`encode_file`'s object as bytes (for tests and small objects)."""
    out, _size, header = encode_file(buffer, fmt, compression)
    with out:
        return out.read(), header


def _converted(part: BatchHeader, types: Mapping[str, DataType], utc: bool) -> list[str]:
    """Columns whose values are converted: those whose type in this part is not the object's
    (promoted), and with `utc` the timestamp columns (written in UTC)."""
    return [
        name
        for name, field in part.fields.items()
        if field.type is not types[name] or (utc and types[name] is DataType.TIMESTAMP)
    ]


def _value(value: Any, kind: DataType) -> Any:
    """`value` in a column of type `kind`: a timestamp as RFC 3339 text in UTC, microseconds."""
    if kind is DataType.TIMESTAMP and type(value) is str:
        parsed = parse_timestamp(value)
        if parsed is not None:
            return format_timestamp(parsed)
    return to_stage(value, kind)


def _flat_json(parts: Iterator[tuple[bytes, BatchHeader]], types: Mapping[str, DataType], out: IO[bytes]) -> None:
    for lines, part in parts:
        convert = _converted(part, types, utc=True)
        if not convert:
            out.write(lines)
            continue
        block = bytearray()
        for line in lines.split(b"\n")[:-1]:
            row = orjson.loads(line)
            for name in convert:
                value = row.get(name)
                if value is not None:
                    row[name] = _value(value, types[name])
            block += _dumps(row, option=_NEWLINE)
            if len(block) >= _COPY_BYTES:
                out.write(block)
                block = bytearray()
        out.write(block)


_CSV_QUOTED = re.compile(r'[,"\r\n]')


def _csv_field(value: Any) -> str:
    """One RFC 4180 field: NULL as nothing, an empty string as `""`."""
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is float:
        return repr(value)
    text = str(value)
    if not text or _CSV_QUOTED.search(text):
        return '"' + text.replace('"', '""') + '"'
    return text


def _csv(rows: Iterator[dict[str, Any]], types: Mapping[str, DataType], out: IO[bytes]) -> None:
    columns = list(types)
    lines = [",".join(map(_csv_field, columns))]
    floats = {name for name, t in types.items() if t is DataType.FLOAT64}  # may hold ints: 1 → 1.0
    for row in rows:
        lines.append(
            ",".join(
                [
                    _csv_field(float(v) if name in floats and type(v) is int else v)
                    for name in columns
                    for v in (row.get(name),)
                ]
            )
        )
        if len(lines) >= 1000:
            out.write(("\r\n".join(lines) + "\r\n").encode("utf-8"))
            lines = []
    if lines:
        out.write(("\r\n".join(lines) + "\r\n").encode("utf-8"))


def _parquet(
    groups: Iterator[Iterator[dict[str, Any]]], types: Mapping[str, DataType], compression: str, out: IO[bytes]
) -> None:
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
