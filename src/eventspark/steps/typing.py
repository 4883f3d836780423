"""Typing step: infer column types from flat rows, promote them, and coerce values.

Types form the promotion tree of ``pipeline-design.md``::

         STRING
         /    \\
    FLOAT64  TIMESTAMP
       |
     INT64
       |
      BOOL

When one column sees several types in a batch, it gets their lowest common ancestor.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson


class DataType(enum.IntEnum):
    """Column type before it is mapped to a destination's SQL type.

    Values match the ``DataType`` enum numbers of ``proto/pipeline.proto``.
    """

    BOOL = 1
    INT64 = 2
    FLOAT64 = 3
    TIMESTAMP = 4
    STRING = 5


# Parent of each node in the promotion tree; STRING is the root.
_PARENT: dict[DataType, DataType | None] = {
    DataType.BOOL: DataType.INT64,
    DataType.INT64: DataType.FLOAT64,
    DataType.FLOAT64: DataType.STRING,
    DataType.TIMESTAMP: DataType.STRING,
    DataType.STRING: None,
}


def ancestors(t: DataType) -> tuple[DataType, ...]:
    """``t`` and every type above it in the promotion tree, nearest first."""
    chain: list[DataType] = []
    node: DataType | None = t
    while node is not None:
        chain.append(node)
        node = _PARENT[node]
    return tuple(chain)


def _lowest_common_ancestor(a: DataType, b: DataType) -> DataType:
    above_b = set(ancestors(b))
    return next(t for t in ancestors(a) if t in above_b)


# Promotion runs once per field per row: a table lookup keeps it to one indexing.
_PROMOTE: dict[tuple[DataType, DataType], DataType] = {
    (a, b): _lowest_common_ancestor(a, b) for a in DataType for b in DataType
}


def promote(a: DataType, b: DataType) -> DataType:
    """The lowest common ancestor of ``a`` and ``b``: the type that holds values of both."""
    return _PROMOTE[a, b]


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

ALWAYS_TIMESTAMP = frozenset(
    {"_timestamp", "eventn_ctx_utc_time", "eventn_ctx_interval_start", "eventn_ctx_interval_end"}
)

_GENERIC_TYPES = {
    "string": DataType.STRING,
    "integer": DataType.INT64,
    "double": DataType.FLOAT64,
    "timestamp": DataType.TIMESTAMP,
    "boolean": DataType.BOOL,
}


def parse_generic_type(name: str) -> DataType | None:
    """The DataType for a generic mapping type name (``string integer double timestamp boolean``).

    Case-insensitive, so the design doc's implicit ``TIMESTAMP`` cast is generic too. Any other
    name is a literal SQL type of the destination and gives None.
    """
    return _GENERIC_TYPES.get(name.strip().lower())


# RFC 3339 as Go's time.RFC3339Nano parses it: 'T' separator, 1-9 fraction digits, 'Z' or ±hh:mm.
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)", re.ASCII)


def parse_timestamp(s: str) -> datetime | None:
    """Parse an RFC 3339 timestamp into an aware datetime in UTC; None when ``s`` is not one.

    A cheap positional check runs first because most strings in events are not timestamps.
    Fractions beyond microseconds are truncated (datetime's resolution).
    """
    if len(s) < 20 or len(s) > 35 or s[10] != "T" or s[4] != "-" or s[13] != ":":
        return None
    if _RFC3339.fullmatch(s) is None:
        return None
    try:
        return datetime.fromisoformat(s).astimezone(UTC)
    except (ValueError, OverflowError):  # the right shape but out of range: month 13, year 0
        return None


def is_timestamp(s: str) -> bool:
    """Whether `parse_timestamp` accepts ``s``, at about two thirds of its cost: the check of the
    values of a TIMESTAMP column, which keep their text (no datetime is made for them)."""
    if _RFC3339.fullmatch(s) is None:  # the exact shape (its length included)
        return False
    try:
        parsed = datetime.fromisoformat(s)
    except (ValueError, OverflowError):  # month 13, year 0
        return False
    if 1 < parsed.year < 9999:  # only the first and last years can leave datetime's range in UTC
        return True
    try:
        parsed.astimezone(UTC)
    except OverflowError:
        return False
    return True


def infer_type(value: object) -> DataType:
    """The DataType of one JSON value (already flattened: arrays are JSON strings by now).

    bool is checked before int because bool is an int subclass in Python. A float is FLOAT64
    even when integral (``10.0``), as in the JSON it came from; an integer beyond int64 is
    FLOAT64 too, as no warehouse's bigint holds it.
    """
    kind = type(value)
    if kind is str:
        return DataType.TIMESTAMP if parse_timestamp(value) is not None else DataType.STRING  # type: ignore[arg-type]
    if kind is int:
        return DataType.INT64 if _INT64_MIN <= value <= _INT64_MAX else DataType.FLOAT64  # type: ignore[operator]
    known = _TYPE_OF_KIND.get(kind)
    if known is not None:
        return known
    if isinstance(value, bool):
        return DataType.BOOL
    if isinstance(value, int):
        return DataType.INT64 if _INT64_MIN <= value <= _INT64_MAX else DataType.FLOAT64
    if isinstance(value, float | Decimal):
        return DataType.FLOAT64
    if isinstance(value, date):  # datetime included; constants from YAML config may be dates
        return DataType.TIMESTAMP
    return DataType.STRING


# Module names for the members used on the hot path: a global lookup is cheaper than an enum attribute.
_STRING = DataType.STRING
_TIMESTAMP = DataType.TIMESTAMP
_INT64 = DataType.INT64
# Indexed by DataType: the value classes that a column of that type holds without promotion
# whatever its casts. Not int for INT64 (an int beyond int64 promotes it to FLOAT64), nothing
# for TIMESTAMP (a string must parse), and STRING is never looked up (it holds everything).
_HOLDS_AS_IS: tuple[frozenset[type], ...] = (
    frozenset(),  # no DataType 0
    frozenset({bool}),  # BOOL
    frozenset({bool}),  # INT64
    frozenset({bool, int, float, Decimal}),  # FLOAT64
    frozenset(),  # TIMESTAMP
    frozenset(),  # STRING
)
_TYPE_OF_KIND: dict[type, DataType] = {
    bool: DataType.BOOL,
    float: DataType.FLOAT64,
    Decimal: DataType.FLOAT64,
    datetime: DataType.TIMESTAMP,
}


@dataclass(slots=True)
class Field:
    """One column of a batch: its promoted type and, when the mapping cast it, the literal SQL type."""

    type: DataType
    sql_type: str | None = None


@dataclass(slots=True)
class BatchHeader:
    """The columns seen in a batch for one table, each with its promoted type.

    Change ``fields`` by hand only by adding fields or promoting types, as ``add_row`` and
    ``merge`` do: ``add_row`` remembers which fields are not STRING until their number changes,
    so a field deleted and another added, or a STRING field made narrower, would go unseen.
    """

    table_name: str
    fields: dict[str, Field] = field(default_factory=dict)
    # add_row's memo (_typed_names): the fields that were not STRING when there were _typed_size.
    _typed: list[str] = field(default_factory=list, init=False, repr=False, compare=False)
    _typed_size: int = field(default=-1, init=False, repr=False, compare=False)

    def merge(self, other: BatchHeader) -> None:
        """Add ``other``'s fields: new names are added, known names promoted.

        An explicit sql_type, once set, is kept (the first one wins if two differ).
        """
        mine = self.fields
        for name, theirs in other.fields.items():
            current = mine.get(name)
            if current is None:
                mine[name] = Field(theirs.type, theirs.sql_type)
                continue
            if current.type is not theirs.type:
                current.type = _PROMOTE[current.type, theirs.type]
            if current.sql_type is None and theirs.sql_type is not None:
                current.sql_type = theirs.sql_type

    def add_row(self, row: Mapping[str, object], casts: Mapping[str, str]) -> None:
        """Merge one flattened row into this header, as ``merge(header_for(...))`` would.

        The batch hot path. Once a table's columns are known most rows bring no new one, and
        most columns are STRING, which nothing can promote: such a row costs a subset check (in
        C) and a look at its values of the other columns only.
        """
        fields = self.fields
        if len(row) <= len(fields) and row.keys() <= fields.keys():  # no new column
            typed = self._typed if self._typed_size == len(fields) else self._typed_names()
            if len(typed) < len(row):
                self._promote_typed(row, typed, casts)
                return
        for name, value in row.items():
            current = fields.get(name)
            if current is None:
                if value is not None:
                    fields[name] = _new_field(name, value, casts)
                continue
            known = current.type
            if known is _STRING or value is None:  # STRING is the root: nothing promotes it
                continue
            kind = value.__class__
            # Inline, the values that leave the type as it is (most of them): no call.
            if kind in _HOLDS_AS_IS[known] or (
                kind is int and known is _INT64 and _INT64_MIN <= value <= _INT64_MAX  # type: ignore[operator]
            ):
                continue
            _promote_field(current, name, value, casts)

    def _promote_typed(self, row: Mapping[str, object], typed: list[str], casts: Mapping[str, str]) -> None:
        """``add_row`` for a row with no new column: only the ``typed`` columns can change."""
        fields = self.fields
        for name in typed:
            value = row.get(name)
            if value is None:
                continue
            current = fields[name]
            known = current.type
            kind = value.__class__
            # The same inline test as in add_row, and STRING (promoted since _typed_names ran).
            if (
                known is _STRING
                or kind in _HOLDS_AS_IS[known]
                or (kind is int and known is _INT64 and _INT64_MIN <= value <= _INT64_MAX)  # type: ignore[operator]
            ):
                continue
            _promote_field(current, name, value, casts)

    def _typed_names(self) -> list[str]:
        """The names of the fields that are not STRING, remembered until the number of fields changes.

        A STRING field stays STRING (the root of the promotion tree), so a row with no new
        column needs looking at only these.
        """
        self._typed = [name for name, f in self.fields.items() if f.type is not _STRING]
        self._typed_size = len(self.fields)
        return self._typed

    def to_dict(self) -> dict[str, Any]:
        """The proto3 JSON form of ``eventspark.pipeline.BatchHeader`` (proto field names)."""
        fields: dict[str, Any] = {}
        for name, f in self.fields.items():
            entry: dict[str, str] = {"type": f.type.name}
            if f.sql_type:
                entry["sql_type"] = f.sql_type
            fields[name] = entry
        return {"table_name": self.table_name, "fields": fields}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchHeader:
        """Read the proto3 JSON form (proto or lowerCamel field names); ValueError when malformed."""
        table = data.get("table_name", data.get("tableName", ""))
        raw_fields = data.get("fields", {})
        if not isinstance(table, str) or not isinstance(raw_fields, Mapping):
            raise ValueError("BatchHeader needs a string table_name and an object of fields")
        fields: dict[str, Field] = {}
        for name, entry in raw_fields.items():
            type_name = entry.get("type") if isinstance(entry, Mapping) else None
            if type_name not in DataType.__members__:
                raise ValueError(f"field {name!r}: unknown type {type_name!r}")
            sql_type = entry.get("sql_type", entry.get("sqlType")) or None
            fields[name] = Field(DataType[type_name], sql_type)
        return cls(table, fields)


def header_for(table_name: str, row: Mapping[str, object], casts: Mapping[str, str]) -> BatchHeader:
    """The BatchHeader of one flattened row.

    Precedence per column: an explicit cast (a generic name sets the type; a literal SQL type is
    kept as sql_type beside the inferred type), then ALWAYS_TIMESTAMP, then the value's type.
    For a whole batch, ``BatchHeader.add_row`` on one running header gives the same result as
    merging ``header_for`` of every row, several times faster.
    """
    header = BatchHeader(table_name)
    header.add_row(row, casts)
    return header


def field_for(name: str, value: object, casts: Mapping[str, str]) -> tuple[Field, bool]:
    """The Field of a column first seen holding ``value``, and whether its type is fixed.

    A fixed type comes from the column's name (a generic cast, ALWAYS_TIMESTAMP), so later
    values never promote it; other fields promote with every value they meet.
    """
    return _new_field(name, value, casts), _is_fixed(name, casts)


def _new_field(name: str, value: object, casts: Mapping[str, str]) -> Field:
    cast = casts.get(name)
    if cast is not None:
        generic = _generic_cast(cast)
        return Field(generic) if generic is not None else Field(infer_type(value), cast)
    if name in ALWAYS_TIMESTAMP:
        return Field(DataType.TIMESTAMP)
    return Field(infer_type(value))


def _is_fixed(name: str, casts: Mapping[str, str]) -> bool:
    """True when the column's type comes from its name, not its values (a generic cast, _timestamp)."""
    cast = casts.get(name)
    if cast is not None:
        return _generic_cast(cast) is not None
    return name in ALWAYS_TIMESTAMP


_generic_casts: dict[str, DataType | None] = {}


def _generic_cast(cast: str) -> DataType | None:
    # Casts come from config: a handful of distinct strings, looked up on every row.
    try:
        return _generic_casts[cast]
    except KeyError:
        generic = _generic_casts[cast] = parse_generic_type(cast)
        if len(_generic_casts) > 1024:
            _generic_casts.clear()
        return generic


def _promote_field(current: Field, name: str, value: object, casts: Mapping[str, str]) -> None:
    """Promote a known field for one more value; the cheap cases first."""
    known = current.type
    kind = type(value)
    if known is _TIMESTAMP:
        if _is_fixed(name, casts) or (kind is str and is_timestamp(value)):  # type: ignore[arg-type]
            return
        current.type = _STRING  # TIMESTAMP meets anything else at the root
        return
    # BOOL, INT64 or FLOAT64: a string promotes to STRING whether or not it is a timestamp
    seen = _STRING if kind is str else _TYPE_OF_KIND.get(kind) or infer_type(value)
    if seen is not known and not _is_fixed(name, casts):
        current.type = _PROMOTE[known, seen]


# JSON-style numeric literals only: Python's int()/float() would also take "1_000", " 12 ", "nan",
# "infinity" and non-ASCII digits, none of which a warehouse would read the same way.
_INTEGER_LITERAL = re.compile(r"[+-]?\d{1,20}", re.ASCII)
_NUMBER_LITERAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d{1,4})?", re.ASCII)
_TRUE_STRINGS = frozenset({"true", "1"})
_FALSE_STRINGS = frozenset({"false", "0"})


