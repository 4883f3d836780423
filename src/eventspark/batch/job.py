"""One batch pass: one Spark job over a set of rotated logs, then loads, status files, archive.

Driver steps, in order:
1. drop empty logs; read each log's status file and the destinations' load markers (a marker means
   the pair was committed even if the status file never heard of it: a crash came in between);
2. read the destinations' tables, so executors check values against the existing column types;
3. run the job: executors multiplex lines to destinations, run the step chain, stage rows and
   spool failed events; the driver collects only counts, chunk references and BatchHeaders;
4. per destination/table pair: merge the headers, patch the table and commit the chunks
   (`batch.load`); a pair that fails is recorded FAILED with its attempts, and retried by the first
   pass after its back-off (`eventspark.retry`; before it, that pair of the log is not read, and a
   log with nothing due is not read at all); past the policy's maximum age its events go to
   `failed/` with the reason instead (the pair *gave up*);
5. append the failed events of settled pairs to `failed/`, each line exactly once across crashes
   (parked before the commits, appended under a journal: see `logs.failed`), write the status
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

import orjson

from eventspark.batch.load import Deferred, Fault, PairLoad, commit_objects, load_pair
from eventspark.batch.partition import NO_TABLE, SUMMARY_FIELDS, process_splits
from eventspark.batch.plan import DEFAULT_CHUNK_ROWS, JobPlan, token_routes
from eventspark.batch.splits import Split, plan_splits
from eventspark.config import LoadedConfig
from eventspark.coordination import Coordination
from eventspark.destinations import build_destination
from eventspark.destinations.base import DestinationAdapter, DestinationError, StagedChunk, new_job_id
from eventspark.logs.archive import archive_log
from eventspark.logs.failed import (
    PENDING_DIR,
    ParkedSpools,
    append_groups,
    appending,
    finish_appends,
    park_spools,
    parked_spools,
    recover_journal,
    settle_recovered,
)
from eventspark.logs.replay import replay_destination
from eventspark.logs.rotated import rotated_token
from eventspark.logs.status import (
    LogStatus,
    PairStatus,
    all_uploaded,
    merge_status,
    processed,
    read_status,
    write_status,
)
from eventspark.logs.status import status_path as _status_path
from eventspark.ops.cache_results import settle_samples
from eventspark.recognition.service import Recognizer, recognition_of
from eventspark.recognition.state import done_sightings, keep_sightings
from eventspark.retry import RetryPolicy, due, give_up_reason, retry_policy
from eventspark.steps.diff import UnmappedRule
from eventspark.steps.recognition import Sightings
from eventspark.steps.typing import BatchHeader

log = logging.getLogger(__name__)

STALE_STAGE_SECONDS = 24 * 3600


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
    pairs: dict[tuple[str, str], PairSummary] = field(default_factory=dict)
    archived: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)
    deleted_empty: list[Path] = field(default_factory=list)
    held: dict[str, str] = field(default_factory=dict)
    """Rotated logs left in incoming/ untouched (also in `kept`): log name → why (`_hold_unroutable`)."""
    samples: list[dict[str, Any]] = field(default_factory=list)
    """A sample of the pass's events with their outcome, for the events cache (`ops.cache_results`)."""
    waiting: list[Path] = field(default_factory=list)
    """Rotated logs not read this pass (also in `kept`): none of their failed pairs is due yet."""
    gave_up: dict[str, int] = field(default_factory=dict)
    """Destination id → events sent to `failed/` because their pair gave up (the retry policy)."""

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
    """The summary rows of every task, folded."""

    counts: dict[tuple[str, str, str], list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0, 0]))
    spools: dict[tuple[str, str, str], list[Path]] = field(default_factory=lambda: defaultdict(list))
    pairs: dict[tuple[str, str], PairLoad] = field(default_factory=dict)
    samples: list[str] = field(default_factory=list)
    sightings: dict[str, Sightings] = field(default_factory=dict)
    """Users recognition: per destination, the ids the tasks saw (`steps.recognition`)."""


