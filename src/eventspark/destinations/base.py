"""The adapter contract every warehouse implements, and the data that crosses it.

A load goes through the same roles everywhere:

1. the driver reads the tables (`read_tables`) and patches one (`patch`) under the coordination lock;
2. executors write rows into the warehouse's *stage* through a `StageWriter` that a picklable
   `StageTarget` opens where they run (staging tables, staged files...), one `StagedChunk` per
   batch of rows, each with its own column types;
3. the driver moves every chunk of a destination/table pair into the target table in one
   transaction (`commit`): cast to the target's types, upserted when the table has a primary key,
   a load marker per source file recorded, the stage dropped. `loaded_files` reads those markers
   back, so a crash between any two steps and a rerun leave every event in the table exactly once.

Where the warehouse can (`Capabilities.direct_writes`), executors skip the stage for a split whose
rows all fit an existing table: a `DirectWriter` that a picklable `DirectTarget` opens writes them
into the table itself, in one transaction with one load marker per (split, table);
`loaded_splits` reads those markers back, so a rerun writes only the splits not committed.

Driver errors are translated here, at the boundary: `TransientError` (connection refused, reset,
timeout: keep the data, retry later) or `TerminalError` (the data or the schema is wrong).
"""

from __future__ import annotations

import importlib
import importlib.util
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from eventspark.destinations.dialect import Dialect
from eventspark.steps.diff import Table, TablePatch
from eventspark.steps.template import LOADS_TABLE, STAGE_PREFIX

__all__ = ["LOADS_TABLE", "ORDER_COLUMN", "STAGE_PREFIX"]  # plus the classes below
from eventspark.steps.typing import DataType

ORDER_COLUMN = "_es_seq"
"""Stage column giving the order of rows, so that the last event of a key wins an upsert."""


def new_job_id(now: float) -> str:
    """A job id that sorts by start time: 8 hex digits of epoch seconds, 6 random ones."""
    return f"{int(now):08x}{uuid.uuid4().hex[:6]}"


def job_started_at(job_id: str) -> float | None:
    """The epoch second a `new_job_id` was made at; None for anything else."""
    try:
        return float(int(job_id[:8], 16)) if len(job_id) >= 14 else None
    except ValueError:
        return None


class DestinationError(Exception):
    """A warehouse operation failed; the message says which and why."""


class TransientError(DestinationError):
    """The warehouse could not be reached or dropped the connection: retry the pair later."""


class PartlyDelivered(TransientError):
    """Some events of a send were decided (delivered, or refused with a reason) and the others
    could not be delivered yet (429, 5xx, connection errors): retry only the undecided ones."""

    def __init__(self, message: str, decided: Mapping[int, str | None], retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.decided = dict(decided)
        """Position in the send → None (delivered) or why it failed."""
        self.retry_after = retry_after
        """Seconds the service asked to wait (`Retry-After`), 0 when it did not say."""


class TerminalError(DestinationError):
    """The warehouse refused the statement (bad value, bad type, permissions): retrying the same
    data will fail the same way."""


@dataclass(frozen=True, slots=True)
class StagedChunk:
    """Rows an executor wrote to the stage: where (`ref`: a table or a file) and the stage type of
    each column. TIMESTAMP columns are staged as RFC 3339 text and cast at commit."""

    ref: str
    columns: Mapping[str, DataType]
    rows: int

    def to_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, "columns": {c: t.name for c, t in self.columns.items()}, "rows": self.rows}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StagedChunk:
        columns = {c: DataType[t] for c, t in data["columns"].items()}
        return cls(str(data["ref"]), columns, int(data["rows"]))


@dataclass(slots=True)
class Load:
    """Everything `commit` needs to move one destination/table pair from the stage to the target."""

    dest_id: str
    table: Table
    """The target as it is after patching: column types decide the casts."""
    chunks: list[StagedChunk]
    files: list[str]
    """The load markers the commit writes: names of the rotated logs whose events are in the
    chunks, or the keys of their splits (`Split.key`: task commits, `batch.commits`)."""
    ordered: bool = False
    """The chunks carry ORDER_COLUMN (set when the table has a primary key)."""


