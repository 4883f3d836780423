"""Snowflake SQL conventions: ``"`` quoting keeps eventspark's lower-case names exactly as written."""

from eventspark.destinations.dialect import Dialect
from eventspark.steps.typing import DataType

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
)
