"""The dialect of HTTP destinations: they have no tables and no SQL, but `DestinationType` needs a
dialect and the stream worker checks table names with `dialect.quote`. Here the table name
template only filters events (an empty name skips the event, as in EventNative), so any name is
accepted but an empty one or one with control characters; every type is sent as text, as
EventNative's `DefaultSchemaTypeMappings` said."""

from __future__ import annotations

from eventspark.destinations.dialect import Dialect
from eventspark.steps.typing import DataType


def http_dialect(name: str) -> Dialect:
    return Dialect(name=name, types=dict.fromkeys(DataType, "string"), max_identifier_length=None)
