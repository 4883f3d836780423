"""What the stream workers and the batch job tell the events cache.

Stream: `StreamResults` turns each micro-batch's outcome into entries `success` (the table and the
stored row's fields, SQL types and values), `failed` (the reason) or `skipped`. The worker thread
only hands over references (about 2 µs per micro-batch); the outcomes are made on the cache's
thread, and the stored records only for the events it keeps.

Batch: a sample. Each Spark task samples the first `SAMPLE_LINES` lines of each split it reads
(`sample_row`: one summary row per line and destination, a few hundred bytes), the driver
settles them with the pass's outcome of their pair (`settle_samples`) and the uploader writes
them to the cache after the pass (`record_samples`). Nothing else of the events leaves the executors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import orjson

from eventspark.ops.cache import EventsCache, Outcome, bounded_id, event_id_of, stored_record
from eventspark.steps.chain import Failure, Row
from eventspark.steps.typing import DataType, Field, field_for

MAX_SKIPPED = 1000
"""Skipped lines one micro-batch reports at most (a batch read again after a retry adds no more)."""
SAMPLE_LINES = 5
"""Lines of each split a Spark task samples for the events cache."""
ORDER_COLUMN_PREFIX = "_eventspark"
"""Columns of eventspark's own (e.g. the upsert order column) are not shown."""

ColumnType = Callable[[Field], str]


def record_of(row: Row, column_type: ColumnType | None, existing: Mapping[str, DataType | None] | None = None) -> Any:
    """`{"table", "record": [{"field", "type", "value"}]}` of a row: each column's SQL type from the
    existing column's type (batch) or the value (the dialect's `column_type`)."""
    fields = []
    for name, value in row.values.items():
        if name.startswith(ORDER_COLUMN_PREFIX):
            continue
        known = existing.get(name) if existing else None
        field = Field(known) if known is not None else field_for(name, value, row.casts)[0]
        fields.append((name, column_type(field) if column_type else field.type.name.lower(), value))
    return stored_record(row.table, fields)


# --- stream ---------------------------------------------------------------------------------------


class StreamResults:
    """A stream worker's reports to the cache: `skipped` per event in `_hold`, `record` per flush."""

    def __init__(self, cache: EventsCache, dest_id: str, column_type: ColumnType | None) -> None:
        self.cache = cache
        self.dest_id = dest_id
        self.column_type = column_type
        self._skipped: list[bytes] = []

    def skipped(self, line: bytes) -> None:
        if len(self._skipped) < MAX_SKIPPED:
            self._skipped.append(line)

    def record(self, tables: Mapping[str, list[tuple[Row, bytes]]], delivered: list[bytes], failed: list[Any]) -> None:
        """`delivered`: the lines stored; `failed`: (line, reason) pairs. References only (none of
        them changes afterwards): the outcomes are made on the cache's thread."""
        skipped, self._skipped = self._skipped, []
        if delivered or failed or skipped:
            self.cache.results(self.dest_id, lambda: self._outcomes(tables, delivered, failed, skipped))

    def _outcomes(
        self,
        tables: Mapping[str, list[tuple[Row, bytes]]],
        delivered: list[bytes],
        failed: list[Any],
        skipped: list[bytes],
    ) -> list[Outcome]:
        outcomes = self._stored(tables, delivered)
        outcomes += [Outcome("", line, "failed", error=error) for line, error in failed]
        outcomes += [Outcome("", line, "skipped") for line in skipped]
        return outcomes

    def _stored(self, tables: Mapping[str, list[tuple[Row, bytes]]], delivered: list[bytes]) -> list[Outcome]:
        """Outcomes of the delivered events the cache may keep: those it has an entry for, and at
        most `size` others (its rate limit takes no more), not one per event of a big batch."""
        rows = {id(line): row for items in tables.values() for row, line in items}
        found = [(line, row, _row_id(row)) for line in delivered for row in (rows.get(id(line)),)]
        known = self.cache.store.existing(self.dest_id, [event_id for _, _, event_id in found if event_id])
        fresh, column_type, outcomes = self.cache.size, self.column_type, []
        for line, row, event_id in found:
            if event_id not in known:
                if fresh <= 0:
                    continue
                fresh -= 1
            if row is None:
                outcomes.append(Outcome("", line, "success"))
            else:
                outcomes.append(Outcome(event_id, line, "success", success=partial(record_of, row, column_type)))
        return outcomes


def _row_id(row: Row | None) -> str:
    found = row.values.get("eventn_ctx_event_id") if row is not None else None
    return "" if found is None else bounded_id(str(found))


# --- batch ----------------------------------------------------------------------------------------


def sample_row(
    dest_id: str,
    token_id: str,
    line: bytes,
    result: Any,
    column_type: ColumnType | None,
    existing: Mapping[str, DataType | None] | None,
) -> str:
    """One sampled event's payload (JSON text) from what `PartitionTask.route` returned: a Row
    (staged: its pair's commit decides), a Failure, or None (skipped)."""
    status, success, error = "skipped", None, ""
    if isinstance(result, Failure):
        status, error = "failed", result.error
    elif isinstance(result, Row):
        status, success = "staged", record_of(result, column_type, existing)
    event_id = ""
    with contextlib.suppress(orjson.JSONDecodeError):
        event_id = event_id_of(orjson.loads(line))
    payload = {"dest": dest_id, "token": token_id, "id": event_id, "status": status, "success": success, "error": error}
    payload["line"] = line.decode("utf-8", "replace")
    return orjson.dumps(payload).decode()


def settle_samples(payloads: list[str], outcomes: Mapping[tuple[str, str], str]) -> list[dict[str, Any]]:
    """The sampled events with their final status: a staged row is `success` when its pair was
    committed, else `failed` with the pair's error."""
    settled = []
    for text in payloads:
        sample = orjson.loads(text)
        if sample["status"] == "staged":
            table = sample["success"]["table"]
            error = outcomes.get((sample["dest"], table))
            if error is None:
                continue  # a pair this pass did not load (not reached)
            sample["status"], sample["error"] = ("failed", error) if error else ("success", "")
        settled.append(sample)
    return settled


def record_samples(cache: EventsCache | None, samples: list[dict[str, Any]]) -> None:
    """Hands a pass's settled samples to the cache (a results hand-off per destination)."""
    if cache is None or not samples:
        return
    by_destination: dict[str, list[Outcome]] = {}
    for sample in samples:
        outcome = Outcome(
            sample["id"],
            sample["line"],
            sample["status"],
            success=sample["success"] if sample["status"] == "success" else None,
            error=sample["error"],
            token_id=sample["token"],
        )
        by_destination.setdefault(sample["dest"], []).append(outcome)
    for dest_id, outcomes in by_destination.items():
        cache.results(dest_id, outcomes)
