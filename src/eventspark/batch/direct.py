"""Rows of one (split, destination, table) kept for a direct write (`Capabilities.direct_writes`).

A table can take rows straight from the executors when every one of its columns has an SQL type
whose values can be checked here completely (`direct_columns`): then a value that passes cannot
be refused by the warehouse, and a split is written whole, in one transaction with its load
markers, at its end (`DirectWriter.write_split`). Values are checked and normalised as
`ChunkBuffer` does against an existing table's types (`to_stage`), plus what the staged path
leaves to the commit's CAST: the range of `integer`/`smallint`/`numeric(p,s)`, the length of a
`varchar(n)` (cut, as a CAST cuts), the offset of a timestamp going to a `timestamp` column
(converted to UTC: Postgres ignores the offset of a value for a column without time zone),
text holding U+0000 (which Postgres text cannot store: it would fail the whole split).

A row with a field the table lacks cannot be written directly: `DirectBuffer.add` returns
`STAGE` and the task stages the (split, table) as before (`PartitionTask.stage_split`).

After the check, every value of a column is of one Python type (`DirectColumns.types`): the
writer picks each column's encoder once (`DirectRows.kinds`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from eventspark import speedups
from eventspark.batch.chunks import NUL_ERROR, to_stage
from eventspark.destinations.base import DirectRows
from eventspark.steps.literals import literal_check
from eventspark.steps.typing import DataType, format_timestamp, is_timestamp, parse_timestamp

STAGE = "the row needs a column the table lacks"
"""What `DirectBuffer.add` returns (this very object) for a row that must be staged."""

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_NUMERIC = re.compile(r"numeric(?:\((\d+),(\d+)\))?", re.ASCII)
_VARCHAR = re.compile(r"character varying(?:\((\d+)\))?", re.ASCII)
_INTEGERS = {"integer": (-(2**31), 2**31 - 1), "smallint": (-(2**15), 2**15 - 1)}
_NUL = "\x00"
# The compiled fast path of `DirectBuffer.add` (`speedups/_rows.pyx`); None: the Python loop alone.
_rows = speedups.load("rows")
# The Python type of a column's values once checked, by the DataType its SQL type reads as.
_VALUE_TYPES: dict[DataType, type] = {
    DataType.BOOL: bool,
    DataType.INT64: int,
    DataType.FLOAT64: float,
    DataType.STRING: str,
    DataType.TIMESTAMP: str,
}

Check = Callable[[Any], Any]
"""A column's check: the value as the column takes it (bool, int, float or str); ValueError when
it does not fit."""


class _Zoned:
    """The kind of a `timestamptz` column's values: RFC 3339 text with any offset."""


class _Utc:
    """The kind of a `timestamp` column's values: RFC 3339 text in UTC ('Z')."""


class _Checked:
    """The kind of columns whose every value takes the check (a range or a length)."""


class _Bounded:
    """The kind of a `numeric(p,s)` column's values: floats within its bound (`DirectColumns.bounds`)."""


class DirectColumns:
    """The checks of the columns of a table written directly (`direct_columns`)."""

    __slots__ = ("bounds", "checks", "kinds", "sql_types", "types")

    def __init__(
        self,
        kinds: dict[str, type],
        checks: dict[str, Check],
        bounds: dict[str, float],
        types: dict[str, type],
        sql_types: Mapping[str, str] | None = None,
    ) -> None:
        self.kinds = kinds
        """Column → the Python type of values that need no work (`_Zoned`, `_Utc`: text parsed
        inline; `_Bounded`: floats compared inline; `_Checked`: none)."""
        self.checks = checks
        """Column → its check, for the other values."""
        self.bounds = bounds
        """`numeric(p,s)` column → the bound of its floats (exclusive, both signs)."""
        self.types = types
        """Column → the Python type of its values once checked (bool, int, float or str)."""
        self.sql_types = dict(sql_types or {})
        """Column → its SQL type, as the catalog spells it (`DirectRows.sql_types`)."""


