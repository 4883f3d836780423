"""What the warehouses that stage each chunk as its own table in the destination's schema share
(Postgres, ClickHouse, MySQL): the staging tables' names, telling them from the user's tables, dropping a
job's leftovers, and the columns a commit fills.

A staging table is named `STAGE_PREFIX<job id>_<random>` (plus a suffix for derived tables), so
the job that made it can be read back from the name alone.
"""

from __future__ import annotations

import uuid
from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence

from eventspark.destinations.base import (
    LOADS_TABLE,
    ORDER_COLUMN,
    STAGE_PREFIX,
    DestinationAdapter,
    Load,
    job_started_at,
)
from eventspark.steps.diff import Table


def new_stage_table(job_id: str) -> str:
    """A fresh staging table name (unqualified) for one chunk of job `job_id`."""
    return f"{STAGE_PREFIX}{job_id}_{uuid.uuid4().hex[:16]}"


def is_user_table(name: str) -> bool:
    """False for eventspark's own tables in a destination schema: staging tables and load markers."""
    return not name.startswith(STAGE_PREFIX) and name != LOADS_TABLE


def tables_from_columns(columns: Iterable[Sequence[str]], keep: Callable[[str], bool]) -> dict[str, Table]:
    """Tables (without keys) from catalog rows (table, column, SQL type), for the names `keep` accepts."""
    tables: dict[str, Table] = {}
    for table, column, sql_type in columns:
        if keep(table):
            tables.setdefault(table, Table(table)).columns[column] = sql_type
    return tables


def load_columns(load: Load) -> list[str]:
    """The target columns the chunks fill, in first-seen order (the order column excluded).

    ValueError names a column the target lacks: the table must be patched before loading.
    """
    seen: dict[str, None] = {}
    for chunk in load.chunks:
        seen.update(dict.fromkeys(c for c in chunk.columns if c != ORDER_COLUMN))
    missing = [c for c in seen if c not in load.table.columns]
    if missing:
        raise ValueError(f"table {load.table.name!r} has no column {missing[0]!r}; patch it before loading")
    return list(seen)


class StagingTableAdapter(DestinationAdapter):
    """An adapter whose stage is tables named by `new_stage_table`: reading tables and dropping
    stages come down to two warehouse-specific queries."""

    @abstractmethod
    def _read(self, name: str | None) -> dict[str, Table]:
        """The user's tables of the schema (only `name` when given), with their primary keys."""

    @abstractmethod
    def _drop_stages_where(self, matches: Callable[[str], bool]) -> None:
        """Drops the staging tables whose name after STAGE_PREFIX (`<job id>_<chunk>...`) matches."""

    def read_tables(self) -> dict[str, Table]:
        return self._read(None)

    def read_table(self, name: str) -> Table | None:
        return self._read(name).get(name)

    def drop_stages(self, job_id: str) -> None:
        self._drop_stages_where(lambda stage_job: stage_job.startswith(job_id))

    def drop_stale_stages(self, before: float) -> None:
        self._drop_stages_where(started_before(before))


def started_before(before: float) -> Callable[[str], bool]:
    """Whether the job part of a stage name (`<job id>_...`) is a job started before epoch `before`."""
    return lambda stage_job: (job_started_at(stage_job) or before) < before