class StageWriter(Protocol):
    """Writes chunks of rows into the stage, on an executor."""

    def write(self, columns: Mapping[str, DataType], rows: Sequence[Sequence[Any]]) -> StagedChunk:
        """Stages `rows` (values in `columns` order, already in the stage types) as one chunk."""
        ...

    def close(self) -> None: ...


class JsonStageWriter(StageWriter, Protocol):
    """A writer that also stages rows the executor encoded as JSON objects, one per row."""

    def write_json(self, columns: Mapping[str, DataType], lines: bytes | bytearray, rows: int) -> StagedChunk:
        """Stages one chunk of `rows` rows: `lines` holds one JSON object per line, keyed by column
        (keys outside `columns` hold only nulls), values in the stage types of `columns` (an
        integer may stand for a FLOAT64 value: a JSON number is either)."""
        ...


class StageTarget(Protocol):
    """A picklable description of a stage; executors open writers from it."""

    @property
    def json_lines(self) -> bool:
        """The writers are JsonStageWriters, and JSON lines are their faster path."""
        ...

    def open(self) -> StageWriter: ...


@dataclass(slots=True)
class DirectRows:
    """Rows of one (split, table) for a direct write: values in `columns` order (a row may be
    shorter than `columns`: the missing tail is NULL), each value a bool, int, float or str that
    fits its target column as text (`DirectTarget.write_split`)."""

    columns: list[str]
    rows: list[list[Any]]
    kinds: list[type] | None = None
    """Per column (in `columns` order), the one Python type (bool, int, float or str) of all its
    values, None aside: the writer may pick each column's encoder once instead of per value."""
    sql_types: list[str] | None = None
    """Per column (in `columns` order), its SQL type as the warehouse's catalog spells it: a writer
    may then send the values in the columns' own binary forms."""


class DirectWriter(Protocol):
    """Writes whole splits into their target tables, on an executor (`Capabilities.direct_writes`)."""

    def write_split(
        self, split: str, tables: Mapping[str, DirectRows], before_commit: Callable[[], None] | None = None
    ) -> None:
        """In one transaction: the rows of each table into the table itself, and one load marker
        (`split`, table) per table; DestinationError when it cannot (nothing is written then: a
        split written already fails on its marker). `before_commit`, a test hook (the executor's
        fault), runs after the rows and markers are written, before the commit."""
        ...

    def close(self) -> None: ...


class DirectTarget(Protocol):
    """A picklable description of where executors write directly; executors open writers from it."""

    def open(self) -> DirectWriter: ...


class ObjectBuffer(Protocol):
    """The rows of one (log split, table) of a files destination, on an executor, until its
    object is written (`ObjectTarget.write`)."""

    def add(self, values: dict[str, Any], casts: Mapping[str, str], seq: int = 0) -> str | None:
        """Takes the row (the chain's `Row.values`) or returns why it cannot be written."""
        ...

    def __len__(self) -> int:
        """Rows added since the last `spill`."""
        ...

    @property
    def total(self) -> int:
        """Rows added in all (0: no object to write)."""
        ...

    def spill(self) -> None:
        """Packs the rows added so far (every `chunk_rows` rows) so the buffer's own state stays small."""
        ...


class ObjectTarget(Protocol):
    """A picklable description of where executors write the objects of a files destination
    (`Capabilities.stage == "objects"`): one object per rotated log split and table."""

    def chain(self, dest_id: str, dest: Any, geo: Any, ua: Any, check_name: Any) -> Any:
        """The destination's `DestinationChain` (its format decides what `Row.values` holds)."""
        ...

    def buffer(self, table: str) -> ObjectBuffer: ...

    def write(self, buffer: ObjectBuffer, log: str, start: int, whole: bool) -> tuple[StagedChunk, Any]:
        """Writes the object of `buffer` for the split of log `log` starting at byte `start`
        (`whole`: the split is the whole log); (chunk whose `ref` is the object's name,
        BatchHeader of its columns). DestinationError when it cannot."""
        ...

    def close(self) -> None:
        """Closes the clients `write` opened in this task."""
        ...


