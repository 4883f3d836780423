"""Stages: where executors put chunks before a commit, named so that the job that made them can
be read back (and its leftovers found after a crash).

Table stages (`Capabilities.stage == "table"`) are named `STAGE_PREFIX<job id>_<random>` (plus a
suffix for derived tables) in the destination's schema; file stages live under
`<log.path>/staging/<job id>/<destination id>/`.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from eventspark.destinations.base import LOADS_TABLE, STAGE_PREFIX, job_started_at
from eventspark.steps.diff import Table


def new_stage_table(job_id: str) -> str:
    """A fresh staging table name (unqualified) for one chunk of job `job_id`."""
    return f"{STAGE_PREFIX}{job_id}_{uuid.uuid4().hex[:16]}"


def is_user_table(name: str) -> bool:
    """False for eventspark's own tables in a destination schema: staging tables and load markers."""
    return not name.startswith(STAGE_PREFIX) and name != LOADS_TABLE


def stage_job(name: str) -> str | None:
    """The `<job id>_...` part of a staging table's name; None for any other table."""
    return name[len(STAGE_PREFIX) :] if name.startswith(STAGE_PREFIX) else None


def started_before(before: float) -> Callable[[str], bool]:
    """Whether the job part of a stage name (`<job id>_...`) is a job started before epoch `before`."""
    return lambda stage_job: (job_started_at(stage_job) or before) < before


def of_job(job_id: str) -> Callable[[str], bool]:
    return lambda stage_job: stage_job.startswith(job_id)


def tables_from_catalog(
    columns: Iterable[Sequence[str]], keys: Iterable[tuple[str, Sequence[str]]], keep: Callable[[str], bool]
) -> dict[str, Table]:
    """Tables from catalog rows (table, column, SQL type) and (table, key columns), for the names
    `keep` accepts."""
    tables: dict[str, Table] = {}
    for table, column, sql_type in columns:
        if keep(table):
            tables.setdefault(table, Table(table)).columns[column] = sql_type
    for table, key_columns in keys:
        if table in tables:
            tables[table].primary_keys = tuple(key_columns)
    return tables


def file_stage_folder(staging_dir: Path, job_id: str, dest_id: str) -> Path:
    return staging_dir / job_id / dest_id


def drop_file_stages(staging_dir: Path, dest_id: str, matches: Callable[[str], bool]) -> None:
    """Removes the file stages of `dest_id` whose job folder name matches."""
    if not staging_dir.is_dir():
        return
    for folder in staging_dir.iterdir():
        if matches(folder.name):
            shutil.rmtree(folder / dest_id, ignore_errors=True)
