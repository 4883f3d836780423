"""PostgreSQL SQL conventions: types as in EventNative's table, ``"`` quoting, 63-byte names."""

from eventspark.destinations.dialect import Dialect
from eventspark.steps.typing import DataType

DIALECT = Dialect(
    name="postgres",
    types={
        DataType.BOOL: "boolean",
        DataType.INT64: "bigint",
        DataType.FLOAT64: "numeric(38,18)",
        DataType.STRING: "text",
        DataType.TIMESTAMP: "timestamp",
    },
    stage_types={  # binary COPY types of staging tables; timestamps are RFC 3339 text, cast at commit
        DataType.BOOL: "boolean",
        DataType.INT64: "bigint",
        DataType.FLOAT64: "float8",
        DataType.TIMESTAMP: "text",
        DataType.STRING: "text",
    },
    json_names=frozenset({"json", "jsonb"}),  # docs/json-columns.md
    text_holds_nul=False,  # a text value cannot hold U+0000
    max_identifier_length=63,  # NAMEDATALEN - 1; longer names are truncated silently by the server
)

STAGE_TYPES = DIALECT.stage_types