Mode = Literal["batch", "stream"]
UpsertStyle = Literal["on_conflict", "on_duplicate_key", "replacing_engine", "merge", "delete_insert", "none"]
"""How rows with a primary key replace stored ones: `INSERT ... ON CONFLICT DO UPDATE`,
`INSERT ... ON DUPLICATE KEY UPDATE`, plain inserts that a ReplacingMergeTree engine collapses
when parts merge (duplicates are visible until then, or with FINAL), `MERGE INTO ... WHEN MATCHED
THEN UPDATE ... WHEN NOT MATCHED THEN INSERT` (Snowflake, BigQuery), or `DELETE ... USING` the new
rows' keys then `INSERT`, in one transaction (Redshift, which has neither ON CONFLICT nor a MERGE
on every cluster). `none`: rows are never replaced (the files family writes every event;
`primary_key_fields` is not used)."""
StageKind = Literal["table", "files", "objects"]
"""Where executors stage chunks: tables in the warehouse's schema (`STAGE_PREFIX<job>_...`), or
files under `<log.path>/staging/<job>/<destination>/` that the driver loads; `objects`: nowhere,
executors write the destination's final objects themselves (the files family, S3 and GCS:
`stage_target` returns an `ObjectTarget`, no tables are read or patched, `commit` only removes
objects a rerun made stale, `loaded_files` is empty: the status files record completion)."""
UsersRecognitionStyle = Literal["update", "mutation", "none"]
"""Users recognition: an `UPDATE ... FROM` / `UPDATE ... JOIN` per table (cheap where the table is
small or indexed), an asynchronous `ALTER TABLE ... UPDATE` mutation that rewrites the parts it
touches (ClickHouse: batched, few per pass), or none (the destination cannot update rows)."""
Delivery = Literal["tables", "events"]
"""What a stream worker hands a destination: typed, flattened rows per table, into tables it reads
and patches (`DestinationAdapter`: the SQL warehouses), or events after enrichment and mapping,
neither flattened nor typed, to an adapter that sends them (`EventSender`: the HTTP family)."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a destination type can do, as data: the registry and the shared load code read it and
    never branch on a destination's name."""

    modes: frozenset[Mode]
    """The modes a destination of this type may be configured in."""
    upsert: UpsertStyle
    stage: StageKind
    transactions: bool
    """Copy, load markers and stage drops of a commit are one transaction (ClickHouse: no)."""
    ddl_in_transactions: bool
    """CREATE/ALTER/DROP TABLE run inside a transaction and roll back with it."""
    add_column_if_not_exists: bool
    """`ALTER TABLE ... ADD COLUMN IF NOT EXISTS` exists; else a duplicate-column error is ignored."""
    insert_absent_as_null: bool = True
    """A stream insert may send NULL for a column a row lacks; else (ClickHouse, whose columns
    are not Nullable) rows are inserted in groups naming only their non-NULL columns."""
    min_insert_interval_sec: float = 0.0
    """Stream mode, by default (a destination's `stream.min_insert_interval_sec` overrides it): the
    worker holds micro-batches and inserts each table at most once per interval. 0: insert every
    micro-batch."""
    min_insert_rows: int = 0
    """Stream mode: rows held for one table that trigger the inserts before the interval is over."""
    delivery: Delivery = "tables"
    """Stream mode: `tables` (the fields above apply) or `events` (`EventSender`: no tables, so
    `upsert`, `stage`, `transactions`, `ddl_in_transactions` and `add_column_if_not_exists` are
    not read)."""
    users_recognition: UsersRecognitionStyle = "none"
    """How `DestinationAdapter.recognize_users` sets user ids on earlier anonymous rows
    (`docs/users-recognition.md`)."""
    direct_writes: bool = False
    """Batch: executors write rows straight into existing tables (`DirectTarget`), each split in
    one transaction with its load markers, when every value of the (split, table) fits the
    table's columns; only what needs a new column (or a cast the executor cannot check) is staged
    and committed by the driver. Needs `transactions`."""
    task_commits: bool = False
    """Batch: the staged rows of each Spark task are committed on their own, in parallel (one
    connection per commit, `batch.commits`), in one transaction with their per-split markers,
    once the driver has patched the table; rather than all of a pair's rows in one serial
    commit. Tables with a primary key stay in one commit (upserts are ordered across splits)
    unless `keyed_task_commits`. Needs `transactions` and table stages any connection can read."""
    keyed_task_commits: bool = False
    """With `task_commits`, tables with a primary key too: executors cut their staged rows by a
    hash of the key into buckets, and each bucket is one upsert of its own (a key's rows in one
    statement, the last one winning), in parallel. Needs upserts that lock only the rows they
    touch (Postgres' ON CONFLICT; InnoDB's gap locks would make concurrent upserts deadlock)."""


