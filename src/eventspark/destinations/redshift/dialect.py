"""Amazon Redshift SQL conventions: Postgres-like, with varchar strings and 127-byte names.

String literals: Redshift reads a backslash in a literal as an escape character, PostgreSQL (with
`standard_conforming_strings`, its default) as itself. `literal` writes no backslash inside quotes:
each one becomes `' || CHR(92) || '`, an expression both servers read as the same text.
"""

from dataclasses import dataclass

from eventspark.destinations.dialect import Dialect
from eventspark.steps.typing import DataType


@dataclass(frozen=True)
class RedshiftDialect(Dialect):
    def literal(self, text: str) -> str:
        """``text`` as an SQL string expression that Redshift and PostgreSQL read alike."""
        quoted = super().literal(text)  # quotes doubled, control characters refused
        if "\\" not in text:
            return quoted
        return "(" + quoted.replace("\\", "' || CHR(92) || '") + ")"


DIALECT = RedshiftDialect(
    name="redshift",
    types={
        DataType.BOOL: "boolean",
        DataType.INT64: "bigint",
        DataType.FLOAT64: "numeric(38,18)",
        DataType.STRING: "character varying(65535)",  # Redshift's text is only varchar(256)
        DataType.TIMESTAMP: "timestamp",
    },
    max_identifier_length=127,
    json_type="SUPER",  # values go through JSON_PARSE (load.text_value)
    json_names=frozenset({"json", "super"}),
)

STAGE_TEXT = "character varying(65535)"
"""Every staged value is text (see load.py): the type of every staging column but the order one."""
