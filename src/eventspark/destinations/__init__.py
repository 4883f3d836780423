"""Destinations: the adapter contract (`base`), the registry of types (`registry`), shared SQL code
(`sql`) and one package per warehouse, each with the same files (docs/destinations/adding.md).

`build_destination` makes the adapter of a configured destination; drivers are imported only for
the destinations in use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eventspark.destinations.base import DestinationAdapter, DestinationError, TerminalError, TransientError

__all__ = ["DestinationAdapter", "DestinationError", "TerminalError", "TransientError", "build_destination"]


def build_destination(dest_id: str, dest: Any, events_dir: Path) -> DestinationAdapter:
    """The adapter of destination config `dest` (its registry entry's factory); does no I/O.

    `events_dir` is `log.path`: relative DuckDB paths live under it, and so does the `staging/`
    folder where executors write files for warehouses loaded from files. TerminalError for a type
    the registry does not have or a missing driver.
    """
    from eventspark.destinations.registry import destination_type

    try:
        entry = destination_type(dest.type)
    except ValueError as exc:
        raise TerminalError(f"destination {dest_id!r}: {exc}") from None
    return entry.build(dest_id, dest, events_dir)