class BatchJob:
    """Runs passes for one config; holds no Spark or database state between passes."""

    def __init__(
        self,
        loaded: LoadedConfig,
        coordination: Coordination,
        fault: Fault | None = None,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = loaded.config
        self.coordination = coordination
        self.fault = fault
        self.chunk_rows = chunk_rows
        self.clock = clock
        """Epoch seconds: the retry policy's time (tests move it instead of sleeping)."""
        self.events_dir = Path(self.config.log.path)
        self._staged: set[str] = set()

    def run(self, session: Any, logs: list[Path]) -> JobResult:
        result = JobResult()
        self.recover_failed()
        logs = self._drop_empty(logs, result)
        # Replay logs (`logs.replay`) load into one destination each: a job of their own.
        groups: dict[str | None, list[Path]] = defaultdict(list)
        for path in logs:
            groups[replay_destination(path.name)].append(path)
        batch = self._batch_destinations()
        if None in groups:
            groups[None] = self._hold_unroutable(groups[None], result)
        for only, group in sorted(groups.items(), key=lambda item: item[0] or ""):
            if only is not None and only not in batch:
                log.warning("replay logs for %s kept: it is not a batch destination of this config", only)
                result.kept.extend(group)
                continue
            if group:
                self._run_job(session, group, only, result)
        return result

    def _batch_destinations(self) -> dict[str, Any]:
        """Destination id → config of the batch destinations."""
        return {d: dest for d, dest in self.config.destinations.items() if dest.mode == "batch"}

    def _hold_unroutable(self, logs: list[Path], result: JobResult) -> list[Path]:
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
            result.kept.append(path)
        return routable

    def _run_job(self, session: Any, logs: list[Path], only: str | None, result: JobResult) -> None:
        job_id = new_job_id(time.time())
        adapters: dict[str, DestinationAdapter] = {}
        try:
            self._run(session, logs, job_id, adapters, result, only)
        finally:
            for dest_id, adapter in adapters.items():
                self._cleanup(adapter, job_id, staged=dest_id in self._staged)
            shutil.rmtree(self.events_dir / "staging" / job_id, ignore_errors=True)

    def _run(
        self,
        session: Any,
        logs: list[Path],
        job_id: str,
        adapters: dict[str, DestinationAdapter],
        result: JobResult,
        only: str | None = None,
    ) -> JobResult:
        statuses = {p.name: read_status(p) for p in logs}
        schedule = self._schedule(logs, statuses, only)
        logs = self._idle(logs, statuses, schedule, result)
        if not logs:
            return result
        # Destinations a log's status file has not seen processed: their template failures are
        # written this pass (decided before load markers repair the statuses after a crash).
        seen = {(name, d) for name, status in statuses.items() for d in status if processed(status, d)}
        dest_errors: dict[str, str] = {}
        plan = self._plan(job_id, logs, statuses, schedule, adapters, dest_errors, only)
        fresh = {(name, d) for name in plan.file_tokens for d in plan.destinations if (name, d) not in plan.skip}
        fresh -= seen
        started = time.monotonic()
        collected = self._execute(session, logs, plan) if plan.destinations else _Collected()
        executed = time.monotonic()
        # Users recognition's ids outlive a crash between the commits and its run (`recognition.state`).
        keep_sightings(self.events_dir, collected.sightings, set(plan.recognition))
        parked = self._park_failed(collected, fresh)
        outcomes = self._load(collected, adapters, result)
        self._recognize(collected, adapters)
        result.samples += settle_samples(collected.samples, outcomes)
        log.info(
            "job %s: %d log(s), Spark stage %.2f s, patch and commit %.2f s",
            job_id,
            len(logs),
            executed - started,
            time.monotonic() - executed,
        )
        if self.fault is not None:
            self.fault("committed")
        self._settle(logs, statuses, schedule, fresh, plan, collected, outcomes, dest_errors, parked, result)
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

    def _drop_empty(self, logs: list[Path], result: JobResult) -> list[Path]:
        kept = []
        for path in logs:
            if path.stat().st_size == 0:
                path.unlink()
                _status_path(path).unlink(missing_ok=True)
                result.deleted_empty.append(path)
            else:
                kept.append(path)
        return kept

    # --- the retry policy ---------------------------------------------------------------------

    def _schedule(self, logs: list[Path], statuses: dict[str, LogStatus], only: str | None) -> _Schedule:
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
        self, logs: list[Path], statuses: dict[str, LogStatus], schedule: _Schedule, result: JobResult
    ) -> list[Path]:
        """The logs this pass reads. The others wait for their next retry, untouched, or go to the
        archive when every pair is settled already (a crash between the status and the archive)."""
        active = {name for name, _dest_id in schedule.work}
        schedule.work.update(key for key in schedule.optional if key[0] in active)
        read = []
        for path in logs:
            status = statuses[path.name]
            if path.name in active:
                read.append(path)
            elif status and all_uploaded(status):
                result.archived.append(archive_log(path, self.events_dir / "archive"))
            else:
                result.kept.append(path)
                result.waiting.append(path)
        return read

    def recover_failed(self) -> None:
        """What a pass cut short may have appended to the failed logs is undone (`logs.failed`)
        before this pass appends anything; its parked groups that the status files show settled are
        appended (the others wait for a pass that reads their destination's load markers). Also
        run by a pass with no log to read (`batch.process.run_pass`): no Spark, no connection."""
        failed_dir = self.events_dir / "failed"
        if not (failed_dir / PENDING_DIR).is_dir():
            return  # nothing parked, no journal: the usual case
        batch = self._batch_destinations()
        for dest_id in batch:
            if recover_journal(failed_dir, dest_id):
                log.info("destination %s: the failed-log appends of a pass cut short were undone", dest_id)
        parked = _parked_by_destination(failed_dir)
        for dest_id in batch:
            if parked[dest_id]:
                settle_recovered(failed_dir, dest_id, parked[dest_id], lambda g: True if self._settled(g) else None)

    def _settled(self, group: ParkedSpools) -> bool:
        """Whether the status files show the pair of a parked group settled (a log gone from
        incoming/ was archived: settled)."""
        path = self.events_dir / "incoming" / group.log
        if not path.exists():
            return True
        status = read_status(path)
        if group.table == NO_TABLE:
            return processed(status, group.dest_id)
        pair = status.get(group.dest_id, {}).get(group.table)
        return pair is not None and pair.settled

    def _plan(
        self,
        job_id: str,
        logs: list[Path],
        statuses: dict[str, LogStatus],
        schedule: _Schedule,
        adapters: dict[str, DestinationAdapter],
        dest_errors: dict[str, str],
        only: str | None = None,
    ) -> JobPlan:
        """`only`: the destination of a job over replay logs (every line goes there)."""
        names = [p.name for p in logs]
        plan = JobPlan(job_id, str(self.events_dir / "staging"), {}, {}, {}, (), {}, {})
        plan.replay_destination = only
        plan.geo_path = self.config.geo.maxmind_path
        plan.max_columns = self.config.server.max_columns
        plan.chunk_rows = self.chunk_rows
        plan.pass_bytes = sum(p.stat().st_size for p in logs)
        parked = _parked_by_destination(self.events_dir / "failed")
        for dest_id, dest in self.config.destinations.items():
            wanted = schedule.wanted(dest_id)
            if dest.mode != "batch" or (only is not None and dest_id != only) or not wanted:
                continue  # nothing due: not even connected
            try:
                adapter = adapters[dest_id] = build_destination(dest_id, dest, self.events_dir)
                self._prepare_destination(plan, dest_id, dest, adapter, names, statuses, parked[dest_id])
            except DestinationError as exc:
                log.warning("destination %s is skipped this pass: %s", dest_id, exc)
                dest_errors[dest_id] = str(exc)
                plan.stages.pop(dest_id, None)
                plan.objects.pop(dest_id, None)
                plan.destinations.pop(dest_id, None)
                self._unreachable(plan, dest_id, dest, wanted, schedule, parked[dest_id])
        routes = token_routes(self.config.api_keys, plan.destinations)
        plan.secret_tokens, plan.token_destinations, plan.default_destinations = routes
        if only is not None:  # whatever token a replayed event came with
            plan.secret_tokens, plan.token_destinations, plan.default_destinations = {}, {}, (only,)
        plan.file_tokens = {name: rotated_token(name) or "" for name in names}
        plan.file_ranks = {name: rank for rank, name in enumerate(sorted(names))}
        self._plan_pairs(plan, names, statuses, schedule)
        return plan

    def _unreachable(
        self,
        plan: JobPlan,
        dest_id: str,
        dest: Any,
        wanted: list[str],
        schedule: _Schedule,
        parked: list[ParkedSpools],
    ) -> None:
        """A destination this pass cannot reach: the logs whose retries of it are over give up
        (the executors need no connection to send events to failed/); the others wait."""
        giving_up = {name for name in wanted if (name, dest_id) in schedule.whole}
        routed = [name for name in wanted if (name, dest_id) not in schedule.optional]
        schedule.unreached.update((name, dest_id) for name in routed if name not in giving_up)
        if not giving_up:
            return  # its parked groups wait for a pass that can read its load markers
        plan.destinations[dest_id] = dest  # routed, chained, never staged

        def settled(group: ParkedSpools) -> bool | None:
            # No load markers to read: the status files decide. A failed pair of a log that gives
            # up now is dropped: its events go to failed/ again, with the give-up reason.
            if self._settled(group):
                return True
            return False if group.log in giving_up else None

        settle_recovered(self.events_dir / "failed", dest_id, parked, settled)

    def _plan_pairs(self, plan: JobPlan, names: list[str], statuses: dict[str, LogStatus], schedule: _Schedule) -> None:
        """`plan.skip`, `plan.done` and `plan.give_up` of every (log, destination) of the job."""
        connected = set(plan.stages) | set(plan.objects)
        skip = set()
        for name in names:
            for dest_id in plan.destinations:
                key = (name, dest_id)
                reached = dest_id in connected or key in schedule.whole
                if key not in schedule.work or key in schedule.unreached or not reached:
                    skip.add(key)
                    continue
                tables = statuses[name].get(dest_id, {})
                settled = {table for table, pair in tables.items() if pair.settled}
                if dest_id in connected:
                    plan.done[key] = frozenset(settled | schedule.waiting.get(key, set()))
                    reasons = {t: why for t, why in schedule.give_up.get(key, {}).items() if t not in settled}
                else:  # unreachable for longer than the maximum age: every failed table gives up
                    plan.done[key] = frozenset(settled)
                    reasons = schedule.whole[key]
                if reasons:
                    plan.give_up[key] = reasons
        plan.skip = frozenset(skip)

    def _prepare_destination(
        self,
        plan: JobPlan,
        dest_id: str,
        dest: Any,
        adapter: DestinationAdapter,
        names: list[str],
        statuses: dict[str, LogStatus],
        parked: list[ParkedSpools],
    ) -> None:
        # What a killed pass left behind; a day is far longer than any pass.
        adapter.drop_stale_stages(time.time() - STALE_STAGE_SECONDS)
        self._recover_parked(adapter, dest_id, parked)
        if adapter.capabilities.stage == "objects":
            # The files family: no tables to read, no load markers. Executors write one object per
            # log (split) and table, named after the log, so a rerun overwrites what a killed pass
            # wrote; the status files alone record which pairs are done.
            plan.objects[dest_id] = adapter.stage_target(plan.job_id, plan.pass_bytes)  # type: ignore[assignment]
            plan.destinations[dest_id] = dest
            return
        # Markers first: a pair committed before a crash is uploaded, whatever the status file says.
        for name, table in adapter.loaded_files(dest_id, names):
            statuses[name].setdefault(dest_id, {})[table] = PairStatus(True)
        tables = adapter.read_tables()
        plan.existing[dest_id] = {
            name: {column: adapter.data_type_of(sql_type) for column, sql_type in table.columns.items()}
            for name, table in tables.items()
        }
        plan.stages[dest_id] = adapter.stage_target(plan.job_id, plan.pass_bytes)
        self._staged.add(dest_id)
        plan.primary_keys[dest_id] = tuple(dest.data_layout.primary_key_fields)
        plan.destinations[dest_id] = dest
        section = recognition_of(self.config, dest)
        if section is not None:
            plan.recognition[dest_id] = (section.anonymous_id_node, tuple(section.nodes()))

    # --- the job ------------------------------------------------------------------------------

    def _execute(self, session: Any, logs: list[Path], plan: JobPlan) -> _Collected:
        context = session.sparkContext
        splits = plan_splits(logs, context.defaultParallelism)

        def task(index: int, mine: Iterator[Split]) -> list[tuple[Any, ...]]:
            return process_splits(plan, index, mine)

        # One split per task; only the summary rows come back to the driver.
        rows = context.parallelize(splits, len(splits)).mapPartitionsWithIndex(task).collect()
        collected = _Collected()
        for row in rows:
            _fold(collected, dict(zip(SUMMARY_FIELDS, row, strict=True)))
        return collected

    # --- after the job ------------------------------------------------------------------------

    def _load(
        self, collected: _Collected, adapters: dict[str, DestinationAdapter], result: JobResult
    ) -> dict[tuple[str, str], str]:
        outcomes: dict[tuple[str, str], str] = {}
        max_default = self.config.server.max_columns
        for key in sorted(collected.pairs):
            pair = collected.pairs[key]
            dest = self.config.destinations[pair.dest_id]
            keys = tuple(dest.data_layout.primary_key_fields)
            max_columns = dest.data_layout.max_columns or max_default
            adapter = adapters[pair.dest_id]
            if pair.error:
                error = pair.error
            elif adapter.capabilities.stage == "objects":
                error = commit_objects(adapter, pair)
            else:
                unmapped = UnmappedRule.of(dest.data_layout, max_columns)
                error = load_pair(adapter, self.coordination, pair, keys, max_columns, self.fault, unmapped)
            outcomes[key] = error
            result.pair(*key).error = error
            if self.fault is not None:
                self.fault("pair committed")
        return outcomes

    def _park_failed(self, collected: _Collected, fresh: set[tuple[str, str]]) -> list[ParkedSpools]:
        """Parks the failed events the pass may append, before any commit (`logs.failed`): those of
        every table, and the template failures and unreadable lines of the (log, destination)
        pairs processed for the first time (`fresh`: they are written once per log and destination)."""
        parked = []
        failed_dir = self.events_dir / "failed"
        for (name, dest_id, table), spools in sorted(collected.spools.items()):
            if table != NO_TABLE or (name, dest_id) in fresh:
                parked.append(park_spools(failed_dir, name, dest_id, table, spools))
        collected.spools = {}  # the others stay in the job's staging folder, removed with it
        return parked

    def _recover_parked(self, adapter: DestinationAdapter, dest_id: str, groups: list[ParkedSpools]) -> None:
        """Failed events a crashed pass parked: appended when their pair is settled (its load marker,
        or its log's status file), else dropped (the retry spools them again)."""
        if not groups:
            return
        committed = adapter.loaded_files(dest_id, sorted({group.log for group in groups}))

        def settled(group: ParkedSpools) -> bool:
            return (group.log, group.table) in committed or self._settled(group)

        done, dropped = settle_recovered(self.events_dir / "failed", dest_id, groups, settled)
        log.info("destination %s: parked failed-event groups: %d appended, %d dropped", dest_id, done, dropped)

    def _settle(
        self,
        logs: list[Path],
        statuses: dict[str, LogStatus],
        schedule: _Schedule,
        fresh: set[tuple[str, str]],
        plan: JobPlan,
        collected: _Collected,
        outcomes: dict[tuple[str, str], str],
        dest_errors: dict[str, str],
        parked: list[ParkedSpools],
        result: JobResult,
    ) -> None:
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
        for name in plan.file_tokens:
            for dest_id in plan.destinations:
                if (name, dest_id) not in plan.skip:  # processed, maybe without any table: not read for it again
                    updates[name].setdefault(dest_id, {})
        self._record_give_ups(plan, statuses, collected, updates, result)
        self._record_destination_errors(statuses, schedule, dest_errors, updates, result)
        merged = self._write_outcomes(logs, statuses, updates, plan, parked)
        for dest_id, events in sorted(result.gave_up.items()):  # as loud as the stream worker's give-up
            log.error(
                "batch %s: %d event(s) failed for longer than the retry policy's max age; in failed/ (replay them)",
                dest_id,
                events,
            )
        for path, status in merged.items():  # after the append lock: gzipping a log takes a while
            if all_uploaded(status):
                result.archived.append(archive_log(path, self.events_dir / "archive"))
            else:
                result.kept.append(path)

    def _write_outcomes(
        self,
        logs: list[Path],
        statuses: dict[str, LogStatus],
        updates: dict[str, LogStatus],
        plan: JobPlan,
        parked: list[ParkedSpools],
    ) -> dict[Path, LogStatus]:
        """Appends the failed lines and writes the status files (`logs.failed`, steps 2 to 4),
        under the append lock: a replay moving a failed log away waits; returns the statuses."""
        failed_dir = self.events_dir / "failed"
        settled = self._settled_groups(parked, updates)
        with appending(failed_dir) if settled else contextlib.nullcontext():
            journals, appended = self._append_failed(settled)
            if self.fault is not None:
                self.fault("failed appended")
            merged = {
                path: self._write_status(path, statuses[path.name], updates.get(path.name, {}), plan) for path in logs
            }
            if self.fault is not None:
                self.fault("statuses written")
            finish_appends(failed_dir, journals, appended)
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

    def _settled_groups(
        self, parked: list[ParkedSpools], updates: dict[str, LogStatus]
    ) -> dict[str, list[ParkedSpools]]:
        """The parked groups whose pair is settled by this pass, by destination (the others stay
        parked until a pass reads their load markers: `_recover_parked`)."""
        by_dest: dict[str, list[ParkedSpools]] = defaultdict(list)
        for group in parked:
            if group.table != NO_TABLE:  # template failures: parked only when written this pass
                pair = updates.get(group.log, {}).get(group.dest_id, {}).get(group.table)
                if pair is None or not pair.settled:
                    continue
            by_dest[group.dest_id].append(group)
        return by_dest

    def _append_failed(self, by_dest: dict[str, list[ParkedSpools]]) -> tuple[list[Path | None], list[ParkedSpools]]:
        """Appends the groups under journals (the caller holds the append lock); returns the
        journals and the groups appended."""
        journals: list[Path | None] = []
        appended: list[ParkedSpools] = []
        for dest_id, groups in sorted(by_dest.items()):
            journals.append(append_groups(self.events_dir / "failed", dest_id, groups, self.fault))
            appended += groups
        return journals, appended

    def _write_status(self, path: Path, old: LogStatus, update: LogStatus, plan: JobPlan) -> LogStatus:
        """Writes the log's status with this pass's outcomes and the retries' times; returns it."""
        merged = merge_status(old, update)
        connected = set(plan.stages) | set(plan.objects)
        for dest_id in connected:
            if (path.name, dest_id) not in plan.skip:
                # Reached this pass: a destination-wide error of an earlier pass is over.
                merged.get(dest_id, {}).pop(NO_TABLE, None)
        self._schedule_retries(merged)
        write_status(path, merged)
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