@dataclass(frozen=True, slots=True)
class DestinationType:
    """One entry of the destination registry (`destinations.registry`): everything eventspark
    knows about a type before building one. Each package's `__init__` defines its entry; nothing
    here imports a driver."""

    name: str
    """The `type:` of the config."""
    config: type[Any]
    """The pydantic model of a destination of this type (its `configuration.py`)."""
    capabilities: Capabilities
    dialect: Dialect
    """SQL conventions and types; `dialect.quote` also decides which table names events may use."""
    factory: str
    """`module:function` making the adapter from (dest_id, config, events_dir); imported on use."""
    extra: str | None = None
    """The pip extra that installs the driver (`pip install 'eventspark[<extra>]'`)."""
    driver: str | None = None
    """The driver's top-level module, checked before building."""
    probe: str = "eventspark.destinations.sql.probe:probe"
    """`module:function(adapter, send_event) -> str` proving a built adapter's config works
    without loading events (`POST /api/v1/destinations/test`, `check --connect`): it says what
    it checked, or raises DestinationError with the service's message. Imported on use; the
    default creates and drops a probe table (SQL warehouses)."""

    def build(self, dest_id: str, dest: Any, events_dir: Path) -> DestinationAdapter:
        """The adapter of destination `dest_id`; does no I/O. TerminalError when the driver is missing."""
        self.require_driver()
        module, _, function = self.factory.partition(":")
        make = getattr(importlib.import_module(module), function)
        adapter: DestinationAdapter = make(dest_id, dest, events_dir)
        return adapter

    def run_probe(self, adapter: Any, send_event: bool = False) -> str:
        """Runs this type's `probe` on an adapter `build` made (blocking: network I/O)."""
        module, _, function = self.probe.partition(":")
        result: str = getattr(importlib.import_module(module), function)(adapter, send_event)
        return result

    def require_driver(self) -> None:
        try:
            missing = self.driver is not None and importlib.util.find_spec(self.driver) is None
        except ModuleNotFoundError:  # a dotted driver (google.cloud.bigquery) whose parent is missing
            missing = True
        if missing:
            raise TerminalError(
                f"destination type {self.name!r} needs the {self.driver!r} package: "
                f"pip install 'eventspark[{self.extra}]'"
            )


