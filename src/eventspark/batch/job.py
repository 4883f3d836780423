"""One batch pass: one Spark job over a set of rotated logs, then loads, status files, archive.

Driver steps, in order:
1. drop empty logs; read each log's status file and the destinations' load markers (a marker means
   the pair was committed even if the status file never heard of it: a crash came in between),
   per log and, for direct writes, per split: the logs are cut into splits before the job
   (`plan_splits`, keeping the boundaries of splits with markers);
2. read the destinations' tables, so executors check values against the existing column types;
   the whole plan is made at once (`_plan`);
3. run the job: executors multiplex lines to destinations, run the step chain, write each split
   of an existing table whose values fit straight into it with its split markers (direct writes,
   `Capabilities.direct_writes`), stage the other rows and spool failed events; the driver
   collects only counts, chunk references and BatchHeaders (`batch.results`);
4. per destination/table pair: a pair written directly only is done; else merge the headers,
   patch the table and commit the chunks (`batch.load`): per Spark task (or key bucket), in
   parallel, with their split markers, where the destination has task commits (`batch.commits`),
   else in one transaction; a pair that fails is recorded FAILED with
   its attempts, and retried by the first pass after its back-off (`eventspark.retry`; before it,
   that pair of the log is not read, and a log with nothing due is not read at all); past the
   policy's maximum age its events go to `failed/` with the reason instead (the pair *gave up*),
   but for the splits written directly before (their rows are in the table: the status file
   records them, for a give-up that cannot reach the destination to read their markers);
5. append the failed events of settled pairs to `failed/`, each line exactly once across crashes
   (parked before the commits, appended under a journal: `batch.failed_events`), write the status
   files, archive the logs whose every pair is settled.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eventspark.batch.commits import DEFAULT_CONNECTIONS, CommitPool, TaskUnit, UnitCommit, key_buckets
from eventspark.batch.failed_events import FailedEvents
from eventspark.batch.load import (
    LOAD_ERRORS,
    Deferred,
    Fault,
    PairLoad,
    commit_objects,
    load_failure,
    load_pair,
    patch_pair,
)
from eventspark.batch.partition import NO_TABLE, process_splits
from eventspark.batch.plan import DEFAULT_CHUNK_ROWS, JobPlan, token_routes
from eventspark.batch.results import TaskResult
from eventspark.batch.splits import Split, group_splits, plan_splits, split_range
from eventspark.config import LoadedConfig
from eventspark.coordination import Coordination
from eventspark.destinations import build_destination
from eventspark.destinations.base import (
    DestinationAdapter,
    DestinationError,
    DirectTarget,
    Load,
    ObjectTarget,
    StageTarget,
    new_job_id,
)
from eventspark.destinations.registry import destination_type
from eventspark.destinations.sync import LOCK_TIMEOUT, table_lock
from eventspark.logs.replay import replay_destination
from eventspark.logs.rotated import rotated_token
from eventspark.logs.status import (
    LogStatus,
    PairStatus,
    all_uploaded,
    merge_status,
    processed,
)
from eventspark.logs.store import LocalStore, LogFile, LogStore, log_store
from eventspark.ops.cache_results import settle_samples
from eventspark.recognition.service import Recognizer, recognition_of
from eventspark.recognition.state import done_sightings, keep_sightings
from eventspark.retry import RetryPolicy, due, give_up_reason, retry_policy
from eventspark.steps.diff import Table, UnmappedRule
from eventspark.steps.recognition import Sightings
from eventspark.steps.typing import BatchHeader, DataType

log = logging.getLogger(__name__)

STALE_STAGE_SECONDS = 24 * 3600
TASKS_PER_CORE = 4

_Key = tuple[str, str]
"""(log name, destination id)."""


@dataclass(slots=True)
class PairSummary:
    """What a pass did for one destination/table (table '' holds skipped and template failures)."""

    dest_id: str
    table: str
    rows: int = 0
    failed: int = 0
    skipped: int = 0
    error: str = ""


@dataclass(slots=True)
class JobResult:
    """What a pass did. Logs are listed as Paths under `log.path`, as `LogFile`s with `log.remote`
    (`archived`: the archives' Paths, or their paths on the remote filesystem)."""

    pairs: dict[tuple[str, str], PairSummary] = field(default_factory=dict)
    archived: list[Any] = field(default_factory=list)
    kept: list[Any] = field(default_factory=list)
    deleted_empty: list[Any] = field(default_factory=list)
    held: dict[str, str] = field(default_factory=dict)
    """Rotated logs left in incoming/ untouched (also in `kept`): log name → why (`_hold_unroutable`)."""
    samples: list[dict[str, Any]] = field(default_factory=list)
    """A sample of the pass's events with their outcome, for the events cache (`ops.cache_results`)."""
    waiting: list[Any] = field(default_factory=list)
    """Rotated logs not read this pass (also in `kept`): none of their failed pairs is due yet."""
    gave_up: dict[str, int] = field(default_factory=dict)
    """Destination id → events sent to `failed/` because their pair gave up (the retry policy)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per phase of the pass, summed over its jobs: `plan` (statuses, markers, tables,
    splits: the driver, before Spark), `stage` (the Spark job: the executors' part), `load`
    (patches, commits, users recognition), `settle` (failed events, status files), `archive`.
    `bench/scale.py` models a pass from them: every phase but `stage` runs once per pass on the
    driver."""

    @property
    def ok(self) -> bool:
        return not any(p.error for p in self.pairs.values())

    def pair(self, dest_id: str, table: str) -> PairSummary:
        found = self.pairs.get((dest_id, table))
        if found is None:
            found = self.pairs[dest_id, table] = PairSummary(dest_id, table)
        return found


@dataclass(slots=True)
class _Schedule:
    """What a pass does with each (log, destination) it routes to, from the status files and the
    retry policy (`BatchJob._schedule`); keys are (log name, destination id)."""

    now: float
    work: set[tuple[str, str]] = field(default_factory=set)
    """Read this pass: a destination not processed yet, or some failed pair due or given up."""
    waiting: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    """Failed tables not due yet: not loaded this pass (like uploaded ones)."""
    give_up: dict[tuple[str, str], dict[str, str]] = field(default_factory=lambda: defaultdict(dict))
    """Table → reason, for the table pairs past the maximum age."""
    whole: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    """The destination could not be reached for the log for longer than the maximum age: if this
    pass cannot reach it either, every failed table ('': any other) gives up, with these reasons."""
    unreached: set[tuple[str, str]] = field(default_factory=set)
    """Read for a destination this pass could not reach: recorded as its '' pair, skipped."""
    optional: set[tuple[str, str]] = field(default_factory=set)
    """Destinations the log's token does not route to and no pass processed for it yet: events
    with another token's `api_key` may still go there. Processed when the log is read anyway."""

    def wanted(self, dest_id: str) -> list[str]:
        return sorted(name for name, d in self.work if d == dest_id)


@dataclass(slots=True)
class _Collected:
    """The results of every task (`TaskResult`), folded."""

    counts: dict[tuple[str, str, str], list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0, 0]))
    spools: dict[tuple[str, str, str], list[Path]] = field(default_factory=lambda: defaultdict(list))
    pairs: dict[tuple[str, str], PairLoad] = field(default_factory=dict)
    """Per (destination, table): its staged chunks with their merged header, the logs of its
    rows, and the first error of a task (a pair written directly only has no chunks)."""
    samples: list[str] = field(default_factory=list)
    sightings: dict[str, Sightings] = field(default_factory=dict)
    """Users recognition: per destination, the ids the tasks saw (`steps.recognition`)."""
    written: dict[tuple[str, str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    """(log, destination, table) → keys of the splits written directly this pass (`DirectResult`),
    or committed by a task commit (`batch.commits`)."""
    columns: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    """(destination, table) → column → SQL type, of the tables patched for task commits: what the
    rows of their committed splits were cast to (`_record_written`)."""


@dataclass(slots=True)
class _Reached:
    """One destination's part of the job plan (`BatchJob._prepare_destination`). Without a stage
    or objects target: a destination this pass cannot reach, whose logs give up (routed, never
    staged)."""

    dest: Any
    stage: StageTarget | None = None
    objects: ObjectTarget | None = None
    direct: DirectTarget | None = None
    existing: dict[str, dict[str, DataType | None]] = field(default_factory=dict)
    sql_types: dict[str, dict[str, str]] = field(default_factory=dict)
    """The tables direct writes may take (no primary key in the warehouse): column → SQL type."""
    primary_keys: tuple[str, ...] = ()
    recognition: tuple[str, tuple[str, ...]] | None = None
    split_markers: set[tuple[str, str]] = field(default_factory=set)
    """(split key, table) of the per-split load markers of the job's logs (`loaded_splits`); of a
    destination that cannot be reached, the splits the status files record (`_recorded`)."""
    task_commits: bool = False
    """Its staged rows are committed per task, or per key bucket (`batch.commits`): the destination
    can (`Capabilities.task_commits`; with a primary key, `keyed_task_commits`)."""

    @property
    def connected(self) -> bool:
        return self.stage is not None or self.objects is not None


class BatchJob:
    """Runs passes for one config; holds no Spark or database state between passes."""

    def __init__(
        self,
        loaded: LoadedConfig,
        coordination: Coordination,
        fault: Fault | None = None,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        clock: Callable[[], float] = time.time,
        store: LogStore | None = None,
        fence: Callable[[str], None] | None = None,
    ) -> None:
        self.config = loaded.config
        self.coordination = coordination
        self.fault = fault
        self.chunk_rows = chunk_rows
        self.clock = clock
        """Epoch seconds: the retry policy's time (tests move it instead of sleeping)."""
        self.events_dir = Path(self.config.log.path)
        self.store = store or log_store(self.config)
        """Where the logs, their status files and the archive are: `log.path` or `log.remote`."""
        self.fence = fence
        """With `log.remote`: called with the name of each step that changes shared state before
        it runs; raises when the cluster's pass lock was lost (`batch.process.pass_fence`)."""
        self._staged: set[str] = set()
        self._catalog: dict[tuple[str, str], dict[str, str]] = {}
        """(destination, table) → column → SQL type as the job found them, of the destinations with
        task commits: recorded with their committed splits (`_record_written`)."""
        self._archived: list[str] = []
        """Names of the logs the running job archived (their load markers go: `_forget_markers`)."""
        self._commit_workers = 1
        """Connections committing task units at once (`batch.commits`): `spark.commit_connections`,
        else the Spark job's parallelism (set by `_execute`)."""

    def run(self, session: Any, logs: list[Path] | list[LogFile]) -> JobResult:
        """One pass over `logs`: rotated logs under `log.path` (Paths), or as the store lists them."""
        result = JobResult()
        self.recover_failed()
        files = [LocalStore.log_file(item) if isinstance(item, Path) else item for item in logs]
        files = self._drop_empty(files, result)
        # Replay logs (`logs.replay`) load into one destination each: a job of their own.
        groups: dict[str | None, list[LogFile]] = defaultdict(list)
        for logfile in files:
            groups[replay_destination(logfile.name)].append(logfile)
        batch = self._batch_destinations()
        if None in groups:
            groups[None] = self._hold_unroutable(groups[None], result)
        for only, group in sorted(groups.items(), key=lambda item: item[0] or ""):
            if only is not None and only not in batch:
                log.warning("replay logs for %s kept: it is not a batch destination of this config", only)
                result.kept.extend(self.store.shown(logfile) for logfile in group)
                continue
            if group:
                self._run_job(session, group, only, result)
        self.store.publish_failed(self.events_dir / "failed")
        return result

    def _batch_destinations(self) -> dict[str, Any]:
        """Destination id → config of the batch destinations."""
        return {d: dest for d, dest in self.config.destinations.items() if dest.mode == "batch"}

    def _hold_unroutable(self, logs: list[LogFile], result: JobResult) -> list[LogFile]:
        """The logs some batch destination takes; the others stay in incoming/, untouched.

        A log's token comes from its name (as in EventNative). When no batch destination takes it
        (a token removed from `api_keys`, or one whose destinations are all stream or `only_tokens`
        of others) its events would reach neither a table nor `failed/`: the log waits, with a
        warning every pass, and loads once a config reload brings the token or a destination back.
        """
        batch = self._batch_destinations()
        _secrets, token_destinations, default = token_routes(self.config.api_keys, batch)
        routable = []
        for path in logs:
            token = rotated_token(path.name) or ""
            if token_destinations.get(token, default):
                routable.append(path)
                continue
            known = token in token_destinations
            why = f"token '{token}' " + ("has no batch destination" if known else "is not in api_keys")
            log.warning("rotated log %s kept in incoming/, not loaded: %s", path.name, why)
            result.held[path.name] = why
            result.kept.append(self.store.shown(path))
        return routable

    def _run_job(self, session: Any, logs: list[LogFile], only: str | None, result: JobResult) -> None:
        job_id = new_job_id(time.time())
        adapters: dict[str, DestinationAdapter] = {}
        self._catalog = {}
        self._archived = []
        try:
            self._run(session, logs, job_id, adapters, result, only)
        finally:
            for dest_id, adapter in adapters.items():
                self._cleanup(adapter, job_id, staged=dest_id in self._staged)
            shutil.rmtree(self.events_dir / "staging" / job_id, ignore_errors=True)
            self.store.finish_job(job_id)

    def _run(
        self,
        session: Any,
        logs: list[LogFile],
        job_id: str,
        adapters: dict[str, DestinationAdapter],
        result: JobResult,
        only: str | None = None,
    ) -> JobResult:
        clock = _Phases(result.timings)
        statuses = self.store.read_statuses(logs)
        schedule = self._schedule(logs, statuses, only)
        logs = self._idle(session, logs, statuses, schedule, result)
        if not logs:
            return result
        # Destinations a log's status file has not seen processed: their template failures are
        # written this pass (decided before load markers repair the statuses after a crash).
        seen = {(name, d) for name, status in statuses.items() for d in status if processed(status, d)}
        dest_errors: dict[str, str] = {}
        failed_events = FailedEvents(self.events_dir, self.fault, self.store.status_of, self.store.park_claims())
        plan = self._plan(job_id, logs, statuses, schedule, adapters, dest_errors, failed_events, only)
        fresh = {(name, d) for name in plan.file_tokens for d in plan.destinations if (name, d) not in plan.skip}
        fresh -= seen
        clock.lap("plan")
        self._fenced("the Spark job")  # its direct writes commit into the tables
        collected = self._execute(session, plan, job_id) if plan.destinations else _Collected()
        collected.columns.update(self._catalog)  # a task commit's patch replaces its table's
        stage = clock.lap("stage")
        # Users recognition's ids outlive a crash between the commits and its run (`recognition.state`).
        keep_sightings(self.events_dir, collected.sightings, set(plan.recognition))
        self._fenced("parking failed events")  # claims on the store (`ParkClaims`)
        failed_events.park(collected.spools, fresh, set(collected.counts))
        outcomes = self._load(collected, adapters, result)
        self._fenced("users recognition")
        self._recognize(collected, adapters)
        result.samples += settle_samples(collected.samples, outcomes)
        load = clock.lap("load")
        log.info(
            "job %s: %d log(s), Spark stage %.2f s, patch and commit %.2f s",
            job_id,
            len(logs),
            stage,
            load,
        )
        if self.fault is not None:
            self.fault("committed")
        self._fenced("writing the status files and failed events")
        done = self._settle(
            logs, statuses, schedule, fresh, plan, collected, outcomes, dest_errors, failed_events, result
        )
        clock.lap("settle")
        result.archived.extend(self._archive(session, done))  # after the append lock: gzipping takes a while
        self._forget_markers({d: a for d, a in adapters.items() if d not in dest_errors})
        clock.lap("archive")
        return result

    def _recognize(self, collected: _Collected, adapters: dict[str, DestinationAdapter]) -> None:
        """Users recognition after the commits: earlier anonymous rows get their user's id."""
        for dest_id, seen in sorted(collected.sightings.items()):
            recognizer = Recognizer.build(self.config, dest_id, self.config.destinations[dest_id], self.coordination)
            if recognizer is None or dest_id not in adapters:
                continue
            started = time.monotonic()
            try:
                done = recognizer.run(adapters[dest_id], seen)
            except DestinationError as exc:
                log.warning("users recognition of %s failed: %s", dest_id, exc)
                continue
            finally:
                recognizer.close()
            if not done.skipped:  # else its ids wait on disk for the next pass
                done_sightings(self.events_dir, dest_id)
            took = time.monotonic() - started
            log.info("users recognition of %s: %s in %.2f s", dest_id, done, took)

    # --- before the job -----------------------------------------------------------------------

    def _drop_empty(self, logs: list[LogFile], result: JobResult) -> list[LogFile]:
        kept = []
        for logfile in logs:
            if logfile.size == 0:
                self.store.delete(logfile)
                result.deleted_empty.append(self.store.shown(logfile))
            else:
                kept.append(logfile)
        return kept

    # --- the retry policy ---------------------------------------------------------------------

    def _schedule(self, logs: list[LogFile], statuses: dict[str, LogStatus], only: str | None) -> _Schedule:
        """Which (log, destination) pairs this pass reads, waits for, or gives up (`_Schedule`)."""
        schedule = _Schedule(self.clock())
        batch = self._batch_destinations()
        _secrets, token_destinations, default = token_routes(self.config.api_keys, batch)
        for path in logs:
            name = path.name
            routed = (only,) if only is not None else token_destinations.get(rotated_token(name) or "", default)
            for dest_id in routed if only is not None else batch:
                tables = statuses[name].get(dest_id)
                if tables is None and dest_id not in routed:
                    schedule.optional.add((name, dest_id))
                else:
                    _schedule_pair(schedule, (name, dest_id), tables, retry_policy(self.config, batch[dest_id]))
        return schedule

    def _idle(
        self, session: Any, logs: list[LogFile], statuses: dict[str, LogStatus], schedule: _Schedule, result: JobResult
    ) -> list[LogFile]:
        """The logs this pass reads. The others wait for their next retry, untouched, or go to the
        archive when every pair is settled already (a crash between the status and the archive)."""
        active = {name for name, _dest_id in schedule.work}
        schedule.work.update(key for key in schedule.optional if key[0] in active)
        read, settled = [], []
        for logfile in logs:
            status = statuses[logfile.name]
            if logfile.name in active:
                read.append(logfile)
            elif status and all_uploaded(status):
                settled.append(logfile)
            else:
                result.kept.append(self.store.shown(logfile))
                result.waiting.append(self.store.shown(logfile))
        result.archived.extend(self._archive(session, settled))
        return read

    def recover_failed(self) -> None:
        """What a pass cut short left in `failed/` is recovered before this pass appends anything
        (`FailedEvents.recover`). Also run by a pass with no log to read (`batch.process.run_pass`):
        no Spark, no connection."""
        failed_events = FailedEvents(self.events_dir, self.fault, self.store.status_of, self.store.park_claims())
        failed_events.recover(list(self._batch_destinations()))

    def _plan(
        self,
        job_id: str,
        logs: list[LogFile],
        statuses: dict[str, LogStatus],
        schedule: _Schedule,
        adapters: dict[str, DestinationAdapter],
        dest_errors: dict[str, str],
        failed_events: FailedEvents,
        only: str | None = None,
    ) -> JobPlan:
        """The job's whole plan, made at once when the destinations are reached and the logs cut
        into splits (per-split load markers keep their boundaries). `only`: the destination of a
        job over replay logs (every line goes there)."""
        names = [p.name for p in logs]
        pass_bytes = sum(p.size for p in logs)
        reached = self._reach(job_id, pass_bytes, names, statuses, schedule, adapters, dest_errors, failed_events, only)
        splits = plan_splits(logs, _known_splits(reached))
        destinations = {dest_id: part.dest for dest_id, part in reached.items()}
        secrets, token_destinations, default = token_routes(self.config.api_keys, destinations)
        if only is not None:  # whatever token a replayed event came with
            secrets, token_destinations, default = {}, {}, (only,)
        done, skip, give_up = self._plan_pairs(reached, names, statuses, schedule)
        staged = {dest_id: part for dest_id, part in reached.items() if part.stage is not None}
        direct = {dest_id: part for dest_id, part in staged.items() if part.direct is not None}
        # Tables whose rows are checked as a direct write checks them: of the direct destinations,
        # and those written directly before a give-up that cannot reach them (`_recorded`).
        checked = {dest_id: part for dest_id, part in reached.items() if dest_id in direct or part.sql_types}
        return JobPlan(
            job_id=job_id,
            staging_dir=str(self.events_dir / "staging"),
            destinations=destinations,
            secret_tokens=secrets,
            token_destinations=token_destinations,
            default_destinations=default,
            file_tokens={name: rotated_token(name) or "" for name in names},
            file_ranks={name: rank for rank, name in enumerate(sorted(names))},
            done=done,
            skip=skip,
            give_up=give_up,
            existing={dest_id: part.existing for dest_id, part in {**staged, **checked}.items()},
            primary_keys={dest_id: part.primary_keys for dest_id, part in staged.items()},
            stages={dest_id: part.stage for dest_id, part in staged.items() if part.stage is not None},
            objects={dest_id: part.objects for dest_id, part in reached.items() if part.objects is not None},
            direct={dest_id: part.direct for dest_id, part in direct.items() if part.direct is not None},
            task_commits=frozenset(dest_id for dest_id, part in staged.items() if part.task_commits),
            sql_types={dest_id: part.sql_types for dest_id, part in checked.items()},
            split_done=_split_done(reached, splits),
            geo_path=self.config.geo.maxmind_path,
            max_columns=self.config.server.max_columns,
            chunk_rows=self.chunk_rows,
            pass_bytes=pass_bytes,
            replay_destination=only,
            recognition={dest_id: part.recognition for dest_id, part in staged.items() if part.recognition},
            splits=splits,
            reader=self.store.reader,
            spool_target=self.store.spool_target(job_id),
            log_sizes={p.name: p.size for p in logs},
        )

    def _reach(
        self,
        job_id: str,
        pass_bytes: int,
        names: list[str],
        statuses: dict[str, LogStatus],
        schedule: _Schedule,
        adapters: dict[str, DestinationAdapter],
        dest_errors: dict[str, str],
        failed_events: FailedEvents,
        only: str | None,
    ) -> dict[str, _Reached]:
        """The batch destinations the job loads (some pair due; only `only` when set), in config
        order: each connected and prepared, or, when it cannot be reached, routed without a
        connection if its logs give up (`_unreachable`), else left out (its `dest_errors`)."""
        reached: dict[str, _Reached] = {}
        for dest_id, dest in self.config.destinations.items():
            wanted = schedule.wanted(dest_id)
            if dest.mode != "batch" or (only is not None and dest_id != only) or not wanted:
                continue  # nothing due: not even connected
            try:
                adapter = adapters[dest_id] = build_destination(dest_id, dest, self.events_dir)
                reached[dest_id] = self._prepare_destination(
                    job_id, pass_bytes, dest_id, dest, adapter, names, statuses, failed_events
                )
            except DestinationError as exc:
                log.warning("destination %s is skipped this pass: %s", dest_id, exc)
                dest_errors[dest_id] = str(exc)
                giving_up = self._unreachable(dest_id, wanted, schedule, failed_events)
                if giving_up:  # routed, chained, never staged
                    reached[dest_id] = _recorded(dest_id, dest, statuses, giving_up)
        return reached

    def _unreachable(
        self,
        dest_id: str,
        wanted: list[str],
        schedule: _Schedule,
        failed_events: FailedEvents,
    ) -> set[str]:
        """A destination this pass cannot reach: the logs whose retries of it are over give up
        (the executors need no connection to send events to failed/: returned, the job routes to
        it); the others wait."""
        giving_up = {name for name in wanted if (name, dest_id) in schedule.whole}
        routed = [name for name in wanted if (name, dest_id) not in schedule.optional]
        schedule.unreached.update((name, dest_id) for name in routed if name not in giving_up)
        if giving_up:  # else its parked groups wait for a pass that can read its load markers
            failed_events.settle_unreachable(dest_id, giving_up)
        return giving_up

    def _plan_pairs(
        self, reached: dict[str, _Reached], names: list[str], statuses: dict[str, LogStatus], schedule: _Schedule
    ) -> tuple[dict[_Key, frozenset[str]], frozenset[_Key], dict[_Key, dict[str, str]]]:
        """`JobPlan.done`, `.skip` and `.give_up` of every (log, destination) of the job."""
        done: dict[_Key, frozenset[str]] = {}
        give_up: dict[_Key, dict[str, str]] = {}
        skip = set()
        for name in names:
            for dest_id, part in reached.items():
                key = (name, dest_id)
                reached_now = part.connected or key in schedule.whole
                if key not in schedule.work or key in schedule.unreached or not reached_now:
                    skip.add(key)
                    continue
                tables = statuses[name].get(dest_id, {})
                settled = {table for table, pair in tables.items() if pair.settled}
                if part.connected:
                    done[key] = frozenset(settled | schedule.waiting.get(key, set()))
                    reasons = {t: why for t, why in schedule.give_up.get(key, {}).items() if t not in settled}
                else:  # unreachable for longer than the maximum age: every failed table gives up
                    done[key] = frozenset(settled)
                    reasons = schedule.whole[key]
                if reasons:
                    give_up[key] = reasons
        return done, frozenset(skip), give_up

    def _prepare_destination(
        self,
        job_id: str,
        pass_bytes: int,
        dest_id: str,
        dest: Any,
        adapter: DestinationAdapter,
        names: list[str],
        statuses: dict[str, LogStatus],
        failed_events: FailedEvents,
    ) -> _Reached:
        # What a killed pass left behind; a day is far longer than any pass.
        adapter.drop_stale_stages(time.time() - STALE_STAGE_SECONDS)
        failed_events.recover_parked(adapter, dest_id)
        if adapter.capabilities.stage == "objects":
            # The files family: no tables to read, no load markers. Executors write one object per
            # log (split) and table, named after the log, so a rerun overwrites what a killed pass
            # wrote; the status files alone record which pairs are done.
            return _Reached(dest, objects=adapter.stage_target(job_id, pass_bytes))  # type: ignore[arg-type]
        # Markers first: a pair committed before a crash is uploaded, whatever the status file says.
        for name, table in adapter.loaded_files(dest_id, names):
            statuses[name].setdefault(dest_id, {})[table] = PairStatus(True)
        tables = adapter.read_tables()
        keys = tuple(dest.data_layout.primary_key_fields)
        part = _Reached(dest, stage=adapter.stage_target(job_id, pass_bytes), primary_keys=keys)
        self._staged.add(dest_id)
        part.existing = {
            name: {column: adapter.data_type_of(sql_type) for column, sql_type in table.columns.items()}
            for name, table in tables.items()
        }
        caps = adapter.capabilities
        if caps.direct_writes or caps.task_commits:
            # Splits committed with their markers before a crash: not written again, whatever the config says now.
            part.split_markers = adapter.loaded_splits(dest_id, names)
        # Keyed rows: per key bucket where concurrent upserts are safe, else one commit orders them.
        part.task_commits = caps.task_commits and (not keys or caps.keyed_task_commits)
        if part.task_commits:
            self._catalog.update({(dest_id, name): dict(t.columns) for name, t in tables.items()})
        if caps.direct_writes and not keys:  # keyed rows stay staged: the commit orders upserts across splits
            part.direct = adapter.direct_target(job_id)
            part.sql_types = {name: dict(t.columns) for name, t in tables.items() if not t.primary_keys}
        section = recognition_of(self.config, dest)
        if section is not None:
            part.recognition = (section.anonymous_id_node, tuple(section.nodes()))
        return part

    # --- the job ------------------------------------------------------------------------------

    def _execute(self, session: Any, plan: JobPlan, job_id: str) -> _Collected:
        context = session.sparkContext

        def task(index: int, mine: Iterator[list[Split]]) -> list[TaskResult]:
            return process_splits(plan, index, (split for group in mine for split in group))

        # Consecutive splits grouped into at most TASKS_PER_CORE tasks per core: a task costs the
        # JVM ~20 ms and the Python worker more, so one task per 16 MiB split spent ~17 % of a
        # pass's CPU on tasks (measured on 600k events: 41 tasks → 8). The groups are cut by bytes
        # so that the cores finish together (`group_splits`), and each is one element of the RDD,
        # so one task: `parallelize` alone would cut by count. Each split still commits alone
        # (markers, memory). Only each task's TaskResult comes back to the driver.
        groups = group_splits(plan.splits, context.defaultParallelism, TASKS_PER_CORE)
        connections = self.config.spark.commit_connections
        self._commit_workers = connections or min(context.defaultParallelism, DEFAULT_CONNECTIONS)
        plan.key_buckets = key_buckets(self._commit_workers)  # a bucket per connection: `batch.commits`
        if not groups:
            return _Collected()
        results = context.parallelize(groups, len(groups)).mapPartitionsWithIndex(task).collect()
        collected = _Collected()
        folder = self.events_dir / "staging" / job_id / "failed"
        for result in results:
            for count in result.counts:
                if count.spool and plan.spool_target is not None:  # uploaded by the executor
                    count.spool = str(self.store.fetch_spool(count.spool, folder))
            _fold(collected, result)
        return collected

    # --- after the job ------------------------------------------------------------------------

    def _load(
        self, collected: _Collected, adapters: dict[str, DestinationAdapter], result: JobResult
    ) -> dict[tuple[str, str], str]:
        outcomes: dict[tuple[str, str], str] = {}
        in_tasks: list[tuple[str, str]] = []
        for key in sorted(collected.pairs):
            pair = collected.pairs[key]
            dest = self.config.destinations[pair.dest_id]
            keys = tuple(dest.data_layout.primary_key_fields)
            adapter = adapters[pair.dest_id]
            if (pair.units or pair.buckets) and not pair.error and _units_cover(pair):
                in_tasks.append(key)  # patched, then committed per task: `_commit_in_tasks`
                continue
            if pair.error:
                error = pair.error
            elif adapter.capabilities.stage == "objects":
                self._fenced(f"the commit of {pair.dest_id}.{pair.table}")
                error = commit_objects(adapter, pair)
            elif not pair.chunks:
                # Every row went straight into the table (committed with its split markers), or its
                # splits were written by an earlier pass: nothing to patch or commit.
                error = ""
            else:
                self._fenced(f"the commit of {pair.dest_id}.{pair.table}")
                max_columns, unmapped = self._column_rules(dest)
                error = load_pair(adapter, self.coordination, pair, keys, max_columns, self.fault, unmapped)
            outcomes[key] = error
            result.pair(*key).error = error
            if self.fault is not None:
                self.fault("pair committed")
        if not in_tasks:
            return outcomes
        with CommitPool(self.config.destinations, self.events_dir, self._commit_workers, self.fault) as pool:
            for key in in_tasks:
                pair = collected.pairs[key]
                self._fenced(f"the commit of {pair.dest_id}.{pair.table}")
                error = outcomes[key] = self._commit_in_tasks(pool, adapters[pair.dest_id], pair, collected)
                result.pair(*key).error = error
                if self.fault is not None:
                    self.fault("pair committed")
        return outcomes

    def _column_rules(self, dest: Any) -> tuple[int, UnmappedRule | None]:
        """The destination's maximum of columns and its rule for the fields past it."""
        max_columns = dest.data_layout.max_columns or self.config.server.max_columns
        return max_columns, UnmappedRule.of(dest.data_layout, max_columns)

    def _commit_in_tasks(
        self, pool: CommitPool, adapter: DestinationAdapter, pair: PairLoad, collected: _Collected
    ) -> str:
        """Task commits (`batch.commits`) of one pair, under its table's lock: the patch, then its
        units in parallel (a commit casts to the types the patch left), then, for key buckets,
        the logs' markers; the splits of the units that committed are noted as written
        (`_record_written`). Returns '' or the pair's first failure."""
        dest = self.config.destinations[pair.dest_id]
        max_columns, unmapped = self._column_rules(dest)
        primary_keys = tuple(dest.data_layout.primary_key_fields)
        try:
            with self.coordination.lock(table_lock(pair.dest_id, pair.table), LOCK_TIMEOUT):
                table = patch_pair(adapter, self.coordination, pair, primary_keys, max_columns, unmapped)
                collected.columns[pair.dest_id, pair.table] = dict(table.columns)
                if self.fault is not None:
                    self.fault("staged")
                if table.primary_keys and not pair.buckets:
                    # A key the table has and the config does not name: one commit, as its upserts
                    # must not run at once (and the chunks carry no order: any row of a key wins).
                    adapter.commit(Load(pair.dest_id, table, pair.chunks, sorted(pair.files)))
                    return ""
                units = _units(pair, table)
                pool.commit(units)
                _note_written(collected, units)
                error = next((unit.error for unit in units if unit.error), "")
                if pair.buckets and not error:
                    adapter.mark_loaded(pair.dest_id, pair.table, sorted(pair.files))
                return error
        except LOAD_ERRORS as exc:
            return load_failure(pair, exc)

    def _settle(
        self,
        logs: list[LogFile],
        statuses: dict[str, LogStatus],
        schedule: _Schedule,
        fresh: set[tuple[str, str]],
        plan: JobPlan,
        collected: _Collected,
        outcomes: dict[tuple[str, str], str],
        dest_errors: dict[str, str],
        failed_events: FailedEvents,
        result: JobResult,
    ) -> list[LogFile]:
        """Records the pass's outcomes (statuses, failed events); returns the logs to archive."""
        now = schedule.now
        updates: dict[str, LogStatus] = defaultdict(dict)
        for (name, dest_id, table), (rows, failed, skipped) in collected.counts.items():
            summary = result.pair(dest_id, table)
            summary.rows, summary.failed, summary.skipped = (
                summary.rows + rows,
                summary.failed + failed,
                summary.skipped + skipped,
            )
            tables = updates[name].setdefault(dest_id, {})
            if table != NO_TABLE:
                error = outcomes.get((dest_id, table), "")
                tables[table] = _outcome(error, now)
        _record_written(plan, collected, updates)
        for name in plan.file_tokens:
            for dest_id in plan.destinations:
                if (name, dest_id) not in plan.skip:  # processed, maybe without any table: not read for it again
                    updates[name].setdefault(dest_id, {})
        self._record_give_ups(plan, statuses, collected, updates, result)
        self._record_destination_errors(statuses, schedule, dest_errors, updates, result)
        merged = self._write_outcomes(logs, statuses, updates, plan, failed_events)
        for dest_id, events in sorted(result.gave_up.items()):  # as loud as the stream worker's give-up
            log.error(
                "batch %s: %d event(s) failed for longer than the retry policy's max age; in failed/ (replay them)",
                dest_id,
                events,
            )
        result.kept.extend(self.store.shown(p) for p, status in merged.items() if not all_uploaded(status))
        return [logfile for logfile, status in merged.items() if all_uploaded(status)]

    def _archive(self, session: Any, logs: list[LogFile]) -> list[Any]:
        """Settled logs to the archive, and out of incoming/ with their status (`LogStore.archive`:
        gzipped by threads on this machine, or by executors on object storage)."""
        if not logs:
            return []
        self._fenced("the archive")
        archived = self.store.archive(logs, session)
        self._archived.extend(logfile.name for logfile in logs)
        return archived

    def _forget_markers(self, adapters: dict[str, DestinationAdapter]) -> None:
        """Removes the load markers of the logs this job archived from the destinations it reached
        (`forget_loaded`) when the store's archive is final: nothing reads them again. Markers of
        logs already gone from incoming/ need no lock. A failure only leaves rows behind: logged."""
        if not self._archived or not self.store.archive_is_final:
            return
        for dest_id, adapter in sorted(adapters.items()):
            try:
                adapter.forget_loaded(dest_id, self._archived)
            except DestinationError as exc:
                log.warning("%s: could not remove the load markers of archived logs: %s", dest_id, exc)

    def _fenced(self, step: str) -> None:
        """Stops the pass before `step` when the cluster's pass lock was lost (`fence`)."""
        if self.fence is not None:
            self.fence(step)

    def _write_outcomes(
        self,
        logs: list[LogFile],
        statuses: dict[str, LogStatus],
        updates: dict[str, LogStatus],
        plan: JobPlan,
        failed_events: FailedEvents,
    ) -> dict[LogFile, LogStatus]:
        """Writes the status files while the failed lines of the pairs they settle are appended
        (`FailedEvents.append_settled`); returns the statuses."""
        with failed_events.append_settled(updates):
            merged = {p: self._merged_status(p, statuses[p.name], updates.get(p.name, {}), plan) for p in logs}
            self.store.write_statuses(merged)
            if self.fault is not None:
                self.fault("statuses written")
        return merged

    def _record_give_ups(
        self,
        plan: JobPlan,
        statuses: dict[str, LogStatus],
        collected: _Collected,
        updates: dict[str, LogStatus],
        result: JobResult,
    ) -> None:
        """Pairs that gave up this pass: settled, their events in failed/ (`plan.give_up`)."""
        for (name, dest_id), reasons in plan.give_up.items():
            old = statuses[name].get(dest_id, {})
            tables = updates[name].setdefault(dest_id, {})
            whole = reasons.get(NO_TABLE)
            # Tables that got events this pass (maybe new ones, when the whole destination gives up).
            names = set(reasons) | ({t for t in tables if t != NO_TABLE} if whole is not None else set())
            for table in names:
                before = old.get(table) or PairStatus(False)
                if not before.settled:
                    why = reasons.get(table) or whole or ""
                    tables[table] = PairStatus(
                        False, why, before.attempts, before.first_failed, before.last_attempt, 0.0, gave_up=True
                    )
        for (name, dest_id, table), (_rows, failed, _skipped) in collected.counts.items():
            reasons = plan.give_up.get((name, dest_id))
            if failed and table != NO_TABLE and reasons and (table in reasons or NO_TABLE in reasons):
                result.gave_up[dest_id] = result.gave_up.get(dest_id, 0) + failed

    def _record_destination_errors(
        self,
        statuses: dict[str, LogStatus],
        schedule: _Schedule,
        dest_errors: dict[str, str],
        updates: dict[str, LogStatus],
        result: JobResult,
    ) -> None:
        """A destination unusable this pass keeps the logs it had to load, as a FAILED '' pair.

        Its age starts at the oldest failure of the log's pairs for that destination: those events
        have waited since, and give up at the same maximum age."""
        now = schedule.now
        for name, dest_id in sorted(schedule.unreached):
            firsts = [p.first_failed for p in statuses[name].get(dest_id, {}).values() if not p.settled]
            first = min([t for t in firsts if t > 0] + [now])
            updates[name].setdefault(dest_id, {})[NO_TABLE] = PairStatus(False, dest_errors[dest_id], 1, first, now)
        for dest_id, error in dest_errors.items():
            result.pair(dest_id, NO_TABLE).error = error

    def _merged_status(self, path: LogFile, old: LogStatus, update: LogStatus, plan: JobPlan) -> LogStatus:
        """The log's status with this pass's outcomes and the retries' times."""
        merged = merge_status(old, update)
        connected = set(plan.stages) | set(plan.objects)
        for dest_id in connected:
            if (path.name, dest_id) not in plan.skip:
                # Reached this pass: a destination-wide error of an earlier pass is over.
                merged.get(dest_id, {}).pop(NO_TABLE, None)
        self._schedule_retries(merged)
        return merged

    def _schedule_retries(self, status: LogStatus) -> None:
        """Sets `next_attempt` of every failed pair from its destination's retry policy."""
        for dest_id, tables in status.items():
            dest = self.config.destinations.get(dest_id)
            if dest is None:
                continue
            policy = retry_policy(self.config, dest)
            for pair in tables.values():
                if not pair.settled and pair.attempts:
                    pair.next_attempt = policy.next_attempt(pair.attempts, pair.last_attempt)

    def _cleanup(self, adapter: DestinationAdapter, job_id: str, staged: bool) -> None:
        try:
            if staged:
                adapter.drop_stages(job_id)
        except DestinationError as exc:
            log.warning("could not drop the staging of job %s: %s", job_id, exc)
        finally:
            adapter.close()


class _Phases:
    """Adds the seconds since the previous lap to a phase of `JobResult.timings`."""

    def __init__(self, timings: dict[str, float]) -> None:
        self.timings = timings
        self.last = time.monotonic()

    def lap(self, phase: str) -> float:
        now = time.monotonic()
        took, self.last = now - self.last, now
        self.timings[phase] = self.timings.get(phase, 0.0) + took
        return took


def _fold(collected: _Collected, result: TaskResult) -> None:
    for count in result.counts:
        key = (count.file, count.dest_id, count.table)
        counts = collected.counts[key]
        counts[0] += count.rows
        counts[1] += count.failed
        counts[2] += count.skipped
        if count.spool:
            collected.spools[key].append(Path(count.spool))
        if count.rows and count.table != NO_TABLE:
            _pair(collected, count.dest_id, count.table).files.add(count.file)
    for (dest_id, table), error in result.errors.items():
        pair = _pair(collected, dest_id, table)
        pair.error = pair.error or error
    for staged in result.staged:
        pair = _pair(collected, staged.dest_id, staged.table)
        pair.chunks.append(staged.chunk)
        pair.header.merge(staged.header)
        if staged.bucket is not None:
            pair.buckets.setdefault(staged.bucket, []).append(staged.chunk)
    for (dest_id, table), splits in result.staged_splits.items():
        chunks = [s.chunk for s in result.staged if s.dest_id == dest_id and s.table == table]
        if chunks:  # else none was written: the pair failed (`TaskResult.errors`)
            _pair(collected, dest_id, table).units.append(TaskUnit(chunks, splits))
    for direct in result.direct:
        for table in direct.rows:
            _pair(collected, direct.dest_id, table)  # no chunks: nothing to commit (`_load`)
            collected.written[direct.file, direct.dest_id, table].add(direct.split)
    collected.samples += [sample for _file, _dest_id, sample in result.samples]
    for dest_id, seen in result.sightings.items():
        collected.sightings.setdefault(dest_id, Sightings()).merge(seen)


def _units(pair: PairLoad, table: Table) -> list[UnitCommit]:
    """The units of a pair's task commits: its tasks' chunks, or its key buckets."""
    units = [UnitCommit(pair.dest_id, table, unit) for unit in pair.units]
    for _bucket, chunks in sorted(pair.buckets.items()):
        units.append(UnitCommit(pair.dest_id, table, TaskUnit(chunks, []), ordered=True))
    return units


def _note_written(collected: _Collected, units: list[UnitCommit]) -> None:
    """The splits of the units that committed, as direct writes note theirs (`_record_written`)."""
    for unit in units:
        if unit.done:
            for split in unit.unit.splits:
                collected.written[split_range(split)[0], unit.dest_id, unit.table.name].add(split)


def _units_cover(pair: PairLoad) -> bool:
    """Whether the task units of a pair hold every chunk staged for it; else (a bug) the pair is
    committed whole on the driver, as without task commits, rather than lose a chunk."""
    units = sum(len(unit.chunks) for unit in pair.units) + sum(len(chunks) for chunks in pair.buckets.values())
    if units == len(pair.chunks):
        return True
    log.error("destination %s, table %s: task units miss staged chunks: committed whole", pair.dest_id, pair.table)
    pair.units, pair.buckets = [], {}
    return False


def _pair(collected: _Collected, dest_id: str, table: str) -> PairLoad:
    found = collected.pairs.get((dest_id, table))
    if found is None:
        found = collected.pairs[dest_id, table] = PairLoad(dest_id, table, BatchHeader(table))
    return found


def _known_splits(reached: dict[str, _Reached]) -> dict[str, set[tuple[int, int]]]:
    """Log name → (start, end) of its splits with per-split load markers: `plan_splits` keeps them."""
    known: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for part in reached.values():
        for key, _table in part.split_markers:
            with contextlib.suppress(ValueError):  # not a split key: never made by a pass
                name, start, end = split_range(key)
                known[name].add((start, end))
    return known


def _split_done(reached: dict[str, _Reached], splits: list[Split]) -> frozenset[tuple[str, str, str]]:
    """`JobPlan.split_done`: (split key, destination, table) of the markers of this job's splits."""
    keys = {split.key for split in splits}
    done = set()
    for dest_id, part in reached.items():
        for key, table in part.split_markers:
            if key in keys:
                done.add((key, dest_id, table))
            else:  # overlapping markers (`plan_splits` keeps the first): never made by a pass
                log.warning("destination %s, table %s: load marker of split %s not kept", dest_id, table, key)
    return frozenset(done)


def _record_written(plan: JobPlan, collected: _Collected, updates: dict[str, LogStatus]) -> None:
    """Notes in the outcome of each pair left failing the splits written directly into its table
    (this pass's and the earlier ones': `plan.split_done`) and the table's column types, so that a
    pass that cannot read their load markers and the table still knows them (`_recorded`)."""
    written: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for key, keys in collected.written.items():
        written[key] |= keys
    for split, dest_id, table in plan.split_done:
        with contextlib.suppress(ValueError):
            written[split_range(split)[0], dest_id, table].add(split)
    for (name, dest_id, table), keys in written.items():
        pair = updates.get(name, {}).get(dest_id, {}).get(table)
        if pair is not None and not pair.settled:
            pair.written = tuple(sorted(keys))
            pair.columns = dict(
                collected.columns.get((dest_id, table)) or plan.sql_types.get(dest_id, {}).get(table) or {}
            )


def _recorded(dest_id: str, dest: Any, statuses: dict[str, LogStatus], names: set[str]) -> _Reached:
    """The part of a destination this pass cannot reach, whose logs `names` give up: routed,
    never staged. The splits its executors wrote before, and the column types they were checked
    against, come from the status files (`PairStatus.written`): their rows are in its tables, so
    they are checked again as a direct write checks them, and only their failures go to failed/
    (`_split_done`); the other events, with the give-up reason."""
    part = _Reached(dest)
    latest: dict[str, float] = {}
    for name in names:
        for table, pair in statuses[name].get(dest_id, {}).items():
            if pair.settled or not pair.written:
                continue
            part.split_markers.update((key, table) for key in pair.written if key.startswith(f"{name}@"))
            if pair.columns and pair.last_attempt >= latest.get(table, -1.0):  # the newest types read
                latest[table] = pair.last_attempt
                part.sql_types[table] = dict(pair.columns)
    try:
        dialect = destination_type(dest.type).dialect
    except ValueError:  # a type the registry lost since: checked without the table's types
        part.sql_types = {}
        return part
    part.existing = {
        table: {column: dialect.data_type_of(sql_type) for column, sql_type in columns.items()}
        for table, columns in part.sql_types.items()
    }
    return part


def _expired(policy: RetryPolicy, pair: PairStatus, now: float) -> bool:
    return pair.attempts > 0 and pair.first_failed > 0 and policy.expired(pair.first_failed, now)


def _schedule_pair(
    schedule: _Schedule, key: tuple[str, str], tables: dict[str, PairStatus] | None, policy: RetryPolicy
) -> None:
    """Decides one (log, destination) of `_Schedule` from its pairs in the log's status file."""
    now = schedule.now
    if tables is None:
        schedule.work.add(key)  # never processed
        return
    failing = {table: pair for table, pair in tables.items() if not pair.settled}
    whole = failing.get(NO_TABLE)
    if whole is not None and _expired(policy, whole, now):
        schedule.whole[key] = {t: give_up_reason(p.attempts, p.first_failed, now, p.error) for t, p in failing.items()}
    elif whole is not None and not due(whole.last_attempt, whole.next_attempt, now):
        return  # the destination was unreachable: not retried before its time, whatever the tables
    for table, pair in failing.items():
        if table == NO_TABLE:
            continue
        if _expired(policy, pair, now):
            schedule.give_up[key][table] = give_up_reason(pair.attempts, pair.first_failed, now, pair.error)
        elif not due(pair.last_attempt, pair.next_attempt, now):
            schedule.waiting[key].add(table)
    if whole is not None or len(failing) > len(schedule.waiting.get(key, ())):
        schedule.work.add(key)


def _outcome(error: str, now: float) -> PairStatus:
    """A pair's status after this pass's load: uploaded, deferred to the next pass (no attempt
    counted: `batch.load.Deferred`), or a failed attempt."""
    if not error:
        return PairStatus(True)
    if isinstance(error, Deferred):
        return PairStatus(False, error)
    return PairStatus(False, error, 1, now, now)
