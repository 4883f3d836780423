"""Snowflake SQL conventions: types as in EventNative's table, ``"`` quoting, 255-character names.

Snowflake folds unquoted identifiers to upper case. EventNative 1.41 wrote a name unquoted when it
was a valid unquoted identifier (ASCII letters, digits, ``_`` and ``$``, not starting with a digit),
so `eventn_ctx_event_id` became the column ``EVENTN_CTX_EVENT_ID``, and quoted as written otherwise
(``"ünï_col"``, ``"2nd"``); it read names back lower-cased. eventspark follows the same rule
(`stored_name`) and always quotes the result, so that reserved words work too:

    eventn_ctx_event_id → "EVENTN_CTX_EVENT_ID"     ünï_col → "ünï_col"

and reads catalog names back with `logical_name` (upper-case plain identifiers lower-cased). A
table or column EventNative created for the same events is the same table or column.

`DIALECT` is the registry's (it checks which table names events may use, and quotes names as
given); `NAMES` is the one the warehouse writes SQL with, applying the rule above.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from eventspark.destinations.dialect import Dialect
from eventspark.steps.typing import DataType

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_PLAIN_STORED = re.compile(r"[A-Z_][A-Z0-9_$]*")


def stored_name(name: str) -> str:
    """The name Snowflake stores for eventspark's (and EventNative's) `name`."""
    return name.upper() if _PLAIN.fullmatch(name) else name


def logical_name(stored: str) -> str:
    """The eventspark name of a stored table or column name (the inverse of `stored_name`)."""
    return stored.lower() if _PLAIN_STORED.fullmatch(stored) else stored


# Catalog type (information_schema.columns DATA_TYPE, or DESCRIBE's spelling) → DataType.
_FAMILIES: dict[str, DataType] = {
    **dict.fromkeys(["BOOLEAN"], DataType.BOOL),
    **dict.fromkeys(["BIGINT", "INT", "INTEGER", "SMALLINT", "TINYINT", "BYTEINT"], DataType.INT64),
    **dict.fromkeys(["FLOAT", "FLOAT4", "FLOAT8", "DOUBLE", "DOUBLE PRECISION", "REAL"], DataType.FLOAT64),
    **dict.fromkeys(["TEXT", "VARCHAR", "STRING", "CHAR", "CHARACTER", "NCHAR", "NVARCHAR"], DataType.STRING),
    **dict.fromkeys(
        ["TIMESTAMP", "TIMESTAMP_NTZ", "TIMESTAMP_LTZ", "TIMESTAMP_TZ", "DATETIME", "TIMESTAMPNTZ"],
        DataType.TIMESTAMP,
    ),
}
_TYPE = re.compile(r"^\s*([A-Z_][A-Z0-9_ ]*?)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?\s*$")


def data_type_of_snowflake(sql_type: str) -> DataType | None:
    """`NUMBER(38,0)` → INT64, `NUMBER(38,18)` → FLOAT64, `VARCHAR(16777216)` → STRING,
    `TIMESTAMP_NTZ(6)` → TIMESTAMP, `VARIANT` → None. NUMBER and its aliases (DECIMAL, NUMERIC)
    hold integers at scale 0 (`bigint` is `NUMBER(38,0)` in Snowflake)."""
    match = _TYPE.match(sql_type.upper())
    if match is None:
        return None
    name, _precision, scale = match.groups()
    if name in ("NUMBER", "DECIMAL", "NUMERIC"):
        return DataType.INT64 if scale in (None, "0") else DataType.FLOAT64
    return _FAMILIES.get(name)


DIALECT = Dialect(
    name="snowflake",
    types={
        DataType.BOOL: "boolean",
        DataType.INT64: "bigint",
        DataType.FLOAT64: "numeric(38,18)",
        DataType.STRING: "text",
        DataType.TIMESTAMP: "timestamp(6)",
    },
    max_identifier_length=255,
    identifier_length_unit="characters",
    type_parser=data_type_of_snowflake,
    json_type="VARIANT",  # docs/json-columns.md
    json_names=frozenset({"json", "variant", "object", "array"}),
)


@dataclass(frozen=True)
class SnowflakeNames(Dialect):
    """The dialect the warehouse writes SQL with: `quote` quotes the stored form of a name."""

    def quote(self, identifier: str) -> str:
        return super().quote(stored_name(identifier))


NAMES = SnowflakeNames(
    name=DIALECT.name,
    types=DIALECT.types,
    max_identifier_length=DIALECT.max_identifier_length,
    identifier_length_unit=DIALECT.identifier_length_unit,
    type_parser=DIALECT.type_parser,
)
