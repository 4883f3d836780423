"""The `clickhouse` destination's config: EventNative's `clickhouse` block."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from eventspark.config.base import DestinationBase, Section


class ClickHouseField(Section):
    function: str | None = None
    field: str


class ClickHouseEngine(Section):
    raw_statement: str | None = None
    nullable_fields: list[str] = Field(default_factory=list)
    partition_fields: list[ClickHouseField] = Field(default_factory=list)
    order_fields: list[ClickHouseField] = Field(default_factory=list)
    primary_keys: list[str] = Field(default_factory=list)


class ClickHouseConfig(Section):
    dsns: list[str] = Field(min_length=1)
    db: str
    cluster: str | None = None
    engine: ClickHouseEngine = Field(default_factory=ClickHouseEngine)
    tls: dict[str, str] = Field(default_factory=dict)


class ClickHouseDestination(DestinationBase):
    type: Literal["clickhouse"]
    clickhouse: ClickHouseConfig
