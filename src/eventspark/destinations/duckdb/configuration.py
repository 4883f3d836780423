"""The `duckdb` destination's config: eventspark's embedded default warehouse."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field

from eventspark.config.base import DestinationBase, Section


class DuckDBConfig(Section):
    path: str = "warehouse.duckdb"
    """The database file; a relative path is under `log.path`."""
    schema_: str = Field(default="main", validation_alias=AliasChoices("schema", "schema_"))


class DuckDBDestination(DestinationBase):
    """eventspark's embedded default warehouse: a DuckDB file (relative paths are under log.path)."""

    type: Literal["duckdb"]
    duckdb: DuckDBConfig = Field(default_factory=DuckDBConfig)
