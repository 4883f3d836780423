"""Rows of one destination/table pair in one Spark task, with their types, until they are staged.

A value must fit the column it will land in. For a column the target table already has, the value
is checked against the table's type now, on the executor, so that one bad value fails one event
(with a reason naming the column and the value) instead of the whole load. Columns typed by the
mapping (`cast`) or by name (`_timestamp`) are checked against that type. Other columns get the
type of their values, promoted when values disagree; the driver widens the table to that type.

Values are kept in their *stage* form: bool, int, float, or str for STRING and TIMESTAMP
(RFC 3339 text, cast by the warehouse at commit).

For a stage that reads JSON lines (`StageTarget.json_lines`), each row is instead encoded the
moment it is taken, while its values are still in the CPU cache, and appended to one buffer: one
C call per row (orjson) rather than the column-by-column passes over a whole chunk that a tabular
stage needs, each of which misses the cache on every value. The row itself is not kept, so the
memory of one event is reused by the next instead of a chunk's worth of objects being allocated,
page-faulted in and freed per chunk. When a column was promoted later in the chunk (int, then
text), `take_json` decodes every line and encodes again those holding a value to convert; not
for int, then float: a JSON number is read as either.

Where the stage's text cannot hold U+0000 (its target's `text_holds_nul` is False: Postgres), a str
value holding it fails its event, as on the direct path (`batch.direct`): in the stage's COPY it
would fail the whole chunk, and the pair with it on every retry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from eventspark import speedups
from eventspark.destinations.base import ORDER_COLUMN
from eventspark.steps.diff import UnmappedRule
from eventspark.steps.literals import LiteralCheck, literal_check
from eventspark.steps.typing import (
    ALWAYS_TIMESTAMP,
    BatchHeader,
    DataType,
    Field,
    coerce,
    format_timestamp,
    infer_type,
    is_timestamp,
    parse_generic_type,
    promote,
)

_MISSING = object()
_dumps = orjson.dumps
_NEWLINE = orjson.OPT_APPEND_NEWLINE
_STAGE_KIND: dict[DataType, type] = {
    DataType.BOOL: bool,
    DataType.INT64: int,
    DataType.FLOAT64: float,
    DataType.TIMESTAMP: str,
    DataType.STRING: str,
}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_NUL = "\x00"
NUL_ERROR = "text cannot hold the character U+0000 (NUL)"
"""Why a str value holding U+0000 fails its event where text cannot store it (Postgres)."""


class _TimestampText:
    """The kind of a TIMESTAMP column's values: str, but only those `is_timestamp` accepts."""


# A value of this Python type leaves a column of this type as it is (TIMESTAMP: a str that parses).
_SAME_KIND: dict[DataType | None, type] = {
    DataType.BOOL: bool,
    DataType.INT64: int,
    DataType.FLOAT64: float,
    DataType.STRING: str,
    DataType.TIMESTAMP: _TimestampText,
}


class _NulFreeText:
    """The kind of a STRING column's values where text cannot hold U+0000: str, without it."""


# `_SAME_KIND` for a stage whose text cannot hold U+0000: a str value is searched for it first.
_SAME_KIND_NUL_FREE: dict[DataType | None, type] = {**_SAME_KIND, DataType.STRING: _NulFreeText}

# The compiled fast path of `ChunkBuffer.add` (`speedups/_rows.pyx`); None: the Python loop alone.
_rows = speedups.load("rows")


def to_stage(value: Any, stage: DataType) -> Any:
    """`value` as the stage stores a `stage` column; ValueError when it does not fit."""
    if stage is DataType.TIMESTAMP:
        if type(value) is str and is_timestamp(value):
            return value
        return format_timestamp(coerce(value, DataType.TIMESTAMP))  # type: ignore[arg-type]
    return coerce(value, stage)