def direct_columns(sql_types: Mapping[str, str], types: Mapping[str, DataType | None]) -> DirectColumns | None:
    """The checks of a table with these columns (SQL types as the catalog reads them, DataTypes as
    `JobPlan.existing` has them); None when some column's values cannot be checked completely."""
    kinds: dict[str, type] = {}
    checks: dict[str, Check] = {}
    bounds: dict[str, float] = {}
    value_types: dict[str, type] = {}
    for name, sql_type in sql_types.items():
        data_type = types.get(name)
        found = _column(sql_type.strip().lower(), data_type)
        if found is None or data_type is None:
            return None
        kinds[name], checks[name] = found
        value_types[name] = _VALUE_TYPES[data_type]  # each check returns this type (`_column`)
        if kinds[name] is _Bounded:
            bounds[name] = checks[name].limit  # type: ignore[attr-defined]
    return DirectColumns(kinds, checks, bounds, value_types, sql_types)


def _column(sql_type: str, data_type: DataType | None) -> tuple[type, Check] | None:
    """A column's fast-path kind and check; None for a type not checked here."""
    if sql_type == "boolean" and data_type is DataType.BOOL:
        return bool, _staged(DataType.BOOL)
    if sql_type == "bigint" and data_type is DataType.INT64:
        return int, _staged(DataType.INT64)
    if sql_type in _INTEGERS and data_type is DataType.INT64:
        return _Checked, _ranged(sql_type, *_INTEGERS[sql_type])
    if sql_type == "double precision" and data_type is DataType.FLOAT64:
        return float, _staged(DataType.FLOAT64)
    if sql_type == "text" and data_type is DataType.STRING:
        return str, _text()
    if sql_type in ("timestamp without time zone", "timestamp") and data_type is DataType.TIMESTAMP:
        return _Utc, _timestamp(zoned=False)
    if sql_type in ("timestamp with time zone", "timestamptz") and data_type is DataType.TIMESTAMP:
        return _Zoned, _timestamp(zoned=True)
    numeric = _NUMERIC.fullmatch(sql_type)
    if numeric is not None and data_type is DataType.FLOAT64:
        if numeric.group(1) is None:
            return float, _staged(DataType.FLOAT64)
        return _Bounded, _numeric(sql_type, int(numeric.group(1)), int(numeric.group(2)))
    varchar = _VARCHAR.fullmatch(sql_type)
    if varchar is not None and data_type is DataType.STRING:
        if varchar.group(1) is None:
            return str, _text()
        return _Checked, _cut(int(varchar.group(1)))
    return None


def _staged(data_type: DataType) -> Check:
    def check(value: Any) -> Any:
        return to_stage(value, data_type)

    return check


def _text() -> Check:
    to_text = _staged(DataType.STRING)

    def check(value: Any) -> Any:
        text = to_text(value)
        if _NUL in text:
            raise ValueError(NUL_ERROR)
        return text

    return check


def _ranged(sql_type: str, low: int, high: int) -> Check:
    to_int = _staged(DataType.INT64)

    def check(value: Any) -> Any:
        number = value if type(value) is int else to_int(value)
        if not low <= number <= high:
            raise ValueError(f"value {number} is out of range for {sql_type} [{low}, {high}]")
        return number

    return check


def _numeric(sql_type: str, precision: int, scale: int) -> Check:
    to_float = _staged(DataType.FLOAT64)
    # Beyond this, the value rounded to `scale` digits has more than precision - scale before the
    # point (the server would refuse it, and fail the whole split).
    limit = float(Decimal(10) ** (precision - scale) - Decimal(5).scaleb(-scale - 1))
    decimal = literal_check(sql_type)

    def check(value: Any) -> Any:
        number = value if type(value) is float else to_float(value)
        if -limit < number < limit:
            return number
        error = decimal(repr(number)) if decimal is not None else None
        raise ValueError(error or f"value {number!r} does not fit a {sql_type} column")

    check.limit = limit  # type: ignore[attr-defined]  # `DirectColumns.bounds`
    return check


def _cut(length: int) -> Check:
    to_text = _staged(DataType.STRING)

    def check(value: Any) -> Any:
        # Longer text is cut, as the staged path's CAST to varchar(n) cuts it.
        text = value if type(value) is str else to_text(value)
        if _NUL in text:
            raise ValueError(NUL_ERROR)
        return text if len(text) <= length else text[:length]

    return check


def _timestamp(zoned: bool) -> Check:
    to_text = _staged(DataType.TIMESTAMP)

    def check(value: Any) -> Any:
        text = to_text(value)  # RFC 3339 text as it came, or in UTC ('Z') when it was not text
        if zoned or text[-1] == "Z" or text.endswith(("+00:00", "-00:00")):
            return text
        return format_timestamp(parse_timestamp(text))  # type: ignore[arg-type]

    return check


