"""What shared SQL code needs to know about a warehouse, as data.

Each destination package has a ``dialect.py`` exporting ``DIALECT``. Shared code branches on
the capability fields here, never on ``name``.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
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
    max_identifier_length: int | None = 63
    """Longest identifier in UTF-8 bytes (None: no limit). Longer names are refused by ``quote``
    rather than silently truncated by the warehouse."""

    def __post_init__(self) -> None:
        missing = [t.name for t in DataType if t not in self.types]
        if missing:
            raise ValueError(f"dialect {self.name}: no SQL type for {', '.join(missing)}")
        if len(self.quote_char) != 1:
            raise ValueError(f"dialect {self.name}: quote_char must be one character")
        object.__setattr__(self, "types", MappingProxyType(dict(self.types)))

    def column_type(self, field: Field) -> str:
        """The SQL type of a column: the mapping's explicit type (generic names translated), else
        the dialect's type for the field's DataType."""
        if field.sql_type:
            generic = parse_generic_type(field.sql_type)
            return self.types[generic] if generic is not None else field.sql_type
        return self.types[field.type]

    def quote(self, identifier: str) -> str:
        """``identifier`` as a quoted SQL identifier, quote characters escaped.

        Raises ValueError for an empty identifier, control characters (NUL included), text that
        is not valid Unicode, or more bytes than ``max_identifier_length``.
        """
        if not identifier:
            raise ValueError("an SQL identifier cannot be empty")
        if _CONTROL_CHARS.search(identifier):
            raise ValueError(f"SQL identifier {identifier!r} contains a control character")
        try:
            size = len(identifier.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ValueError(f"SQL identifier {identifier!r} is not valid Unicode") from exc
        if self.max_identifier_length is not None and size > self.max_identifier_length:
            limit = self.max_identifier_length
            raise ValueError(f"SQL identifier {identifier!r} is {size} bytes; {self.name} allows {limit}")
        q = self.quote_char
        if self.quote_escape == "backslash":
            escaped = identifier.replace("\\", "\\\\").replace(q, "\\" + q)
        else:
            escaped = identifier.replace(q, q + q)
        return f"{q}{escaped}{q}"


def get_dialect(name: str) -> Dialect:
    """The Dialect of a destination type; imports only that destination's dialect module."""
    if name not in DIALECT_NAMES:
        raise ValueError(f"unknown destination type {name!r}; known: {', '.join(DIALECT_NAMES)}")
    module = importlib.import_module(f"eventspark.destinations.{name}.dialect")
    dialect: Dialect = module.DIALECT
    return dialect
