"""The executor side of the job: one Spark task's lines through the step chain into the stage.

Input: byte ranges of rotated logs, read by the task itself. Output: a few summary rows, counts
per (log, destination, table), the staged chunks with their BatchHeaders, and the spool files of
failed events. Events never leave the executor except into the warehouse's stage.
"""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any, cast

import orjson

from eventspark.batch.chunks import ChunkBuffer, chunk_buffer
from eventspark.batch.memory import keep_freed_memory
from eventspark.batch.plan import JobPlan
from eventspark.batch.splits import Split, read_split
from eventspark.destinations.base import DestinationError, JsonStageWriter, ObjectBuffer, StageWriter
from eventspark.destinations.registry import destination_type
from eventspark.logs.failed import event_error_line, event_id_of
from eventspark.ops.cache_results import SAMPLE_LINES, sample_row
from eventspark.steps.chain import DestinationChain, Failure, Row
from eventspark.steps.context import ensure_event_id
from eventspark.steps.diff import UnmappedRule
from eventspark.steps.lookup import GeoResolver, UserAgentParser
from eventspark.steps.recognition import RecognitionColumns, Sightings

SUMMARY_FIELDS = ("kind", "file", "dest", "tbl", "rows", "failed", "skipped", "spool", "payload")
"""The fields of a summary row (a tuple): ("count", log, destination, table, rows, failed, skipped,
failed-event spool, None), ("chunk", None, destination, table, 0, 0, 0, None, chunk JSON),
("error", None, destination, table, 0, 0, 0, None, why staging failed) or ("sample", log,
destination, "", 0, 0, 0, None, a sampled event for the events cache: `ops.cache_results`) or
("recognition", None, destination, "", 0, 0, 0, None, the ids users recognition saw: `Sightings`)."""
NO_TABLE = ""
"""The table of events that never got one: template failures, skips, unreadable lines."""
TRANSFORM_CHUNK = 1000
"""Events a task holds for destinations with a JavaScript transform before running them (`defer`)."""
_UNKNOWN: Any = object()

# One GeoIP reader and UA parser per Python worker: Spark reuses workers across tasks and jobs.
_resolvers: dict[str | None, tuple[GeoResolver | None, UserAgentParser]] = {}


def _lookups(geo_path: str | None) -> tuple[GeoResolver | None, UserAgentParser]:
    found = _resolvers.get(geo_path)
    if found is None:
        found = _resolvers[geo_path] = (GeoResolver.open(geo_path), UserAgentParser())
    return found


