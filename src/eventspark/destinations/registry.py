"""The registry of destination types: for each, its config model, capabilities, modes and how to
build it, as data. `eventspark check`, `serve` and every part that builds a destination read it;
nothing else lists destination types.

Adding a type is adding its package and one line here (docs/destinations/adding.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from eventspark.destinations.base import DestinationType

PACKAGES = (
    "postgres",
    "duckdb",
    "clickhouse",
    "mysql",
    "snowflake",
    "bigquery",
    "redshift",
    "s3",
    "gcs",
    "webhook",
    "google_analytics",
    "amplitude",
    "facebook",
)
"""The destination packages (`eventspark.destinations.<name>`), each exporting `DESTINATION`.
Their `__init__` imports no driver, so listing one costs nothing until a config uses it."""

REGISTRY: Mapping[str, DestinationType] = MappingProxyType(
    {
        entry.name: entry
        for entry in (importlib.import_module(f"eventspark.destinations.{name}").DESTINATION for name in PACKAGES)
    }
)
EVENTNATIVE_TYPES = frozenset(
    {
        "postgres",
        "mysql",
        "clickhouse",
        "redshift",
        "bigquery",
        "snowflake",
        "s3",
        "gcs",
        "webhook",
        "google_analytics",
        "amplitude",
        "facebook",
    }
)
PLANNED = EVENTNATIVE_TYPES - REGISTRY.keys()
"""EventNative types that eventspark does not load yet: named as such in the error."""


def supported() -> str:
    return ", ".join(sorted(REGISTRY))


def destination_type(name: str) -> DestinationType:
    """The registry entry of `name`; ValueError naming the supported types for anything else."""
    found = REGISTRY.get(name)
    if found is not None:
        return found
    if name in PLANNED:
        raise ValueError(f"type {name!r} is not supported yet; supported types: {supported()}")
    raise ValueError(f"unknown destination type {name!r}; supported types: {supported()}")


def check_mode(name: str, mode: str) -> None:
    """ValueError when type `name` cannot run in `mode`, naming the modes it supports."""
    modes = destination_type(name).capabilities.modes
    if mode not in modes:
        raise ValueError(f"type {name!r} does not support mode {mode!r}; it supports: {', '.join(sorted(modes))}")


def config_models() -> tuple[type[Any], ...]:
    """The config model of every registered type (the members of the config's union)."""
    return tuple(entry.config for entry in REGISTRY.values())
