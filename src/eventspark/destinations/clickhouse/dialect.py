"""ClickHouse SQL conventions: backtick identifiers, where a backslash escapes as in string literals."""

from eventspark.destinations.dialect import Dialect
from eventspark.steps.typing import DataType

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
    # No limit on names in SQL, but a table is a directory on disk, and file names stop at 255 bytes.
    max_identifier_length=255,
)
