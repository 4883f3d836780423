"""The executor side of the job: one Spark task's lines through the step chain into the stage.

Input: byte ranges of rotated logs (splits), read by the task itself. Output: one `TaskResult`:
counts per (log, destination, table), the staged chunks with their BatchHeaders, the splits written
directly, and the spool files of failed events. Events never leave the executor except into the
warehouse (its stage, or its tables directly).

Each (split, destination, table) is in one of three states, decided by its first row:
- DIRECT (`batch.direct`): the destination writes directly (`JobPlan.direct`), has no primary key
  and no transform, and the table exists with columns whose values can all be checked here. Rows
  are kept until the split ends, then written with their load markers in one transaction per
  (split, destination) (`end_split`).
- STAGED: as before, rows go into the task's ChunkBuffer of the table, and the driver patches the
  table and commits the chunks. A DIRECT (split, table) becomes STAGED, with the rows it kept, at
  its first row with a field the table lacks (`stage_split`).
- DONE: an earlier pass wrote the split directly (`JobPlan.split_done`): rows are checked, so that
  failed events are spooled again (their pair is not settled yet), but neither kept nor counted.
  Whatever the table is now (changed types, a primary key, a destination given primary keys or
  giving up): its rows are in it, checked against the table's types as a direct write checks
  them, or as staging does when the table cannot be written directly any more (`_Checking`).
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any, cast

import orjson

from eventspark.batch.chunks import ChunkBuffer, chunk_buffer, text_holds_nul
from eventspark.batch.commits import bucket_rows
from eventspark.batch.direct import STAGE, DirectBuffer, DirectColumns, direct_columns
from eventspark.batch.memory import keep_freed_memory
from eventspark.batch.plan import JobPlan
from eventspark.batch.results import DirectResult, PairCount, StagedResult, TaskResult
from eventspark.batch.splits import Split, read_remote_split, read_split
from eventspark.destinations.base import (
    DestinationError,
    DirectRows,
    DirectWriter,
    JsonStageWriter,
    ObjectBuffer,
    StageWriter,
)
from eventspark.destinations.registry import destination_type
from eventspark.logs.failed import event_error_line, event_id_of
from eventspark.ops.cache_results import SAMPLE_LINES, sample_row
from eventspark.steps.chain import DestinationChain, Failure, Row
from eventspark.steps.context import ensure_event_id
from eventspark.steps.diff import UnmappedRule
from eventspark.steps.lookup import GeoResolver, UserAgentParser
from eventspark.steps.recognition import RecognitionColumns, Sightings

NO_TABLE = ""
"""The table of events that never got one: template failures, skips, unreadable lines."""
TRANSFORM_CHUNK = 1000
"""Events a task holds for destinations with a JavaScript transform before running them (`defer`)."""
_UNKNOWN: Any = object()
_WHOLE_SPLIT = sys.maxsize
"""The row limit of a DIRECT or DONE target: never flushed before the split ends."""

Target = tuple[Any, list[int], int]
"""A (log, destination, table)'s buffer (ChunkBuffer, DirectBuffer or ObjectBuffer), its counts
(rows, failed, skipped) and the rows that make its buffer flush."""

# Direct split commits of this Python worker, for `JobPlan.executor_fault` (tests only).
_split_commits = 0

# One GeoIP reader and UA parser per Python worker: Spark reuses workers across tasks and jobs.
_resolvers: dict[str | None, tuple[GeoResolver | None, UserAgentParser]] = {}


def _lookups(geo_path: str | None) -> tuple[GeoResolver | None, UserAgentParser]:
    found = _resolvers.get(geo_path)
    if found is None:
        found = _resolvers[geo_path] = (GeoResolver.open(geo_path), UserAgentParser())
    return found


def process_splits(plan: JobPlan, task_id: int, splits: Iterable[Split]) -> list[TaskResult]:
    """The body of a Spark task: reads its splits, runs every line, returns its one result."""
    # Parsed events and buffered rows hold no reference cycles, so reference counting frees them;
    # the cycle collector would only walk the growing buffers again and again. It is back on, as
    # it was, when the task ends.
    collecting = gc.isenabled()
    gc.disable()
    keep_freed_memory()
    task = PartitionTask(plan, task_id)
    reader = plan.reader
    try:
        for split in splits:
            file = split.name
            task.start_split(split)
            for line in read_split(split) if reader is None else read_remote_split(split, reader):
                task.add_line(line, file)
            task.end_split(split)
        return [task.finish()]
    finally:
        task.close()
        if collecting:
            gc.enable()


class PartitionTask:
    """State of one task: chains, buffers per pair, counters, spools, writers."""

    def __init__(self, plan: JobPlan, partition_id: int) -> None:
        self.plan = plan
        self.partition_id = partition_id
        self.chains: dict[str, DestinationChain] = {}
        self.buffers: dict[tuple[str, str], ChunkBuffer] = {}
        self.counts: dict[tuple[str, str, str], list[int]] = {}
        self.spools: dict[tuple[str, str, str], tuple[Path, IO[bytes]]] = {}
        self.spool_folder: Path | None = None
        """This task's spools: the driver's staging folder, or with `log.remote` one in the executor's
        temp dir (`spool`), removed when the task ends (`close`)."""
        self.writers: dict[str, StageWriter] = {}
        self.chunks: list[StagedResult] = []
        self.errors: dict[tuple[str, str], str] = {}
        self.line_number = 0
        # Per (log, destination, table): its Target, None when done already, or the reason its
        # events fail (given up: `plan.give_up`).
        self.targets: dict[tuple[str, str, str], Target | str | None] = {}
        # Direct writes: the split being read, the targets that end with it (DIRECT, DONE, and
        # DIRECT turned STAGED), the buffers to write at its end, the checks of each
        # (destination, table) (None: staged), a writer per destination, the splits written.
        self.split_key = ""
        self.split_targets: list[tuple[str, str, str]] = []
        self.direct_buffers: dict[tuple[str, str, str], DirectBuffer] = {}
        self.direct_tables: dict[tuple[str, str], DirectColumns | None] = {}
        self.direct_writers: dict[str, DirectWriter] = {}
        self.direct: list[DirectResult] = []
        # (log, token) → its destinations, less those the plan skips for that log (`plan.skip`).
        self.routes: dict[tuple[str, str], tuple[str, ...]] = {}
        self.seq_bases: dict[str, int] = {}
        # Files destinations (`plan.objects`): a buffer per (log, destination, table) of the split.
        self.object_buffers: dict[tuple[str, str, str], ObjectBuffer] = {}
        # The events cache's sample: the first lines of each split, with their outcome.
        self.sample_left = 0
        self.samples: list[tuple[str, str, str]] = []
        # Users recognition: per destination, its columns and the ids this task saw.
        self.sightings: dict[str, tuple[RecognitionColumns, Sightings]] = {}
        # Events held for destinations with a transform (`defer`): their line and line number.
        self.deferred: dict[tuple[str, str], list[tuple[dict[str, Any], bytes, int]]] = {}
        self.deferred_count = 0
        # Task commits (`plan.task_commits`): rows staged per (destination, table), flushed and at
        # the last split's end, and the splits that added some (`note_staged_splits`).
        self.flushed: dict[tuple[str, str], int] = {}
        self.staged_totals: dict[tuple[str, str], int] = {}
        self.staged_splits: dict[tuple[str, str], list[str]] = {}

    def chain(self, dest_id: str) -> DestinationChain:
        chain = self.chains.get(dest_id)
        if chain is None:
            geo, ua = _lookups(self.plan.geo_path)
            dest = self.plan.destinations[dest_id]
            check_name = destination_type(dest.type).dialect.quote
            objects = self.plan.objects.get(dest_id)
            if objects is not None:
                chain = self.chains[dest_id] = objects.chain(dest_id, dest, geo, ua, check_name)
            else:
                chain = self.chains[dest_id] = DestinationChain.build(dest_id, dest, geo, ua, check_name)
        return chain

    def destinations_of(self, file: str, token: str) -> tuple[str, ...]:
        """The destinations of `token`'s events in log `file` this pass."""
        if not self.plan.skip:
            return self.plan.destinations_of(token)
        key = (file, token)
        found = self.routes.get(key)
        if found is None:
            skip = self.plan.skip
            found = tuple(d for d in self.plan.destinations_of(token) if (file, d) not in skip)
            self.routes[key] = found
        return found

    def add_line(self, line: bytes, file: str) -> None:
        self.line_number += 1
        file_token = self.plan.file_tokens.get(file, "")
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            for dest_id in self.destinations_of(file, file_token):
                self.fail(file, dest_id, NO_TABLE, line, f"the line is not JSON: {exc}")
            return
        if not isinstance(event, dict):
            for dest_id in self.destinations_of(file, file_token):
                self.fail(file, dest_id, NO_TABLE, line, "the line is not a JSON object")
            return
        api_key = event.get("api_key")
        token = self.plan.secret_tokens.get(api_key, file_token) if isinstance(api_key, str) else file_token
        dest_ids = self.destinations_of(file, token) if self.plan.skip else self.plan.destinations_of(token)
        if self.sample_left:
            self.sample_left -= 1
            self.add_sampled(line, file, token, event, dest_ids)
            return
        if len(dest_ids) == 1:  # the usual case, without the loop
            dest_id = dest_ids[0]
            chain = self.chains.get(dest_id) or self.chain(dest_id)
            if chain.transform is None:
                self.route(file, dest_id, event, line, chain)
            else:
                self.defer(file, dest_id, event, line)
            return
        last = len(dest_ids) - 1
        for index, dest_id in enumerate(dest_ids):
            # The chain changes the event it runs on: every destination but the last gets a copy.
            copy = event if index == last else orjson.loads(line)
            if self.chain(dest_id).transform is not None:
                self.defer(file, dest_id, copy, line)
            else:
                self.route(file, dest_id, copy, line)

    def defer(self, file: str, dest_id: str, event: dict[str, Any], line: bytes) -> None:
        """Holds an event for a destination with a JavaScript transform: its engine takes
        `TRANSFORM_CHUNK` events per round trip (`run_deferred`)."""
        ensure_event_id(event, line)
        self.deferred.setdefault((file, dest_id), []).append((event, line, self.line_number))
        self.deferred_count += 1
        if self.deferred_count >= TRANSFORM_CHUNK:
            self.run_deferred()

    def run_deferred(self) -> None:
        """Routes the held events, each placed with its own line number (its `seq`)."""
        deferred, self.deferred, self.deferred_count = self.deferred, {}, 0
        current = self.line_number
        for (file, dest_id), items in deferred.items():
            try:
                results: list[Any] | None = self.chain(dest_id).process_many([event for event, _, _ in items])
            except Exception:  # a bug on some event: each again alone, from its line (the chain changed it)
                results = None
            for index, (_event, line, number) in enumerate(items):
                self.line_number = number
                if results is None:
                    self.route(file, dest_id, orjson.loads(line), line)
                else:
                    self.settle(file, dest_id, results[index], line)
        self.line_number = current

    def add_sampled(self, line: bytes, file: str, token: str, event: dict[str, Any], dest_ids: Any) -> None:
        """`add_line`'s routing, keeping what became of the event at each destination."""
        last = len(dest_ids) - 1
        for index, dest_id in enumerate(dest_ids):
            result = self.route(file, dest_id, event if index == last else orjson.loads(line), line)
            if result is not False:
                dest = self.plan.destinations[dest_id]
                column_type = destination_type(dest.type).dialect.column_type
                existing = self.plan.existing.get(dest_id, {}).get(result.table) if type(result) is Row else None
                payload = sample_row(dest_id, token, line, result, column_type, existing)
                self.samples.append((file, dest_id, payload))

    def route(
        self, file: str, dest_id: str, event: dict[str, Any], line: bytes, chain: DestinationChain | None = None
    ) -> Row | Failure | bool | None:
        """Runs the chain (`chain`: the destination's, when the caller has it) and places the row;
        returns (for samples) the Row placed, the Failure, None when skipped, False when the pair
        is done already."""
        try:
            ensure_event_id(event, line)  # a line from elsewhere may have none (deterministic id)
            result = (chain or self.chain(dest_id)).process(event)
        except Exception as exc:  # one odd event must not stop every log behind it
            result = Failure(f"the pipeline steps failed on this event: {type(exc).__name__}: {exc}")
        return self.settle(file, dest_id, result, line)

    def settle(self, file: str, dest_id: str, result: Any, line: bytes) -> Row | Failure | bool | None:
        """Counts, fails or places the chain's result for the event (`route`'s second half)."""
        if result is None:
            self.count(file, dest_id, NO_TABLE)[2] += 1
            return None
        if type(result) is Failure:
            self.fail(file, dest_id, NO_TABLE, line, result.error)
            return result
        if type(result) is list:  # a transform made several rows, maybe in several tables
            placed = [self.place(file, dest_id, row, line) for row in result]
            return next((p for p in placed if type(p) is Failure), placed[0])
        return self.place(file, dest_id, result, line)

    def place(self, file: str, dest_id: str, result: Row, line: bytes) -> Row | Failure | bool:
        """Adds one row to its table's buffer: the Row, its Failure, or False when the pair is done."""
        table = result.table
        key = (file, dest_id, table)
        target = self.targets.get(key, _UNKNOWN)
        if target is _UNKNOWN:
            target = self.targets[key] = self.target(file, dest_id, table)
        if target is None:
            return False
        if type(target) is str:  # given up: to failed/, with the reason
            self.fail(file, dest_id, table, line, target)
            return Failure(target)
        buffer, counts, limit = target
        base = self.seq_bases.get(file)  # `seq`, inline: once per event
        if base is None:
            base = self.seq_base(file)
        error = buffer.add(result.values, result.casts, base | self.line_number)
        if error is not None:
            if error is STAGE:
                return self.stage_split(file, dest_id, result, line)
            self.fail(file, dest_id, table, line, error)
            return Failure(error)
        counts[0] += 1
        if self.plan.recognition and dest_id in self.plan.recognition:
            self.sight(dest_id, table, result.values)
        if limit != _WHOLE_SPLIT and len(buffer) >= limit:  # a DIRECT or DONE target waits for the split's end
            self.flush(dest_id, buffer)
        return result

    def stage_split(self, file: str, dest_id: str, result: Row, line: bytes) -> Row | Failure | bool:
        """A row the table cannot take directly (a field it lacks): its DIRECT (split, table)
        becomes STAGED with the rows kept so far, and the row goes into the ChunkBuffer. In a DONE
        split, the row was written with it: nothing to do."""
        key = (file, dest_id, result.table)
        direct = self.direct_buffers.pop(key, None)
        if direct is None:
            return result
        counts = self.count(*key)
        buffer = self.buffer(dest_id, result.table)
        self.targets[key] = (buffer, counts, self.plan.chunk_rows)
        for values in direct.dicts():
            # Checked against the same types already: cannot fail, unless a bug makes it; then
            # the pair fails this pass rather than losing a row.
            error = buffer.add(values, {}, 0)
            if error is not None:
                self.errors.setdefault((dest_id, result.table), f"staging: a row kept for a direct write: {error}")
            elif len(buffer) >= self.plan.chunk_rows:
                self.flush(dest_id, buffer)
        return self.place(file, dest_id, result, line)

    def sight(self, dest_id: str, table: str, values: dict[str, Any]) -> None:
        """Users recognition: notes the row's anonymous id (and user) for the driver (ids only)."""
        found = self.sightings.get(dest_id)
        if found is None:
            anonymous, nodes = self.plan.recognition[dest_id]
            columns = RecognitionColumns.build(anonymous, list(nodes), self.chain(dest_id).mapper)
            found = self.sightings[dest_id] = (columns, Sightings())
        sighting = found[0].read(values)
        if sighting is not None:
            found[1].add(table, sighting)

    def target(self, file: str, dest_id: str, table: str) -> Target | str | None:
        if table in self.plan.done.get((file, dest_id), ()):
            return None
        split_done = self.plan.split_done
        if split_done and (self.split_key, dest_id, table) in split_done:
            # Before a give-up: the rows of the split are in the table, only its failures go to failed/.
            return self.done_target(file, dest_id, table)
        given_up = self.plan.give_up.get((file, dest_id)) if self.plan.give_up else None
        if given_up:
            reason = given_up.get(table) or given_up.get(NO_TABLE)
            if reason:
                if split_done:  # another split of the log may be DONE: decided again per split
                    self.split_targets.append((file, dest_id, table))
                return reason
        objects = self.plan.objects.get(dest_id) if self.plan.objects else None
        if objects is not None:
            buffer = self.object_buffers[file, dest_id, table] = objects.buffer(table)
            return cast(ChunkBuffer, buffer), self.count(file, dest_id, table), self.plan.chunk_rows
        if self.plan.direct and dest_id in self.plan.direct:
            found = self.direct_target(file, dest_id, table)
            if found is not None:
                return found
        if split_done:
            # Another split of the log may be DONE (its marker): decided again per split, or its
            # rows would be staged again under a marker that exists.
            self.split_targets.append((file, dest_id, table))
        return self.buffer(dest_id, table), self.count(file, dest_id, table), self.plan.chunk_rows

    def done_target(self, file: str, dest_id: str, table: str) -> Target:
        """The DONE target of a (split, table) written by an earlier pass: checks rows, keeps none."""
        self.split_targets.append((file, dest_id, table))
        self.count(file, dest_id, table)  # rows 0: the pair still gets an outcome
        # `sql_types`: also of a destination that gives up unreached, from the status files.
        columns = self.direct_columns(dest_id, table) if dest_id in self.plan.sql_types else None
        if columns is not None:
            return DirectBuffer(columns, keep=False), [0, 0, 0], _WHOLE_SPLIT
        # The table cannot be written directly now (its types changed, a primary key came): its
        # rows are checked as staging checks them against the table's types. Written without a
        # primary key, so none is asked of them.
        existing = self.plan.existing.get(dest_id, {}).get(table)
        unmapped = self.unmapped(dest_id)
        # As the split's rows were checked when they were written: Postgres's text holds no U+0000.
        holds_nul = destination_type(self.plan.destinations[dest_id].type).dialect.text_holds_nul
        buffer = chunk_buffer(table, existing, (), False, unmapped, holds_nul=holds_nul)
        checking = _Checking(buffer, self.plan.chunk_rows)
        return cast(ChunkBuffer, checking), [0, 0, 0], _WHOLE_SPLIT

    def direct_target(self, file: str, dest_id: str, table: str) -> Target | None:
        """The DIRECT target of the (split, table); None when the table is staged."""
        key = (file, dest_id, table)
        columns = self.direct_columns(dest_id, table)
        if columns is None:
            return None
        self.split_targets.append(key)
        buffer = self.direct_buffers[key] = DirectBuffer(columns)
        return buffer, self.count(file, dest_id, table), _WHOLE_SPLIT

    def direct_columns(self, dest_id: str, table: str) -> DirectColumns | None:
        """The checks of a table written directly; None when it is staged: it does not exist yet,
        its destination has primary keys (the driver's commit orders upserts across splits) or a
        transform, it is full (`UnmappedRule.full`), or a column's values cannot all be checked."""
        key = (dest_id, table)
        if key in self.direct_tables:
            return self.direct_tables[key]
        columns = None
        sql_types = self.plan.sql_types.get(dest_id, {}).get(table)
        existing = self.plan.existing.get(dest_id, {}).get(table)
        if sql_types and existing and not self.plan.primary_keys.get(dest_id):
            unmapped = self.unmapped(dest_id)
            full = unmapped is not None and unmapped.full(existing)
            if not full and self.chain(dest_id).transform is None:
                columns = direct_columns(sql_types, existing)
        self.direct_tables[key] = columns
        return columns

    def seq_base(self, file: str) -> int:
        """The high bits of the `seq` of the rows of `file` (`place` adds the line number): later
        logs first by rank, then task, then line, so the last event of a key wins an upsert."""
        base = self.seq_bases[file] = (self.plan.file_ranks.get(file, 0) << 44) | (self.partition_id << 28)
        return base

    def buffer(self, dest_id: str, table: str) -> ChunkBuffer:
        key = (dest_id, table)
        buffer = self.buffers.get(key)
        if buffer is None:
            existing = self.plan.existing.get(dest_id, {}).get(table)
            keys = self.plan.primary_keys.get(dest_id, ())
            stage = self.plan.stages[dest_id]
            unmapped = self.unmapped(dest_id)
            holds_nul = text_holds_nul(stage)
            buffer = self.buffers[key] = chunk_buffer(table, existing, keys, stage.json_lines, unmapped, holds_nul)
        return buffer

    def unmapped(self, dest_id: str) -> UnmappedRule | None:
        """The destination's rule for fields past its maximum of columns."""
        layout = self.plan.destinations[dest_id].data_layout
        return UnmappedRule.of(layout, layout.max_columns or self.plan.max_columns)

    def count(self, file: str, dest_id: str, table: str) -> list[int]:
        key = (file, dest_id, table)
        counts = self.counts.get(key)
        if counts is None:
            counts = self.counts[key] = [0, 0, 0]
        return counts

    def fail(self, file: str, dest_id: str, table: str, line: bytes, error: str) -> None:
        self.count(file, dest_id, table)[1] += 1
        try:
            original: Any = orjson.loads(line)  # the event as received, not as the chain left it
            event: Any = orjson.Fragment(line)
        except orjson.JSONDecodeError:
            original = event = line.decode("utf-8", errors="replace")
        self.spool(file, dest_id, table).write(event_error_line(event, error, event_id_of(original)))

    def spool(self, file: str, dest_id: str, table: str) -> IO[bytes]:
        key = (file, dest_id, table)
        found = self.spools.get(key)
        if found is None:
            path = self._spool_folder() / f"{uuid.uuid4().hex}.log"
            found = self.spools[key] = (path, path.open("wb"))
        return found[1]

    def _spool_folder(self) -> Path:
        # With `log.remote` the driver's staging folder may not exist here (another machine): the
        # spools go to a folder of this task, uploaded at its end (`shipped`) and removed (`close`).
        if self.spool_folder is None:
            if self.plan.reader is None:
                self.spool_folder = Path(self.plan.staging_dir) / self.plan.job_id / "failed"
                self.spool_folder.mkdir(parents=True, exist_ok=True)
            else:
                self.spool_folder = Path(tempfile.mkdtemp(prefix=f"eventspark-{self.plan.job_id}-"))
        return self.spool_folder

    def flush(self, dest_id: str, buffer: ChunkBuffer) -> None:
        if self.plan.objects and dest_id in self.plan.objects:
            cast(ObjectBuffer, buffer).spill()  # written whole at the end of the split
            return
        count = len(buffer)
        if count and self.plan.task_commits:
            key = (dest_id, buffer.table)
            self.flushed[key] = self.flushed.get(key, 0) + count
        json_lines = buffer.lines is not None
        if json_lines:
            columns, data, header = buffer.take_json()
        else:
            keys = self.plan.primary_keys.get(dest_id, ())
            columns, data, header = buffer.take(ordered=bool(keys))  # type: ignore[assignment]
        if not count or (dest_id, buffer.table) in self.errors:
            return
        bucketed = self.plan.primary_keys.get(dest_id, ()) if dest_id in self.plan.task_commits else ()
        try:
            writer = self.writers.get(dest_id)
            if writer is None:
                writer = self.writers[dest_id] = self.plan.stages[dest_id].open()
            if json_lines:
                chunk = cast(JsonStageWriter, writer).write_json(columns, data, count)
            elif bucketed:  # task commits of a keyed table: a chunk per key bucket (`batch.commits`)
                names = list(columns)
                indexes = [names.index(key) for key in bucketed]
                types = [columns[key] for key in bucketed]
                cut = bucket_rows(data, indexes, self.plan.key_buckets, types)  # type: ignore[arg-type]
                for bucket, rows in sorted(cut.items()):
                    chunk = writer.write(columns, rows)
                    self.chunks.append(StagedResult(dest_id, buffer.table, chunk, header, bucket))
                return
            else:
                chunk = writer.write(columns, data)  # type: ignore[arg-type]
        except DestinationError as exc:
            # The pair fails for this pass (the driver will not commit it); the task goes on.
            self.errors[dest_id, buffer.table] = f"staging: {exc}"
            return
        self.chunks.append(StagedResult(dest_id, buffer.table, chunk, header))

    def start_split(self, split: Split) -> None:
        self.split_key = split.key
        self.sample_left = SAMPLE_LINES

    def end_split(self, split: Split) -> None:
        """Writes the split's DIRECT tables, one transaction per destination, and the objects of
        the split's log (files destinations), one per destination and table."""
        if self.deferred_count:
            self.run_deferred()
        if self.plan.task_commits:
            self.note_staged_splits()
        if self.split_targets:
            self.write_direct(split)
        if not self.object_buffers:
            return
        file = split.name
        size = self.plan.log_sizes.get(file)
        whole = split.start == 0 and split.end >= (os.path.getsize(split.path) if size is None else size)
        for key in [key for key in self.object_buffers if key[0] == file]:
            buffer = self.object_buffers.pop(key)
            del self.targets[key]  # another split of the log in this task gets its own object
            _file, dest_id, table = key
            if not buffer.total or (dest_id, table) in self.errors:
                continue
            try:
                chunk, header = self.plan.objects[dest_id].write(buffer, file, split.start, whole)
            except Exception as exc:
                # The pair fails for this pass (the driver will not settle it); the task goes on.
                self.errors[dest_id, table] = _writing_error(exc)
                continue
            self.chunks.append(StagedResult(dest_id, table, chunk, header))

    def note_staged_splits(self) -> None:
        """Task commits: the split being read is one of those whose rows the task's chunks of a
        (destination, table) hold when it staged some of its rows there: a marker each, committed
        with the chunks. Counted per buffer (staged and flushed), never per row."""
        for key, buffer in self.buffers.items():
            if key[0] not in self.plan.task_commits or self.plan.primary_keys.get(key[0]):
                continue  # a keyed table is committed by key buckets, without markers
            total = self.flushed.get(key, 0) + len(buffer)
            if total > self.staged_totals.get(key, 0):
                self.staged_totals[key] = total
                self.staged_splits.setdefault(key, []).append(self.split_key)

    def write_direct(self, split: Split) -> None:
        """Writes the rows the split kept for each destination (DIRECT tables), then forgets the
        split's targets: the next split starts DIRECT again."""
        by_dest: dict[str, dict[str, DirectRows]] = {}
        for key in self.split_targets:
            del self.targets[key]
            buffer = self.direct_buffers.pop(key, None)
            if buffer is not None and buffer.rows:
                _file, dest_id, table = key
                by_dest.setdefault(dest_id, {})[table] = buffer.take()
        self.split_targets = []
        for dest_id, tables in by_dest.items():
            try:
                self.write_split(dest_id, tables)
            except Exception as exc:
                # The pairs fail for this pass (nothing of the split was written); the task goes on.
                for table in tables:
                    self.errors[dest_id, table] = _writing_error(exc)
                continue
            rows = {table: len(direct.rows) for table, direct in tables.items()}
            self.direct.append(DirectResult(dest_id, self.split_key, split.name, rows))

    def write_split(self, dest_id: str, tables: dict[str, DirectRows]) -> None:
        global _split_commits
        writer = self.direct_writers.get(dest_id)
        if writer is None:
            writer = self.direct_writers[dest_id] = self.plan.direct[dest_id].open()
        fault = self.plan.executor_fault
        if fault is None:
            writer.write_split(self.split_key, tables)
            return
        # Tests only: an executor killed around its n-th split commit, as `kill -9` would.
        when, _, number = fault.partition(":")
        _split_commits += 1
        nth = _split_commits == int(number)
        killed = _kill if nth and when == "kill-before-commit" else None
        writer.write_split(self.split_key, tables, before_commit=killed)
        if nth and when == "kill-after-commit":
            _kill()

    def finish(self) -> TaskResult:
        """Stages what is left and returns the task's result."""
        if self.deferred_count:  # none: `end_split` runs them (a guard, as they would be lost)
            self.run_deferred()
        for (dest_id, _table), buffer in self.buffers.items():
            self.flush(dest_id, buffer)
        for _path, handle in self.spools.values():
            # The pass may commit a pair and mark its log done before these lines reach events/failed:
            # they must outlive a power loss until then (the driver parks them, fsynced, first).
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        result = TaskResult(staged=self.chunks, direct=self.direct, errors=self.errors, samples=self.samples)
        result.staged_splits = self.staged_splits
        for (file, dest_id, table), (rows, failed, skipped) in self.counts.items():
            spool = self.spools.get((file, dest_id, table))
            path = self.shipped(spool[0]) if spool else None
            result.counts.append(PairCount(file, dest_id, table, rows, failed, skipped, path))
        for dest_id, (_columns, seen) in self.sightings.items():
            if seen or seen.dropped:
                result.sightings[dest_id] = seen
        return result

    def shipped(self, spool: Path) -> str:
        """Where the driver finds a spool: here, or uploaded beside the logs (`log.remote`: this
        executor's disk is not the driver's), the local copy removed."""
        if self.plan.reader is None or self.plan.spool_target is None:
            return str(spool)
        target = self.plan.reader.put_spool(spool, f"{self.plan.spool_target}/{spool.name}")
        spool.unlink()
        return target

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        for direct in self.direct_writers.values():
            direct.close()
        for objects in self.plan.objects.values():
            objects.close()
        for _path, handle in self.spools.values():
            handle.close()
        if self.plan.reader is not None and self.spool_folder is not None:
            shutil.rmtree(self.spool_folder, ignore_errors=True)  # shipped, or the task failed: retried


class _Checking:
    """The buffer of a DONE (split, table) whose table cannot be written directly any more: each
    row is checked by a ChunkBuffer against the table's types; none is kept (its rows are dropped
    every `rows`)."""

    __slots__ = ("buffer", "rows")

    def __init__(self, buffer: ChunkBuffer, rows: int) -> None:
        self.buffer = buffer
        self.rows = rows

    def add(self, values: dict[str, Any], casts: Any, seq: int = 0) -> str | None:
        error = self.buffer.add(values, casts, seq)
        if len(self.buffer) >= self.rows:
            self.buffer.take()
        return error

    def __len__(self) -> int:
        return 0


def _writing_error(exc: Exception) -> str:
    """Why a pair failed to write: a client's untranslated error fails the pair, never the pass."""
    if isinstance(exc, DestinationError):
        return f"writing: {exc}"
    return f"writing: {type(exc).__name__}: {str(exc)[:300]}"


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