def process_splits(plan: JobPlan, task_id: int, splits: Iterable[Split]) -> list[tuple[Any, ...]]:
    """The body of a Spark task: reads its splits, runs every line, returns the summary rows."""
    # Parsed events and buffered rows hold no reference cycles, so reference counting frees them;
    # the cycle collector would only walk the growing buffers again and again. It is back on, as
    # it was, when the task ends.
    collecting = gc.isenabled()
    gc.disable()
    keep_freed_memory()
    task = PartitionTask(plan, task_id)
    try:
        for split in splits:
            file = split.name
            task.sample_left = SAMPLE_LINES
            for line in read_split(split):
                task.add_line(line, file)
            task.end_split(split)
        return task.finish()
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
        self.writers: dict[str, StageWriter] = {}
        self.chunks: list[tuple[str, str, bytes]] = []
        self.errors: dict[tuple[str, str], str] = {}
        self.line_number = 0
        # Per (log, destination, table): its buffer and counts, None when done already, or the
        # reason its events fail (given up: `plan.give_up`).
        self.targets: dict[tuple[str, str, str], tuple[ChunkBuffer, list[int]] | str | None] = {}
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

    def route(self, file: str, dest_id: str, event: dict[str, Any], line: bytes) -> Row | Failure | bool | None:
        """Runs the chain and places the row; returns (for samples) the Row placed, the Failure,
        None when skipped, False when the pair is done already."""
        try:
            ensure_event_id(event, line)  # a line from elsewhere may have none (deterministic id)
            result = self.chain(dest_id).process(event)
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
        buffer, counts = target
        error = buffer.add(result.values, result.casts, self.seq(file))
        if error is not None:
            self.fail(file, dest_id, table, line, error)
            return Failure(error)
        counts[0] += 1
        if self.plan.recognition and dest_id in self.plan.recognition:
            self.sight(dest_id, table, result.values)
        if len(buffer) >= self.plan.chunk_rows:
            self.flush(dest_id, buffer)
        return result

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

    def target(self, file: str, dest_id: str, table: str) -> tuple[ChunkBuffer, list[int]] | str | None:
        if table in self.plan.done.get((file, dest_id), ()):
            return None
        given_up = self.plan.give_up.get((file, dest_id)) if self.plan.give_up else None
        if given_up:
            reason = given_up.get(table) or given_up.get(NO_TABLE)
            if reason:
                return reason
        objects = self.plan.objects.get(dest_id) if self.plan.objects else None
        if objects is not None:
            buffer = self.object_buffers[file, dest_id, table] = objects.buffer(table)
            return cast(ChunkBuffer, buffer), self.count(file, dest_id, table)
        return self.buffer(dest_id, table), self.count(file, dest_id, table)

    def seq(self, file: str) -> int:
        # Later logs first by rank, then task, then line: the last event of a key wins an upsert.
        base = self.seq_bases.get(file)
        if base is None:
            base = self.seq_bases[file] = (self.plan.file_ranks.get(file, 0) << 44) | (self.partition_id << 28)
        return base | self.line_number

    def buffer(self, dest_id: str, table: str) -> ChunkBuffer:
        key = (dest_id, table)
        buffer = self.buffers.get(key)
        if buffer is None:
            existing = self.plan.existing.get(dest_id, {}).get(table)
            keys = self.plan.primary_keys.get(dest_id, ())
            json_lines = self.plan.stages[dest_id].json_lines
            layout = self.plan.destinations[dest_id].data_layout
            unmapped = UnmappedRule.of(layout, layout.max_columns or self.plan.max_columns)
            buffer = self.buffers[key] = chunk_buffer(table, existing, keys, json_lines, unmapped)
        return buffer

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
            folder = Path(self.plan.staging_dir) / self.plan.job_id / "failed"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{uuid.uuid4().hex}.log"
            found = self.spools[key] = (path, path.open("wb"))
        return found[1]

    def flush(self, dest_id: str, buffer: ChunkBuffer) -> None:
        if self.plan.objects and dest_id in self.plan.objects:
            cast(ObjectBuffer, buffer).spill()  # written whole at the end of the split
            return
        count = len(buffer)
        json_lines = buffer.lines is not None
        if json_lines:
            columns, data, header = buffer.take_json()
        else:
            keys = self.plan.primary_keys.get(dest_id, ())
            columns, data, header = buffer.take(ordered=bool(keys))  # type: ignore[assignment]
        if not count or (dest_id, buffer.table) in self.errors:
            return
        try:
            writer = self.writers.get(dest_id)
            if writer is None:
                writer = self.writers[dest_id] = self.plan.stages[dest_id].open()
            if json_lines:
                chunk = cast(JsonStageWriter, writer).write_json(columns, data, count)
            else:
                chunk = writer.write(columns, data)  # type: ignore[arg-type]
        except DestinationError as exc:
            # The pair fails for this pass (the driver will not commit it); the task goes on.
            self.errors[dest_id, buffer.table] = f"staging: {exc}"
            return
        payload = orjson.dumps({"chunk": chunk.to_dict(), "header": header.to_dict()})
        self.chunks.append((dest_id, buffer.table, payload))

    def end_split(self, split: Split) -> None:
        """Writes the objects of the split's log (files destinations), one per destination and table."""
        if self.deferred_count:
            self.run_deferred()
        if not self.object_buffers:
            return
        file = split.name
        whole = split.start == 0 and split.end >= os.path.getsize(split.path)
        for key in [key for key in self.object_buffers if key[0] == file]:
            buffer = self.object_buffers.pop(key)
            del self.targets[key]  # another split of the log in this task gets its own object
            _file, dest_id, table = key
            if not buffer.total or (dest_id, table) in self.errors:
                continue
            try:
                chunk, header = self.plan.objects[dest_id].write(buffer, file, split.start, whole)
            except DestinationError as exc:
                # The pair fails for this pass (the driver will not settle it); the task goes on.
                self.errors[dest_id, table] = f"writing: {exc}"
                continue
            except Exception as exc:  # a client's untranslated error fails the pair, never the pass
                self.errors[dest_id, table] = f"writing: {type(exc).__name__}: {str(exc)[:300]}"
                continue
            payload = orjson.dumps({"chunk": chunk.to_dict(), "header": header.to_dict()})
            self.chunks.append((dest_id, table, payload))

    def finish(self) -> list[tuple[Any, ...]]:
        """Stages what is left and returns the summary rows."""
        if self.deferred_count:
            self.run_deferred()
        for (dest_id, _table), buffer in self.buffers.items():
            self.flush(dest_id, buffer)
        for _path, handle in self.spools.values():
            # The pass may commit a pair and mark its log done before these lines reach events/failed:
            # they must outlive a power loss until then (the driver parks them, fsynced, first).
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        out: list[tuple[Any, ...]] = []
        for (file, dest_id, table), (rows, failed, skipped) in self.counts.items():
            spool = self.spools.get((file, dest_id, table))
            out.append(("count", file, dest_id, table, rows, failed, skipped, str(spool[0]) if spool else None, None))
        for (dest_id, table), error in self.errors.items():
            out.append(("error", None, dest_id, table, 0, 0, 0, None, error))
        for dest_id, table, payload in self.chunks:
            out.append(("chunk", None, dest_id, table, 0, 0, 0, None, payload.decode()))
        for file, dest_id, sample in self.samples:
            out.append(("sample", file, dest_id, NO_TABLE, 0, 0, 0, None, sample))
        for dest_id, (_columns, seen) in self.sightings.items():
            if seen or seen.dropped:
                payload = orjson.dumps(seen.to_dict()).decode()
                out.append(("recognition", None, dest_id, NO_TABLE, 0, 0, 0, None, payload))
        return out

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        for objects in self.plan.objects.values():
            objects.close()
        for _path, handle in self.spools.values():
            handle.close()
