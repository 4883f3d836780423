"""ClickHouse SQL conventions: backtick identifiers, where a backslash escapes as in string
literals; type mapping both ways (DataType → SQL, catalog spelling → DataType, through Nullable
and LowCardinality) and the staging tables' types."""

from __future__ import annotations

import re

from eventspark.destinations.dialect import Dialect, data_type_of_sql
from eventspark.steps.typing import DataType

_NULLABLE = re.compile(r"^\s*Nullable\s*\((.*)\)\s*$", re.DOTALL)


def base_type(sql_type: str) -> tuple[str, bool]:
    """(the type inside `Nullable(...)`, whether it was nullable)."""
    match = _NULLABLE.match(sql_type)
    return (match.group(1).strip(), True) if match else (sql_type.strip(), False)


_FAMILIES: dict[str, DataType] = {
    **dict.fromkeys(["uint8", "bool", "boolean"], DataType.BOOL),
    **dict.fromkeys(["int8", "int16", "int32", "int64", "uint16", "uint32", "uint64"], DataType.INT64),
    **dict.fromkeys(["float32", "float64", "decimal", "decimal32", "decimal64", "decimal128"], DataType.FLOAT64),
    **dict.fromkeys(["string", "fixedstring"], DataType.STRING),
    **dict.fromkeys(["datetime", "datetime64"], DataType.TIMESTAMP),
}


def data_type_of(sql_type: str) -> DataType | None:
    """The DataType of a ClickHouse column type, looking through Nullable and LowCardinality."""
    inner = sql_type.strip()
    while True:
        stripped, _nullable = base_type(inner)
        if stripped.startswith("LowCardinality(") and stripped.endswith(")"):
            stripped = stripped[len("LowCardinality(") : -1].strip()
        if stripped == inner:
            break
        inner = stripped
    family = inner.split("(", 1)[0].strip().lower()
    found = _FAMILIES.get(family)
    return found if found is not None else data_type_of_sql(inner)


DIALECT = Dialect(
    name="clickhouse",
    types={
        DataType.BOOL: "UInt8",
        DataType.INT64: "Int64",
        DataType.FLOAT64: "Float64",
        DataType.STRING: "String",
        DataType.TIMESTAMP: "DateTime",
    },
    quote_char="`",
    string_escape="backslash",
    quote_escape="backslash",
    json_type="String",  # docs/json-columns.md
    stage_types={  # timestamps are RFC 3339 text, parsed at commit
        DataType.BOOL: "Nullable(UInt8)",
        DataType.INT64: "Nullable(Int64)",
        DataType.FLOAT64: "Nullable(Float64)",
        DataType.TIMESTAMP: "Nullable(String)",
        DataType.STRING: "Nullable(String)",
    },
    type_parser=data_type_of,
    # No limit on names in SQL, but a table is a directory on disk, and file names stop at 255 bytes.
    max_identifier_length=255,
)

quote = DIALECT.quote
STAGE_TYPES = DIALECT.stage_types
