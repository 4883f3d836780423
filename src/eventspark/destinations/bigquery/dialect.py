"""Google BigQuery SQL conventions: backtick identifiers with string-literal (backslash) escapes."""

from eventspark.destinations.dialect import Dialect
from eventspark.steps.typing import DataType

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
)
