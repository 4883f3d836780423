"""Google BigQuery SQL conventions: backtick identifiers with string-literal (backslash) escapes.

Column types are the names of EventNative's table, which are also what BigQuery's API reports in a
table's schema (INTEGER, FLOAT, BOOLEAN); SQL text (DDL and CASTs) uses GoogleSQL's names
(`sql_type`), and the catalog's spellings, old and new, read back through `data_type_of_bigquery`.
"""

from __future__ import annotations

import re

from eventspark.destinations.dialect import Dialect, data_type_of_sql
from eventspark.steps.typing import DataType

# API (legacy SQL) name → GoogleSQL name, for types whose names differ.
_GOOGLE_SQL = {"INTEGER": "INT64", "FLOAT": "FLOAT64", "BOOLEAN": "BOOL"}
# GoogleSQL name → the API's name, for schema fields.
_API_NAMES = {v: k for k, v in _GOOGLE_SQL.items()} | {"DECIMAL": "NUMERIC", "BIGDECIMAL": "BIGNUMERIC"}
_NAME = re.compile(r"^\s*([A-Za-z0-9_]+)\s*(.*)$", re.DOTALL)


def sql_type(column_type: str) -> str:
    """`column_type` as GoogleSQL spells it in DDL and CAST: INTEGER → INT64, FLOAT → FLOAT64,
    BOOLEAN → BOOL; anything else (STRING, TIMESTAMP, NUMERIC(10,2), a mapping's JSON) unchanged."""
    match = _NAME.match(column_type)
    if match is None:
        return column_type
    name, rest = match.groups()
    return _GOOGLE_SQL.get(name.upper(), name) + rest


def field_type(column_type: str) -> str:
    """The API's `SchemaField.field_type` of a column type (its first word, API spelling)."""
    match = _NAME.match(column_type)
    name = match.group(1).upper() if match else column_type.upper()
    return _API_NAMES.get(name, name)


def data_type_of_bigquery(column_type: str) -> DataType | None:
    """INTEGER/INT64, FLOAT/FLOAT64/NUMERIC/BIGNUMERIC, BOOLEAN/BOOL, STRING, TIMESTAMP (and
    DATETIME) → their DataTypes; DATE, JSON, BYTES, RECORD, GEOGRAPHY... → None."""
    if field_type(column_type) == "BIGNUMERIC":
        return DataType.FLOAT64
    return data_type_of_sql(column_type)


DIALECT = Dialect(
    name="bigquery",
    types={
        DataType.BOOL: "BOOLEAN",
        DataType.INT64: "INTEGER",
        DataType.FLOAT64: "FLOAT",
        DataType.STRING: "STRING",
        DataType.TIMESTAMP: "TIMESTAMP",
    },
    quote_char="`",
    string_escape="backslash",
    quote_escape="backslash",  # "quoted identifiers have the same escape sequences as string literals"
    max_identifier_length=300,  # column names; table names may be longer
    type_parser=data_type_of_bigquery,
)

STAGE_FIELD_TYPES: dict[DataType, str] = {
    DataType.BOOL: "BOOLEAN",
    DataType.INT64: "INTEGER",
    DataType.FLOAT64: "FLOAT",
    DataType.STRING: "STRING",
    DataType.TIMESTAMP: "STRING",  # RFC 3339 text, cast at commit (keeps each value's offset)
}
"""The schema field type of each stage type in the staging tables that load jobs fill from the
staged newline-delimited JSON files."""