class ChunkBuffer:
    """Accepts rows for one table; `take` hands them over as a chunk with its column types."""

    __slots__ = (
        "columns",
        "count",
        "existing",
        "fast",
        "fixed_types",
        "kinds",
        "lines",
        "literal_checks",
        "mixed",
        "nul_free",
        "primary_keys",
        "recode",
        "rows",
        "same_kind",
        "seqs",
        "short_rows",
        "sql_types",
        "table",
        "types",
    )

    def __init__(
        self,
        table: str,
        existing: Mapping[str, DataType | None] | None,
        primary_keys: tuple[str, ...] = (),
        json_lines: bool = False,
        holds_nul: bool = True,
    ) -> None:
        self.table = table
        self.existing: Mapping[str, DataType | None] = existing or {}
        self.primary_keys = primary_keys
        # Without json_lines: each row as a list of its values in column order (`columns`, the
        # order of `types`), made the moment the row is taken, while its values are in the CPU
        # cache; the dict is then freed, and the next event reuses its memory. Rows taken before
        # the last new column are shorter: the first `short_rows` rows, padded at `take`.
        self.rows: list[list[Any]] = []
        self.columns: list[str] = []
        self.short_rows = 0
        self.seqs: list[int] = []
        self.count = 0
        self.types: dict[str, DataType] = {}
        # Per column, the Python type of values that need no work: `types` as seen by the fast path.
        self.kinds: dict[str, type | None] = {}
        self.sql_types: dict[str, str] = {}
        self.mixed: set[str] = set()
        # Mixed columns whose JSON must change too: all but int → float, as a JSON number is both.
        self.recode: set[str] = set()
        self.fixed_types: dict[str, tuple[DataType, str | None]] = {}
        # Columns cast to a literal SQL type this module can check (`steps.literals`).
        self.literal_checks: dict[str, LiteralCheck] = {}
        # Each row as a JSON object and a newline, when the stage reads them.
        self.lines: bytearray | None = bytearray() if json_lines else None
        # Whether a str value holding U+0000 fails its event (not `text_holds_nul(stage)`).
        self.nul_free = not holds_nul
        self.same_kind = _SAME_KIND_NUL_FREE if self.nul_free else _SAME_KIND
        # The fast path at C speed: when every value of a row takes it, the loop of `add` is
        # skipped (None: the speed-up is not built or turned off; the loop is the reference).
        self.fast: Any = None
        if _rows is not None:
            self.fast = _rows.RowScan(
                text_nul=False, is_timestamp=is_timestamp, nul_free=_NulFreeText, timestamp=_TimestampText
            )

    def __len__(self) -> int:
        return self.count

    def add(self, values: dict[str, Any], casts: Mapping[str, str], seq: int = 0) -> str | None:
        """Takes the row (its dict may be changed; the buffer keeps its values, not the dict: a
        change made after this call does not reach the chunk) or returns why it does not fit."""
        for key in self.primary_keys:
            if values.get(key) is None:
                return f"primary key field {key!r} is missing"
        if ORDER_COLUMN in values:
            return f"field {ORDER_COLUMN!r} is reserved for eventspark's own use: rename it with a mapping"
        fast = self.fast
        if fast is not None:
            if self.lines is None:
                # One C pass makes the row's list when every value takes the fast path (its columns
                # must be up to date: not so after a refused row that typed a new one).
                row = fast.take(values, self.kinds, self.columns) if len(self.columns) == len(self.types) else None
                if row is not None:
                    self.rows.append(row)
                    self.seqs.append(seq)
                    self.count += 1
                    return None
            elif fast.passes(values, self.kinds):
                return self._add_line(values, seq)
        error = self._add_values(values, casts)
        if error is not None:
            return error
        if self.lines is not None:
            return self._add_line(values, seq)
        columns = self.columns
        if len(columns) != len(self.types):  # a new column: `types` only grows until `take`
            columns = self.columns = list(self.types)
            self.short_rows = len(self.rows)
        self.rows.append(list(map(values.get, columns)))
        self.seqs.append(seq)
        self.count += 1
        return None

    def _add_values(self, values: dict[str, Any], casts: Mapping[str, str]) -> str | None:
        """Checks the row's values, typing new columns and converting values to their stage form;
        or returns why one does not fit. The reference of the compiled fast path (`fast`), which
        passes a row only when this loop would pass over every value unchanged. `kinds` changes
        only here (and at `_reset`), so only after a row `fast` missed: its `take` relies on it."""
        kinds = self.kinds
        for name, value in values.items():
            # Fast path, most values: the column's type is known in this chunk and the value is
            # already of its stage kind, so nothing changes. Subscript and KeyError rather than
            # .get: a column new to the chunk is rare, and the path for it is slow anyway.
            kind = type(value)
            try:
                expect = kinds[name]
            except KeyError:
                expect = None
            if kind is expect:
                if kind is not int or _INT64_MIN <= value <= _INT64_MAX:
                    continue
            elif expect is _NulFreeText:  # only where text cannot hold U+0000: a search per str
                if kind is str and "\x00" not in value:  # a constant: faster than the global _NUL
                    continue
            elif expect is _TimestampText and kind is str and is_timestamp(value):
                continue
            if value is None:  # adds nothing: no column, no type
                continue
            if kind is str and self.nul_free and _NUL in value:  # before a new column is typed for it
                return f"column {name!r}: {NUL_ERROR}"
            error = self._add_value(values, name, value, casts)
            if error is not None:
                return error
        return None

    def _add_line(self, values: dict[str, Any], seq: int) -> str | None:
        assert self.lines is not None
        if self.primary_keys:
            values[ORDER_COLUMN] = seq
        try:
            line = _dumps(values, option=_NEWLINE)
        except TypeError:  # an integer beyond 64 bits: its column is marked for conversion
            try:
                _convert_row(values, self.mixed, self.types)
                line = _dumps(values, option=_NEWLINE)
            except (TypeError, ValueError) as exc:
                return f"the event cannot be staged as JSON: {exc}"
        self.lines += line
        self.count += 1
        return None

    def _add_value(self, values: dict[str, Any], name: str, value: Any, casts: Mapping[str, str]) -> str | None:
        if value is None:
            return None
        known = self.existing.get(name, _MISSING) if self.existing else _MISSING
        if known is not _MISSING:
            # The table's own type decides (its SQL type is not known here, so no literal check).
            return self._fit(values, name, value, known or DataType.STRING)  # type: ignore[arg-type]
        if name in ALWAYS_TIMESTAMP or (casts and name in casts):
            return self._fit(values, name, value, self._fixed_type(name, casts))
        found = infer_type(value)
        if type(value) is not _STAGE_KIND[found]:
            # Not in stage form: an integer beyond bigint (FLOAT64), a structure or a date a
            # mapping constant put there. Converted at `take`; refused now if it cannot be.
            try:
                to_stage(value, found)
            except ValueError as exc:
                return f"column {name!r}: {exc}"
            self.mixed.add(name)
            self.recode.add(name)
        current = self.types.get(name)
        if current is None:
            self._set_type(name, found)
        elif current is not found:
            promoted = promote(current, found)
            self._set_type(name, promoted)
            self.mixed.add(name)
            if promoted is not DataType.FLOAT64 or DataType.BOOL in (current, found):
                self.recode.add(name)
        return None

    def _fixed_type(self, name: str, casts: Mapping[str, str]) -> DataType:
        cast = casts.get(name) if casts else None
        cached = self.fixed_types.get(name)
        if cached is not None and cached[1] == cast:
            return cached[0]
        generic = parse_generic_type(cast) if cast is not None else DataType.TIMESTAMP
        if cast is not None and generic is None:
            self.sql_types[name] = cast  # a literal SQL type: staged as text, cast by the warehouse
            check = literal_check(cast)
            if check is not None:
                self.literal_checks[name] = check
            else:
                self.literal_checks.pop(name, None)
        stage = generic or DataType.STRING
        self.fixed_types[name] = (stage, cast)
        return stage

    def _set_type(self, name: str, data_type: DataType) -> None:
        self.types[name] = data_type
        self.kinds[name] = self.same_kind.get(data_type)

    def _fit(self, values: dict[str, Any], name: str, value: Any, stage: DataType) -> str | None:
        current = self.types.get(name)
        if current is not stage:
            if current is not None:
                # Another row of this chunk typed the column otherwise (a cast that changes from
                # row to row, as a transform's type hints can): the column takes the type that
                # holds both, and the earlier values are converted at `take`.
                stage = promote(current, stage)
                self.mixed.add(name)
                self.recode.add(name)
            self._set_type(name, stage)
        check = self.literal_checks.get(name) if self.literal_checks else None
        if check is not None:
            self.kinds[name] = None  # every value of the column takes this path
        elif (
            type(value) is _STAGE_KIND[stage]
            and stage is not DataType.TIMESTAMP
            and (stage is not DataType.INT64 or _INT64_MIN <= value <= _INT64_MAX)
        ):
            return None
        try:
            staged = values[name] = to_stage(value, stage)
        except ValueError as exc:
            return f"column {name!r}: {exc}"
        if check is not None:
            try:
                error = check(staged if type(staged) is str else str(staged))
            except Exception as exc:  # one odd value fails its event, never the task
                error = f"cannot check the value: {type(exc).__name__}: {exc}"
            if error is not None:
                return f"column {name!r} ({self.sql_types[name]}): {error}"
        return None

    def take(self, ordered: bool = False) -> tuple[dict[str, DataType], list[list[Any]], BatchHeader]:
        """The buffered rows as lists in column order, their stage types and header; then empty."""
        columns = list(self.types)
        rows = self.rows
        width = len(columns)
        # A row that failed after typing a new column leaves `columns` behind `types`: then every
        # row is short, not only the first `short_rows`.
        short_rows = self.short_rows if len(self.columns) == width else len(rows)
        for index in range(short_rows):
            row = rows[index]
            row.extend([None] * (width - len(row)))
        for index, name in enumerate(columns):
            if name in self.mixed:
                _convert_column(rows, index, self.types[name])
        if ordered:
            for row, seq in zip(rows, self.seqs, strict=True):
                row.append(seq)
        return self._stage_types(ordered), rows, self._reset()

    def take_json(self) -> tuple[dict[str, DataType], bytearray, BatchHeader]:
        """The buffered rows as JSON lines (objects with ORDER_COLUMN when the table has a primary
        key), their stage types and header; then empty. Only for a buffer made with `json_lines`."""
        lines = self.lines
        assert lines is not None, "a buffer made without json_lines"
        if self.recode:  # decode every line, encode again those holding a value to convert
            lines = bytearray()
            for line in self.lines.split(b"\n")[:-1]:  # orjson escapes newlines inside strings
                row = orjson.loads(line)
                if _convert_row(row, self.recode, self.types):
                    lines += _dumps(row, option=_NEWLINE)
                else:
                    lines += line
                    lines += b"\n"
        return self._stage_types(bool(self.primary_keys)), lines, self._reset()

    def _stage_types(self, ordered: bool) -> dict[str, DataType]:
        stage_types = dict(self.types)
        if ordered:
            stage_types[ORDER_COLUMN] = DataType.INT64
        return stage_types

    def _reset(self) -> BatchHeader:
        fields = {name: Field(t, self.sql_types.get(name)) for name, t in self.types.items()}
        header = BatchHeader(self.table, fields)
        self.rows, self.seqs, self.types, self.kinds, self.mixed, self.recode = [], [], {}, {}, set(), set()
        self.columns, self.short_rows = [], 0
        self.count = 0
        if self.lines is not None:
            self.lines = bytearray()
        return header