def _fold(collected: _Collected, row: Any) -> None:
    kind, file, dest_id, table = row["kind"], row["file"], row["dest"], row["tbl"]
    if kind == "sample":
        collected.samples.append(row["payload"])
        return
    if kind == "recognition":
        seen = Sightings.from_dict(orjson.loads(row["payload"]))
        collected.sightings.setdefault(dest_id, Sightings()).merge(seen)
        return
    if kind == "count":
        counts = collected.counts[file, dest_id, table]
        counts[0] += row["rows"]
        counts[1] += row["failed"]
        counts[2] += row["skipped"]
        if row["spool"]:
            collected.spools[file, dest_id, table].append(Path(row["spool"]))
        if row["rows"] and table != NO_TABLE:
            _pair(collected, dest_id, table).files.add(file)
        return
    pair = _pair(collected, dest_id, table)
    if kind == "error":
        pair.error = pair.error or row["payload"]
        return
    payload = orjson.loads(row["payload"])
    pair.chunks.append(StagedChunk.from_dict(payload["chunk"]))
    pair.header.merge(BatchHeader.from_dict(payload["header"]))


def _pair(collected: _Collected, dest_id: str, table: str) -> PairLoad:
    found = collected.pairs.get((dest_id, table))
    if found is None:
        found = collected.pairs[dest_id, table] = PairLoad(dest_id, table, BatchHeader(table))
    return found


def _parked_by_destination(failed_dir: Path) -> defaultdict[str, list[ParkedSpools]]:
    """The parked groups of `failed_dir` (`logs.failed`), by destination id."""
    parked: defaultdict[str, list[ParkedSpools]] = defaultdict(list)
    for group in parked_spools(failed_dir):
        parked[group.dest_id].append(group)
    return parked


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
