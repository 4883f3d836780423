"""MySQL SQL conventions: backtick identifiers (doubled to escape), 64-character names; type
mapping both ways (DataType → SQL, catalog spelling → DataType) and the staging tables' types."""

from __future__ import annotations

import re

from eventspark.destinations.dialect import Dialect
from eventspark.steps.typing import DataType

KEY_TEXT_TYPE = "VARCHAR(255)"
"""Key columns cannot be TEXT in MySQL (no index without a prefix length): text keys get this."""
TABLE_OPTIONS = "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={}"
"""utf8mb4 for any text; a binary collation so that keys compare as eventspark compares them."""
EXACT_COLLATIONS = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin", "utf8mb4_bin")
"""Binary collations, best first: MariaDB's and MySQL 8's do not ignore trailing spaces."""

_TYPE = re.compile(r"^\s*([a-z ]+?)\s*(?:\((\d+)(?:\s*,\s*\d+)?\))?(?:\s+(?:unsigned|signed|zerofill))*\s*$")
_FAMILIES: dict[str, DataType] = {
    **dict.fromkeys(["boolean", "bool"], DataType.BOOL),
    **dict.fromkeys(["bigint", "int", "integer", "mediumint", "smallint", "tinyint", "year"], DataType.INT64),
    **dict.fromkeys(["decimal", "numeric", "double", "double precision", "float", "real"], DataType.FLOAT64),
    **dict.fromkeys(
        ["text", "tinytext", "mediumtext", "longtext", "varchar", "char", "character varying"], DataType.STRING
    ),
    **dict.fromkeys(["datetime", "timestamp"], DataType.TIMESTAMP),
}
TEXT_FAMILIES = frozenset({"text", "tinytext", "mediumtext", "longtext"})


def type_family(sql_type: str) -> tuple[str, int | None]:
    """(`bigint`, 20) for `bigint(20) unsigned`; ('', None) for what does not parse."""
    match = _TYPE.match(sql_type.lower())
    if match is None:
        return "", None
    return match.group(1), int(match.group(2)) if match.group(2) else None


def data_type_of(sql_type: str) -> DataType | None:
    """The DataType of a MySQL column type; `tinyint(1)` is how BOOLEAN reads back."""
    family, size = type_family(sql_type)
    if family == "tinyint" and size == 1:
        return DataType.BOOL
    return _FAMILIES.get(family)


def key_column_type(sql_type: str) -> str:
    """The type a key column needs: VARCHAR(255) instead of a TEXT type."""
    return KEY_TEXT_TYPE if type_family(sql_type)[0] in TEXT_FAMILIES else sql_type


DIALECT = Dialect(
    name="mysql",
    types={
        DataType.BOOL: "BOOLEAN",
        DataType.INT64: "BIGINT",
        DataType.FLOAT64: "DECIMAL(38,18)",
        DataType.STRING: "TEXT",
        DataType.TIMESTAMP: "DATETIME",  # as EventNative: whole seconds (DATETIME(6) would keep microseconds)
    },
    quote_char="`",
    string_escape="backslash",
    stage_types={
        DataType.BOOL: "BOOLEAN",
        DataType.INT64: "BIGINT",
        DataType.FLOAT64: "DOUBLE",
        DataType.STRING: "LONGTEXT",
        DataType.TIMESTAMP: "DATETIME(6)",
    },
    type_parser=data_type_of,
    max_identifier_length=64,
    identifier_length_unit="characters",
)

quote = DIALECT.quote
STAGE_TYPES = DIALECT.stage_types
