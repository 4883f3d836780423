"""What shared SQL code needs to know about a warehouse, as data.

Each destination package has a ``dialect.py`` exporting ``DIALECT``. Shared code branches on
the capability fields here, never on ``name``.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from eventspark.steps.typing import DataType, Field, parse_generic_type

DIALECT_NAMES = ("postgres", "redshift", "bigquery", "clickhouse", "snowflake", "mysql", "duckdb")

# Control characters are never part of a legitimate name, and NUL truncates names in C drivers.
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Dialect:
    """A warehouse's SQL conventions: column types, identifier quoting, string literals."""

    name: str
    """The destination type, as in config (``type: postgres``); for messages only."""
    types: Mapping[DataType, str]
    """The SQL column type for each DataType when the mapping gives no explicit type."""
    quote_char: str = '"'
    """The character that opens and closes a quoted identifier."""
    quote_escape: Literal["double", "backslash"] = "double"
    """How a quote character inside an identifier is escaped: doubled (SQL standard), or with
    a backslash where the warehouse reads identifiers like string literals (BigQuery, ClickHouse)."""
    string_escape: Literal["double", "backslash"] = "double"
    """How a quote inside a string literal is escaped: doubled (standard SQL strings), or with a
    backslash where backslashes are escapes in string literals (MySQL's default mode, ClickHouse)."""
    max_identifier_length: int | None = 63
    """Longest identifier (None: no limit), in `identifier_length_unit`. Longer names are refused
    by ``quote`` rather than silently truncated by the warehouse."""
    identifier_length_unit: Literal["bytes", "characters"] = "bytes"
    """What the limit counts: UTF-8 bytes (Postgres' NAMEDATALEN) or characters (MySQL)."""

    type_parser: Callable[[str], DataType | None] | None = None
    """SQL → DataType for this warehouse's catalog spelling (None: `data_type_of_sql`)."""
    stage_types: Mapping[DataType, str] = field(default_factory=dict)
    """The column type of each stage type in staging tables (empty: the stage is files)."""
    json_type: str = "json"
    """The column type of the generic mapping type ``json`` and of ``data_layout.unmapped_column``
    (docs/json-columns.md): values are JSON text, cast by the warehouse."""
    text_holds_nul: bool = True
    """Whether a text column stores U+0000 (Postgres's cannot: such a value fails its event)."""
    json_names: frozenset[str] = frozenset({"json"})
    """The JSON type names (lower case) a mapping may give this warehouse; the config check
    refuses the others (``jsonb`` on MySQL)."""

    def __post_init__(self) -> None:
        missing = [t.name for t in DataType if t not in self.types]
        if missing:
            raise ValueError(f"dialect {self.name}: no SQL type for {', '.join(missing)}")
        if len(self.quote_char) != 1:
            raise ValueError(f"dialect {self.name}: quote_char must be one character")
        object.__setattr__(self, "types", MappingProxyType(dict(self.types)))

    def data_type_of(self, sql_type: str) -> DataType | None:
        """SQL → DataType: the DataType whose values a column of `sql_type` takes; None for types
        eventspark does not check (json, uuid...), whose values the warehouse casts."""
        return (self.type_parser or data_type_of_sql)(sql_type)

    def column_type(self, field: Field) -> str:
        """The SQL type of a column: the mapping's explicit type (generic names translated), else
        the dialect's type for the field's DataType."""
        if field.sql_type:
            generic = parse_generic_type(field.sql_type)
            if generic is not None:
                return self.types[generic]
            return self.json_type if field.sql_type.lower() == "json" else field.sql_type
        return self.types[field.type]

    def quote(self, identifier: str) -> str:
        """``identifier`` as a quoted SQL identifier, quote characters escaped.

        Raises ValueError for an empty identifier, control characters (NUL included), text that
        is not valid Unicode, or longer than ``max_identifier_length``.
        """
        if not identifier:
            raise ValueError("an SQL identifier cannot be empty")
        if _CONTROL_CHARS.search(identifier):
            raise ValueError(f"SQL identifier {identifier!r} contains a control character")
        try:
            size = len(identifier.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ValueError(f"SQL identifier {identifier!r} is not valid Unicode") from exc
        unit = self.identifier_length_unit
        if unit == "characters":
            size = len(identifier)
        if self.max_identifier_length is not None and size > self.max_identifier_length:
            limit = self.max_identifier_length
            raise ValueError(f"SQL identifier {identifier!r} is {size} {unit}; {self.name} allows {limit}")
        q = self.quote_char
        if self.quote_escape == "backslash":
            escaped = identifier.replace("\\", "\\\\").replace(q, "\\" + q)
        else:
            escaped = identifier.replace(q, q + q)
        return f"{q}{escaped}{q}"

    def literal(self, text: str) -> str:
        """``text`` as an SQL string literal; ValueError for control characters (NUL included)."""
        if _CONTROL_CHARS.search(text):
            raise ValueError(f"SQL string {text!r} contains a control character")
        if self.string_escape == "backslash":
            return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
        return "'" + text.replace("'", "''") + "'"


# Column type → DataType by the type's first word(s); data, so new warehouses only add names.
_SQL_TYPE_FAMILIES: dict[str, DataType] = {
    **dict.fromkeys(["boolean", "bool", "uint8"], DataType.BOOL),
    **dict.fromkeys(
        ["bigint", "int8", "integer", "int", "int4", "smallint", "int2", "tinyint", "hugeint", "int64"],
        DataType.INT64,
    ),
    **dict.fromkeys(
        ["numeric", "decimal", "double", "double precision", "real", "float", "float4", "float8", "float64"],
        DataType.FLOAT64,
    ),
    **dict.fromkeys(
        ["timestamp", "timestamptz", "timestamp with time zone", "timestamp without time zone", "datetime"],
        DataType.TIMESTAMP,
    ),
    **dict.fromkeys(["text", "varchar", "character varying", "char", "character", "string", "bpchar"], DataType.STRING),
}
_TYPE_NAME = re.compile(r"^\s*([a-z][a-z0-9 ]*?)\s*(?:\(.*\))?\s*(with(?:out)? time zone)?\s*$")


def data_type_of_sql(sql_type: str) -> DataType | None:
    """`bigint` → INT64, `numeric(38,18)` → FLOAT64, `character varying(256)` → STRING, `jsonb` → None."""
    match = _TYPE_NAME.match(sql_type.lower())
    if match is None:
        return None
    name = match.group(1).strip()
    if match.group(2):
        name = f"{name} {match.group(2)}"
    return _SQL_TYPE_FAMILIES.get(name)


def get_dialect(name: str) -> Dialect:
    """The Dialect of a destination type; imports only that destination's dialect module."""
    if name not in DIALECT_NAMES:
        raise ValueError(f"unknown destination type {name!r}; known: {', '.join(DIALECT_NAMES)}")
    module = importlib.import_module(f"eventspark.destinations.{name}.dialect")
    dialect: Dialect = module.DIALECT
    return dialect
