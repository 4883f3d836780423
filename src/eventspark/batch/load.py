"""The driver's part of loading one destination/table pair: patch the table, then commit the stage.

Both run under the coordination lock `<destination_id>_<table>`, so two nodes never patch the same
table at once, and a patch bumps the table version so that other nodes refresh cached schemas.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from eventspark.coordination import Coordination, CoordinationError
from eventspark.destinations.base import DestinationAdapter, DestinationError, Load, StagedChunk
from eventspark.steps.diff import ColumnLimitError, Table, check_column_limit, diff, table_from_header
from eventspark.steps.typing import BatchHeader

log = logging.getLogger(__name__)

LOCK_TIMEOUT = 120.0
Fault = Callable[[str], None]
"""A test hook called at named points of a pass ("staged", "committed") to inject a crash."""


@dataclass(slots=True)
class PairLoad:
    """What the executors produced for one destination/table pair."""

    dest_id: str
    table: str
    header: BatchHeader
    chunks: list[StagedChunk] = field(default_factory=list)
    files: set[str] = field(default_factory=set)
    error: str = ""
    """Set when an executor could not stage its rows: the pair is not committed this pass."""


def load_pair(
    adapter: DestinationAdapter,
    coordination: Coordination,
    pair: PairLoad,
    primary_keys: tuple[str, ...],
    max_columns: int,
    fault: Fault | None = None,
) -> str:
    """Patches and loads the pair; returns '' on success, else the reason it failed."""
    lock_name = f"{pair.dest_id}_{pair.table}"
    try:
        with coordination.lock(lock_name, LOCK_TIMEOUT):
            target = patch_table(adapter, coordination, lock_name, pair.header, primary_keys, max_columns)
            if fault is not None:
                fault("staged")
            load = Load(pair.dest_id, target, pair.chunks, sorted(pair.files), ordered=bool(primary_keys))
            adapter.commit(load)
    except (DestinationError, CoordinationError, ColumnLimitError, ValueError) as exc:
        log.warning("destination %s, table %s: %s", pair.dest_id, pair.table, exc)
        return str(exc)
    return ""


def patch_table(
    adapter: DestinationAdapter,
    coordination: Coordination,
    lock_name: str,
    header: BatchHeader,
    primary_keys: tuple[str, ...],
    max_columns: int,
) -> Table:
    """Creates the table or adds what it lacks; returns the table as it is afterwards."""
    existing = adapter.read_table(header.table_name)
    wanted = table_from_header(header, adapter.dialect.column_type, primary_keys)
    patch = diff(existing, wanted)
    if patch.is_empty and existing is not None:
        return existing
    check_column_limit(existing, patch, max_columns)
    adapter.patch(patch)
    coordination.bump_table_version(lock_name)
    after = adapter.read_table(header.table_name)
    if after is None:
        raise DestinationError(f"table {header.table_name!r} is missing right after it was created")
    return after