def _does_not_fit(value: object, to: DataType) -> ValueError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ValueError(f"value {shown} does not fit a {to.name} column")


def _to_string(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return format_timestamp(value)
    if isinstance(value, int | float | Decimal | date):
        return str(value)
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError as exc:
        raise _does_not_fit(value, DataType.STRING) from exc


def _to_int(value: object) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        number: int | float | Decimal = value
    elif isinstance(value, float | Decimal):
        number = value
    elif isinstance(value, str) and _INTEGER_LITERAL.fullmatch(value):
        number = int(value)
    elif isinstance(value, str) and len(value) <= 64 and _NUMBER_LITERAL.fullmatch(value):
        number = Decimal(value)  # "10.0" or "1e3": fits when integral, like the float 10.0
    else:
        raise _does_not_fit(value, DataType.INT64)
    if isinstance(number, float | Decimal) and not (math.isfinite(number) and number == int(number)):
        raise _does_not_fit(value, DataType.INT64)
    result = int(number)
    if not _INT64_MIN <= result <= _INT64_MAX:
        raise _does_not_fit(value, DataType.INT64)
    return result


def _to_float(value: object) -> float:
    if isinstance(value, str):
        if len(value) > 64 or not _NUMBER_LITERAL.fullmatch(value):
            raise _does_not_fit(value, DataType.FLOAT64)
    elif not isinstance(value, int | float | Decimal):  # bool is an int: True → 1.0
        raise _does_not_fit(value, DataType.FLOAT64)
    try:
        result = float(value)
    except (OverflowError, InvalidOperation) as exc:
        raise _does_not_fit(value, DataType.FLOAT64) from exc
    if not math.isfinite(result):  # numeric(38,18) and JSON have no NaN or infinity
        raise _does_not_fit(value, DataType.FLOAT64)
    return result


def _to_timestamp(value: object) -> datetime:
    if isinstance(value, str):
        parsed = parse_timestamp(value)
        if parsed is None:
            raise _does_not_fit(value, DataType.TIMESTAMP)
        return parsed
    if isinstance(value, datetime):  # naive datetimes are taken as UTC, like _timestamp itself
        try:
            return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        except OverflowError as exc:  # an offset that pushes year 1 or 9999 out of range
            raise _does_not_fit(value, DataType.TIMESTAMP) from exc
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    # Numbers are not read as epoch times: seconds or milliseconds would be a guess.
    raise _does_not_fit(value, DataType.TIMESTAMP)


def _to_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.lower()
        if lowered in _TRUE_STRINGS:
            return True
        if lowered in _FALSE_STRINGS:
            return False
    raise _does_not_fit(value, DataType.BOOL)


_COERCERS = {
    DataType.STRING: _to_string,
    DataType.INT64: _to_int,
    DataType.FLOAT64: _to_float,
    DataType.TIMESTAMP: _to_timestamp,
    DataType.BOOL: _to_bool,
}


def coerce(value: object, to: DataType) -> object:
    """Convert ``value`` to the Python value a column of type ``to`` takes.

    STRING → str (numbers as Python prints them, bools as ``true``/``false``, datetimes as
    RFC 3339 UTC), INT64 → int (integral numbers and integer strings within int64), FLOAT64 →
    float (finite), TIMESTAMP → aware datetime in UTC (RFC 3339 strings, datetimes, dates),
    BOOL → bool (also 0/1 and "true"/"false"/"1"/"0"). None stays None (a NULL).

    Raises ValueError naming the value and the type when it does not fit, so the caller can
    send the event to ``failed`` with that message.
    """
    if value is None:
        return None
    return _COERCERS[to](value)


def format_timestamp(value: datetime) -> str:
    """RFC 3339 in UTC with microseconds, the format of ``_timestamp`` (``...T15:04:05.000000Z``)."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    # isoformat, unlike strftime's %Y, always writes four-digit years.
    return value.isoformat(timespec="microseconds") + "Z"
