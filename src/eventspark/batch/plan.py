"""What the driver tells every executor about one job: a small, picklable plan.

It holds configuration and metadata only (which destinations each token feeds, which pairs are
already uploaded, the column types of existing tables, where to stage), never events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eventspark.batch.splits import Split
from eventspark.config.routing import token_routes
from eventspark.destinations.base import DirectTarget, ObjectTarget, StageTarget
from eventspark.logs.store import RemoteReader
from eventspark.steps.typing import DataType

__all__ = ["DEFAULT_CHUNK_ROWS", "JobPlan", "token_routes"]

DEFAULT_CHUNK_ROWS = 50_000
"""Rows per staged chunk: bounds an executor's memory while keeping the number of chunks small."""


@dataclass(slots=True)
class JobPlan:
    job_id: str
    staging_dir: str
    destinations: dict[str, Any]
    """Destination id → its config (`DestinationBase`), batch destinations this job loads."""
    secret_tokens: dict[str, str]
    """`api_key` value of an event (a secret or a token id) → token id."""
    token_destinations: dict[str, tuple[str, ...]]
    default_destinations: tuple[str, ...]
    """For tokens that are no longer configured: the destinations open to every token."""
    file_tokens: dict[str, str]
    """Rotated log name → token id in its name: the token of lines without a known `api_key`."""
    file_ranks: dict[str, int]
    """Rotated log name → its place in time order (rows of later logs win an upsert)."""
    done: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    """(log name, destination id) → tables not loaded from that log this pass: uploaded or given up
    already, or waiting for their retry (`eventspark.retry`)."""
    skip: frozenset[tuple[str, str]] = frozenset()
    """(log name, destination id) pairs this pass leaves alone: nothing of theirs is due yet."""
    give_up: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    """(log name, destination id) → table → the reason its events go to `failed/` instead of the
    table (the retry policy's maximum age is over); table '' (`NO_TABLE`): every table not done."""
    existing: dict[str, dict[str, dict[str, DataType | None]]] = field(default_factory=dict)
    """Destination id → table → column → the DataType its values must fit (None: not checked)."""
    primary_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)
    stages: dict[str, StageTarget] = field(default_factory=dict)
    objects: dict[str, ObjectTarget] = field(default_factory=dict)
    """Destination id → where executors write its objects: the files family (not in `stages`)."""
    direct: dict[str, DirectTarget] = field(default_factory=dict)
    """Destination id → where executors write rows straight into existing tables
    (`Capabilities.direct_writes`); its other pairs are staged as usual."""
    task_commits: frozenset[str] = frozenset()
    """Destination ids whose staged rows are committed per task (`Capabilities.task_commits`):
    without a primary key, each task reports the splits whose rows its chunks hold, for their
    markers; with one (`Capabilities.keyed_task_commits`), its chunks are cut by `key_buckets`."""
    key_buckets: int = 1
    """Task commits with a primary key: the buckets a row's key hashes into (`batch.commits.bucket_rows`)."""
    sql_types: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    """Destination id (of `direct`, or one given up unreached whose status files recorded them:
    `batch.job._recorded`) → table → column → its SQL type, as the catalog reads it."""
    split_done: frozenset[tuple[str, str, str]] = frozenset()
    """(split key, destination id, table) committed by an earlier pass (per-split load markers):
    their rows are not written again; their failed events are spooled again while the
    (log, table) pair is not settled."""
    geo_path: str | None = None
    max_columns: int = 0
    """`server.max_columns`: the default of each destination's `data_layout.max_columns`."""
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    pass_bytes: int = 0
    """The size of the logs this job reads."""
    replay_destination: str | None = None
    """Set when this job loads replay logs (`logs.replay`): the one destination they load into."""
    recognition: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    """Destination id → (anonymous id node, identification nodes) of its users recognition."""
    splits: list[Split] = field(default_factory=list)
    """The job's splits, in order (`plan_splits`, cut before the job so that per-split markers
    can be read): consecutive ones grouped into tasks (`BatchJob._execute`)."""
    reader: RemoteReader | None = None
    """Set when the logs are on object storage (`log.remote`): executors read their splits through
    it (`read_remote_split`); None: they open the driver's paths."""
    spool_target: str | None = None
    """With `reader`: the remote folder each task uploads its spools of failed events to, for the
    driver to fetch (an executor's disk is not the driver's)."""
    log_sizes: dict[str, int] = field(default_factory=dict)
    """Log name → its size as listed: whether a split is the whole log (files destinations)."""
    executor_fault: str | None = None
    """Test only (like the driver's `Fault`): `kill-before-commit:<n>` / `kill-after-commit:<n>`
    makes an executor SIGKILL itself around its n-th direct split commit."""

    def destinations_of(self, token_id: str) -> tuple[str, ...]:
        found = self.token_destinations.get(token_id)
        return self.default_destinations if found is None else found
