"""The `postgres` destination's config: EventNative's `datasource` block."""

from __future__ import annotations

from typing import Literal

from eventspark.config.base import DataSource, DestinationBase


class PostgresDestination(DestinationBase):
    type: Literal["postgres"]
    datasource: DataSource
    """host, port (5432), db, schema (public), username, password, parameters (libpq keywords)."""
