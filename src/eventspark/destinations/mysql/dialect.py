"""MySQL SQL conventions: backtick identifiers (doubled to escape), 64-character names."""

from eventspark.destinations.dialect import Dialect
from eventspark.steps.typing import DataType

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
    max_identifier_length=64,
)