class UnmappedChunkBuffer(ChunkBuffer):
    """A ChunkBuffer for a full or frozen table (`UnmappedRule.full`): the fields the table lacks
    go into the unmapped column (docs/json-columns.md). Before the table is full the driver
    decides (`UnmappedRule.limit`). A subclass, so that other tables' rows pay nothing."""

    __slots__ = ("unmapped",)

    def __init__(
        self,
        table: str,
        existing: Mapping[str, DataType | None],
        primary_keys: tuple[str, ...],
        json_lines: bool,
        unmapped: UnmappedRule,
        holds_nul: bool = True,
    ) -> None:
        super().__init__(table, existing, primary_keys, json_lines, holds_nul)
        self.unmapped = unmapped

    def add(self, values: dict[str, Any], casts: Mapping[str, str], seq: int = 0) -> str | None:
        error = self.unmapped.place(values, self.existing)
        if error is not None:
            return error
        return super().add(values, self.unmapped.casts(casts), seq)


def chunk_buffer(
    table: str,
    existing: Mapping[str, DataType | None] | None,
    primary_keys: tuple[str, ...],
    json_lines: bool,
    unmapped: UnmappedRule | None,
    holds_nul: bool = True,
) -> ChunkBuffer:
    """The buffer of a table: an UnmappedChunkBuffer once `unmapped` applies to it. Without
    `holds_nul` (`text_holds_nul` of the stage), a str value holding U+0000 fails its event."""
    if unmapped is not None and existing is not None and unmapped.full(existing):
        return UnmappedChunkBuffer(table, existing, primary_keys, json_lines, unmapped, holds_nul)
    return ChunkBuffer(table, existing, primary_keys, json_lines, holds_nul)


def text_holds_nul(stage: object) -> bool:
    """`stage.text_holds_nul`: False where text cannot hold U+0000 (Postgres); True when the stage
    does not say (every other warehouse stores it)."""
    return bool(getattr(stage, "text_holds_nul", True))


def _convert_row(row: dict[str, Any], mixed: set[str], types: Mapping[str, DataType]) -> bool:
    """Converts `row`'s values of promoted columns to their stage type; True if any changed."""
    changed = False
    for name in mixed:
        value = row.get(name)
        if value is not None:
            stage = types[name]
            if type(value) is not _STAGE_KIND[stage]:
                row[name] = to_stage(value, stage)
                changed = True
    return changed


def _convert_column(rows: list[list[Any]], index: int, stage: DataType) -> None:
    # Promotion only goes up the tree (bool → int → float → string), so these cannot fail.
    kind = _STAGE_KIND[stage]
    for row in rows:
        value = row[index]
        if value is not None and type(value) is not kind:
            row[index] = to_stage(value, stage)