class DirectBuffer:
    """The rows of one (split, table) until the split's end (`take`); with `keep` False (a split
    written by an earlier pass) rows are checked only.

    Each row is kept as a list in the order of `columns`, the table's columns that got a value so
    far in the split (a row made before a column came is shorter: NULL there). The list is made
    when the row is taken, while its dict is still in the CPU cache, and the dict is freed."""

    __slots__ = (
        "bounds",
        "checks",
        "columns",
        "count",
        "fast",
        "keep",
        "kinds",
        "rows",
        "sql_types",
        "table_kinds",
        "value_types",
    )

    def __init__(self, columns: DirectColumns, keep: bool = True) -> None:
        self.table_kinds = columns.kinds
        self.checks = columns.checks
        self.bounds = columns.bounds
        self.value_types = columns.types
        self.sql_types = columns.sql_types
        self.keep = keep
        self.kinds: dict[str, type] = {}
        """`table_kinds` of the columns in `columns`: a field not in it takes the slow path once."""
        self.columns: list[str] = []
        self.rows: list[list[Any]] = []
        self.count = 0
        # The fast path at C speed: when every value of a row takes it, the loop of `add` is
        # skipped (None: the speed-up is not built or turned off; the loop is the reference).
        self.fast: Any = None
        if _rows is not None:
            self.fast = _rows.RowScan(
                text_nul=True, is_timestamp=is_timestamp, zoned=_Zoned, utc=_Utc, bounded=_Bounded, bounds=self.bounds
            )

    def __len__(self) -> int:
        return self.count

    def add(self, values: dict[str, Any], casts: Mapping[str, str], seq: int = 0) -> str | None:
        """Takes the row (its dict may be changed), or returns why it does not fit, or `STAGE`
        when the table lacks one of its fields (a null adds no column: left out, as staging
        leaves it). Without `keep` (a split written already) such a field is passed over and the
        other values are checked still: a row whose value failed then must fail again."""
        fast = self.fast
        if fast is not None:
            if self.keep:
                # One C pass makes the row's list when every value takes the fast path.
                row = fast.take(values, self.kinds, self.columns)
                if row is not None:
                    self.rows.append(row)
                    self.count += 1
                    return None
            elif fast.passes(values, self.kinds):
                return None
        error = self._check_values(values)
        if error is not None:
            return error
        if self.keep:
            self.rows.append(list(map(values.get, self.columns)))
            self.count += 1
        return None

    def _check_values(self, values: dict[str, Any]) -> str | None:
        """Checks and normalises the row's values, or returns why one does not fit (or `STAGE`).
        The reference of the compiled fast path (`fast`), which passes a row only when this loop
        would pass over every value unchanged. `kinds` and `columns` change only here, so only
        after a row `fast` missed: its `take` relies on it."""
        kinds = self.kinds
        for name, value in values.items():
            # Fast path, most values: already of the column's kind (int: within bigint).
            kind = type(value)
            try:
                expect = kinds[name]
            except KeyError:
                expect = None
            if kind is expect:
                if kind is str:
                    if _NUL not in value:  # Postgres text cannot store U+0000: the check fails it
                        continue
                elif kind is not int or _INT64_MIN <= value <= _INT64_MAX:
                    continue
            elif (
                value is None
                or (expect is _Bounded and kind is float and -(bound := self.bounds[name]) < value < bound)
                or (
                    kind is str and (expect is _Zoned or (expect is _Utc and value[-1:] == "Z")) and is_timestamp(value)
                )
            ):
                continue
            if expect is None:
                found = self.table_kinds.get(name)
                if found is None:
                    if self.keep:
                        return STAGE
                    continue  # written already: the table had the column then
                kinds[name] = found  # a column's first value in this split
                self.columns.append(name)
            try:
                values[name] = self.checks[name](value)
            except ValueError as exc:
                return f"column {name!r}: {exc}"
        return None

    def take(self) -> DirectRows:
        """The kept rows (then empty)."""
        rows, self.rows = self.rows, []
        columns = list(self.columns)
        sql_types = [self.sql_types[name] for name in columns] if self.sql_types else None
        return DirectRows(columns, rows, [self.value_types[name] for name in columns], sql_types)

    def dicts(self) -> list[dict[str, Any]]:
        """The kept rows as the chain made them (less their nulls), for staging (then empty)."""
        columns = self.columns
        rows, self.rows = self.rows, []
        return [{name: value for name, value in zip(columns, row, strict=False) if value is not None} for row in rows]
