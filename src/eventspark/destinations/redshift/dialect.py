"""Amazon Redshift SQL conventions: Postgres-like, with varchar strings and 127-byte names."""

from eventspark.destinations.dialect import Dialect
from eventspark.steps.typing import DataType

DIALECT = Dialect(
    name="redshift",
    types={
        DataType.BOOL: "boolean",
        DataType.INT64: "bigint",
        DataType.FLOAT64: "numeric(38,18)",
        DataType.STRING: "character varying(65535)",  # Redshift's text is only varchar(256)
        DataType.TIMESTAMP: "timestamp",
    },
    max_identifier_length=127,
)
