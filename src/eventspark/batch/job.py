"""One batch pass: one Spark job over a set of rotated logs, then loads, status files, archive.

Driver steps, in order:
1. drop empty logs; read each log's status file and the destinations' load markers (a marker means
   the pair was committed even if the status file never heard of it: a crash came in between);
2. read the destinations' tables, so executors check values against the existing column types;
3. run the job: executors multiplex lines to destinations, run the step chain, stage rows and
   spool failed events; the driver collects only counts, chunk references and BatchHeaders;
4. per destination/table pair: merge the headers, patch the table and commit the chunks
   (`batch.load`); a pair that fails is recorded FAILED and retried on the next pass;
5. append the failed events of settled pairs to `failed/` (those of a table pair are parked before
   its commit and appended right after it: see `logs.failed`), write the status files, archive
   the logs whose every pair is uploaded.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from eventspark.batch.load import Fault, PairLoad, commit_objects, load_pair
from eventspark.batch.partition import NO_TABLE, SUMMARY_FIELDS, process_splits
from eventspark.batch.plan import DEFAULT_CHUNK_ROWS, JobPlan, token_routes
from eventspark.batch.splits import Split, plan_splits
from eventspark.config import LoadedConfig
from eventspark.coordination import Coordination
from eventspark.destinations import build_destination
from eventspark.destinations.base import DestinationAdapter, DestinationError, StagedChunk, new_job_id
from eventspark.logs.archive import archive_log
from eventspark.logs.failed import ParkedSpools, append_spools, park_spools, parked_spools, settle_parked
from eventspark.logs.replay import replay_destination
from eventspark.logs.rotated import rotated_token
from eventspark.logs.status import (
    LogStatus,
    PairStatus,
    all_uploaded,
    merge_status,
    read_status,
    write_status,
)
from eventspark.logs.status import status_path as _status_path
from eventspark.ops.cache_results import settle_samples
from eventspark.recognition.service import Recognizer, recognition_of
from eventspark.recognition.state import done_sightings, keep_sightings
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

    @property
    def ok(self) -> bool:
        return not any(p.error for p in self.pairs.values())

    def pair(self, dest_id: str, table: str) -> PairSummary:
        found = self.pairs.get((dest_id, table))
        if found is None:
            found = self.pairs[dest_id, table] = PairSummary(dest_id, table)
        return found


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
    ) -> None:
        self.config = loaded.config
        self.coordination = coordination
        self.fault = fault
        self.chunk_rows = chunk_rows
        self.events_dir = Path(self.config.log.path)
        self._staged: set[str] = set()

    def run(self, session: Any, logs: list[Path]) -> JobResult:
        result = JobResult()
        logs = self._drop_empty(logs, result)
        # Replay logs (`logs.replay`) load into one destination each: a job of their own.
        groups: dict[str | None, list[Path]] = defaultdict(list)
        for path in logs:
            groups[replay_destination(path.name)].append(path)
        batch = {d for d, dest in self.config.destinations.items() if dest.mode == "batch"}
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

    def _hold_unroutable(self, logs: list[Path], result: JobResult) -> list[Path]:
        """The logs some batch destination takes; the others stay in incoming/, untouched.

        A log's token comes from its name (as in EventNative). When no batch destination takes it
        (a token removed from `api_keys`, or one whose destinations are all stream or `only_tokens`
        of others) its events would reach neither a table nor `failed/`: the log waits, with a
        warning every pass, and loads once a config reload brings the token or a destination back.
        """
        batch = {d: dest for d, dest in self.config.destinations.items() if dest.mode == "batch"}
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
        # Destinations a log's status file has not seen: their template failures are written this
        # pass (decided before load markers repair the statuses after a crash).
        seen = {(name, dest_id) for name, status in statuses.items() for dest_id in status}
        dest_errors: dict[str, str] = {}
        plan = self._plan(job_id, logs, statuses, adapters, dest_errors, only)
        started = time.monotonic()
        collected = self._execute(session, logs, plan) if plan.destinations else _Collected()
        executed = time.monotonic()
        # Users recognition's ids outlive a crash between the commits and its run (`recognition.state`).
        keep_sightings(self.events_dir, collected.sightings, set(plan.recognition))
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
        self._settle(logs, statuses, seen, plan, collected, outcomes, dest_errors, result)
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

    def _plan(
        self,
        job_id: str,
        logs: list[Path],
        statuses: dict[str, LogStatus],
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
        for dest_id, dest in self.config.destinations.items():
            if dest.mode != "batch" or (only is not None and dest_id != only):
                continue
            try:
                adapter = adapters[dest_id] = build_destination(dest_id, dest, self.events_dir)
                self._prepare_destination(plan, dest_id, dest, adapter, names, statuses)
            except DestinationError as exc:
                log.warning("destination %s is skipped this pass: %s", dest_id, exc)
                dest_errors[dest_id] = str(exc)
        routes = token_routes(self.config.api_keys, plan.destinations)
        plan.secret_tokens, plan.token_destinations, plan.default_destinations = routes
        if only is not None:  # whatever token a replayed event came with
            plan.secret_tokens, plan.token_destinations, plan.default_destinations = {}, {}, (only,)
        plan.file_tokens = {name: rotated_token(name) or "" for name in names}
        plan.file_ranks = {name: rank for rank, name in enumerate(sorted(names))}
        plan.done = {
            (name, dest_id): frozenset(t for t, s in statuses[name].get(dest_id, {}).items() if s.uploaded)
            for name in names
            for dest_id in plan.destinations
        }
        return plan

    def _prepare_destination(
        self,
        plan: JobPlan,
        dest_id: str,
        dest: Any,
        adapter: DestinationAdapter,
        names: list[str],
        statuses: dict[str, LogStatus],
    ) -> None:
        # What a killed pass left behind; a day is far longer than any pass.
        adapter.drop_stale_stages(time.time() - STALE_STAGE_SECONDS)
        self._recover_parked(adapter, dest_id)
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
        parked = self._park_failed(collected)
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
            settle_parked(self.events_dir / "failed", parked.pop(key, ()), committed=not error)
        for groups in parked.values():  # tables whose every event failed: nothing to commit
            settle_parked(self.events_dir / "failed", groups, committed=True)
        return outcomes

    def _park_failed(self, collected: _Collected) -> dict[tuple[str, str], list[ParkedSpools]]:
        """Parks the failed events of every table pair until its commit is decided (`logs.failed`)."""
        parked: dict[tuple[str, str], list[ParkedSpools]] = defaultdict(list)
        failed_dir = self.events_dir / "failed"
        for (name, dest_id, table), spools in sorted(collected.spools.items()):
            if table != NO_TABLE:
                parked[dest_id, table].append(park_spools(failed_dir, name, dest_id, table, spools))
        collected.spools = {key: spools for key, spools in collected.spools.items() if key[2] == NO_TABLE}
        return parked

    def _recover_parked(self, adapter: DestinationAdapter, dest_id: str) -> None:
        """Failed events a crashed pass parked: appended when their pair was committed, else dropped."""
        failed_dir = self.events_dir / "failed"
        groups = [group for group in parked_spools(failed_dir) if group.dest_id == dest_id]
        if not groups:
            return
        committed = adapter.loaded_files(dest_id, sorted({group.log for group in groups}))
        done = [group for group in groups if (group.log, group.table) in committed]
        settle_parked(failed_dir, done, committed=True)
        settle_parked(failed_dir, [group for group in groups if group not in done], committed=False)
        log.info("destination %s: %d parked failed-event group(s) recovered after a crash", dest_id, len(done))

    def _settle(
        self,
        logs: list[Path],
        statuses: dict[str, LogStatus],
        seen: set[tuple[str, str]],
        plan: JobPlan,
        collected: _Collected,
        outcomes: dict[tuple[str, str], str],
        dest_errors: dict[str, str],
        result: JobResult,
    ) -> None:
        fresh = {(name, dest_id) for name in statuses for dest_id in plan.destinations} - seen
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
                tables[table] = PairStatus(not error, error)
        self._append_failed(collected, fresh)
        self._record_destination_errors(plan, dest_errors, updates, result)
        for path in logs:
            self._finish_log(path, statuses[path.name], updates.get(path.name, {}), plan, result)

    def _record_destination_errors(
        self, plan: JobPlan, dest_errors: dict[str, str], updates: dict[str, LogStatus], result: JobResult
    ) -> None:
        """A destination unusable this pass keeps the logs of the tokens it takes, as a FAILED pair."""
        if not dest_errors:
            return
        batch = {d: dest for d, dest in self.config.destinations.items() if dest.mode == "batch"}
        _secrets, token_destinations, default = token_routes(self.config.api_keys, batch)
        for name, token in plan.file_tokens.items():
            only = plan.replay_destination
            targets = token_destinations.get(token, default) if only is None else (only,)
            for dest_id in targets:
                if dest_id in dest_errors:
                    updates[name].setdefault(dest_id, {})[NO_TABLE] = PairStatus(False, dest_errors[dest_id])
        for dest_id, error in dest_errors.items():
            result.pair(dest_id, NO_TABLE).error = error

    def _append_failed(self, collected: _Collected, fresh: set[tuple[str, str]]) -> None:
        """Template failures, skips and unreadable lines: once per log and destination."""
        by_dest: dict[str, list[Path]] = defaultdict(list)
        for (name, dest_id, _table), spools in sorted(collected.spools.items()):
            if (name, dest_id) in fresh:
                by_dest[dest_id].extend(spools)
        for dest_id, spools in by_dest.items():
            append_spools(self.events_dir / "failed", dest_id, spools)

    def _finish_log(self, path: Path, old: LogStatus, update: LogStatus, plan: JobPlan, result: JobResult) -> None:
        merged = merge_status(old, update)
        for dest_id in plan.destinations:
            # Reached this pass: a destination-wide error of an earlier pass is over.
            merged.get(dest_id, {}).pop(NO_TABLE, None)
        write_status(path, merged)
        if all_uploaded(merged):
            result.archived.append(archive_log(path, self.events_dir / "archive"))
        else:
            result.kept.append(path)

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