class DestinationAdapter(ABC):
    """One warehouse, driven from the Spark driver or a stream worker. Constructors do no I/O."""

    dialect: Dialect
    capabilities: Capabilities

    @abstractmethod
    def read_tables(self) -> dict[str, Table]:
        """Every table of the destination's schema (stage and marker tables excluded)."""

    @abstractmethod
    def read_table(self, name: str) -> Table | None:
        """One table, or None when it does not exist."""

    @abstractmethod
    def patch(self, patch: TablePatch) -> None:
        """Creates the table or adds its missing columns and primary key (never drops or retypes)."""

    @abstractmethod
    def stage_target(self, job_id: str, pass_bytes: int = 0) -> StageTarget:
        """Where the executors of job `job_id` stage rows; `pass_bytes`, the size of the logs the
        job reads (0: not known), lets a warehouse choose where to keep the stage."""

    @abstractmethod
    def commit(self, load: Load) -> None:
        """Moves the chunks into the target in one transaction, with the load markers."""

    @abstractmethod
    def loaded_files(self, dest_id: str, files: Iterable[str]) -> set[tuple[str, str]]:
        """(file, table) pairs of `files` already committed for `dest_id`."""

    def direct_target(self, job_id: str) -> DirectTarget:
        """Where the executors of job `job_id` write splits straight into existing tables
        (`Capabilities.direct_writes`)."""
        raise TerminalError(f"{type(self).__name__} cannot write directly: direct_writes is not supported")

    def loaded_splits(self, dest_id: str, logs: Iterable[str]) -> set[tuple[str, str]]:
        """(split key, table) of every split of the logs named `logs` whose rows a direct write
        committed for `dest_id` (per-split load markers, `Split.key`: `<log>@<start>-<end>`).
        Read by log, not by key: the boundaries found are kept by the next cut (`plan_splits`).
        Empty without `Capabilities.direct_writes` or `task_commits` (no split markers are ever written)."""
        return set()

    def mark_loaded(self, dest_id: str, table: str, files: Sequence[str]) -> None:
        """Writes the load markers of `files` for `table`, in a transaction of their own: the rows
        were committed without them (the key buckets of task commits, `batch.commits`)."""
        raise TerminalError(f"{type(self).__name__} has no load markers of its own to write")

    def forget_loaded(self, dest_id: str, logs: Sequence[str]) -> None:
        """Removes every load marker of the logs named `logs` for `dest_id` (per log and per split).
        Called once the logs are archived: no pass reads them again (a log gone from incoming/ is
        settled), so their markers would only grow the table. Nothing here: no markers."""
        return None

    @abstractmethod
    def drop_stages(self, job_id: str) -> None:
        """Removes what the executors of `job_id` staged and `commit` did not consume."""

    @abstractmethod
    def drop_stale_stages(self, before: float) -> None:
        """Removes stages of jobs started before epoch time `before`: what a killed pass left."""

    @abstractmethod
    def insert(self, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
        """Inserts (upserts with a primary key) rows directly: the stream mode's path."""

    @abstractmethod
    def close(self) -> None: ...

    def data_type_of(self, sql_type: str) -> DataType | None:
        """The DataType whose values a column of `sql_type` takes; None for types eventspark does not
        check (json, uuid...), whose values the warehouse casts at commit."""
        return self.dialect.data_type_of(sql_type)

    def recognize_users(
        self,
        table: Table,
        anonymous_column: str,
        user_columns: Sequence[str],
        pairs: Mapping[str, Sequence[Any]],
        unset: Sequence[str] = (),
    ) -> None:
        """Users recognition (`Capabilities.users_recognition`): on the rows of `table` whose
        `anonymous_column` is a key of `pairs` and whose `user_columns` are all NULL (empty), sets
        those columns to the pair's values (aligned with `user_columns`; None leaves one NULL).
        `unset`: columns that must hold no anonymous id (NULL or empty) on those rows, the
        alternatives before `anonymous_column` (a fallback such as a hashed id must not match rows
        whose own id is elsewhere). One statement (or mutation) per call; ids and values are
        bound, never spliced raw."""
        raise TerminalError(f"{type(self).__name__} cannot update rows: users recognition is not supported")


class EventSender(ABC):
    """A destination without tables (`Capabilities.delivery == "events"`: the HTTP family,
    `destinations/http/`), driven from a stream worker: events in, one outcome per event out.
    Constructors do no I/O."""

    capabilities: Capabilities

    @abstractmethod
    def send(self, events: Sequence[dict[str, Any]]) -> list[str | None]:
        """Delivers `events` (after enrichment and mapping, not flattened); per event None when
        delivered, else why the service refused it. Raises `PartlyDelivered` (or TransientError
        when nothing was decided) when some could not be delivered yet."""

    @abstractmethod
    def interrupt(self) -> None:
        """Called from another thread when the worker stops: end waits between retries now (the
        send in progress then raises for what it did not deliver)."""

    @abstractmethod
    def close(self) -> None: ...
