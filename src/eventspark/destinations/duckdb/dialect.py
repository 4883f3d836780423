"""DuckDB SQL conventions (not in EventNative's table; choices explained below)."""

from eventspark.destinations.dialect import Dialect
from eventspark.steps.typing import DataType

DIALECT = Dialect(
    name="duckdb",
    types={
        DataType.BOOL: "BOOLEAN",
        DataType.INT64: "BIGINT",
        # DOUBLE, not DECIMAL(38,18): DuckDB's DECIMAL(38,18) holds only 20 integer digits, while
        # every JSON number (a double) fits a DOUBLE; analytics on DuckDB expect floating point.
        DataType.FLOAT64: "DOUBLE",
        DataType.STRING: "VARCHAR",
        # TIMESTAMPTZ: event times are instants in UTC; a plain TIMESTAMP would read aware Python
        # datetimes through the session time zone.
        DataType.TIMESTAMP: "TIMESTAMPTZ",
    },
    max_identifier_length=None,  # DuckDB sets no limit
)

ARROW_STAGE_TYPES: dict[DataType, str] = {
    DataType.BOOL: "bool_",
    DataType.INT64: "int64",
    DataType.FLOAT64: "float64",
    DataType.TIMESTAMP: "string",  # RFC 3339 text, cast at commit
    DataType.STRING: "string",
}
"""The pyarrow type (by its factory's name) of each stage type in the Parquet chunks."""
