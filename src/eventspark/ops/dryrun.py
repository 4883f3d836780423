"""Dry run: what one event would become in one destination, with nothing written anywhere.

The event goes through the same steps as a collected one: ContextEnrichment as the s2s endpoint
applies it (the caller does that: it knows the request), then the destination's chain exactly as
the stream workers and the batch executors build it (`steps/chain.py`: table name template,
lookups, mapping, flattening), then typing (`steps/typing.py`), with each column's type named in
the destination's dialect (`Dialect.column_type`: `bigint`, `Nullable(String)`...). No
connection is opened: the types are those a new table would get (an existing table keeps its
own column types, and a value that does not fit them fails at load time).

Results are EventNative's `[{"field", "type", "value"}]` per event, plus the table and a status:
`ok`, `skipped` (the template rendered nothing) or `failed` (with the reason the event would go
to `events/failed`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from eventspark.destinations.registry import destination_type
from eventspark.steps.chain import DestinationChain, Failure, Row
from eventspark.steps.diff import UnmappedRule
from eventspark.steps.flatten import flatten
from eventspark.steps.lookup import GeoResolver, UserAgentParser
from eventspark.steps.typing import coerce, format_timestamp, header_for

MAX_EVENTS = 100
"""Most events one dry run takes (a body may be an array or a template body, like the event endpoints')."""
SKIPPED = (
    "the table name template rendered an empty name (or the transform returned no event):"
    " the event is skipped for this destination"
)

Status = Literal["ok", "skipped", "failed"]


@dataclass(slots=True)
class DryRunResult:
    """One event's fate in one destination."""

    status: Status
    table: str = ""
    fields: list[dict[str, Any]] = field(default_factory=list)
    """`{"field", "type", "value"}` per column, in the row's order; NULLs are not columns."""
    error: str = ""
    more: list[DryRunResult] = field(default_factory=list)
    """The other rows, when a transform made several of the event (docs/transforms.md)."""

    def to_dict(self) -> dict[str, Any]:
        answer = {"status": self.status, "table": self.table, "fields": self.fields, "error": self.error}
        if self.more:
            answer["more"] = [row.to_dict() for row in self.more]
        return answer


class DryRun:
    """One destination's chain, built as the stream workers and the batch executors build it."""

    def __init__(
        self, dest_id: str, dest: Any, events_dir: Any, geo: GeoResolver | None, ua: UserAgentParser, max_columns: int
    ) -> None:
        entry = destination_type(dest.type)
        self.dialect = entry.dialect
        # A warehouse table may not have more columns (`steps/diff.py` check_column_limit); the
        # files family and the HTTP services have no tables to patch.
        tables = entry.capabilities.delivery == "tables" and entry.capabilities.stage != "objects"
        self.max_columns = (dest.data_layout.max_columns or max_columns) if tables else 0
        # As for a new table: fields beyond max_columns go to the unmapped column (docs/json-columns.md).
        self.unmapped = UnmappedRule.of(dest.data_layout, self.max_columns) if tables else None
        check_name = entry.dialect.quote
        if entry.capabilities.stage == "objects":  # the files family: the format decides the chain
            target = entry.build(dest_id, dest, events_dir).stage_target("dry-run")
            self.chain: DestinationChain = target.chain(dest_id, dest, geo, ua, check_name)  # type: ignore[attr-defined]
        else:
            flat = entry.capabilities.delivery == "tables"
            self.chain = DestinationChain.build(dest_id, dest, geo, ua, check_name, flat=flat)

    def run(self, event: dict[str, Any]) -> DryRunResult:
        """The result for an enriched event (which the chain changes: pass a copy to keep it)."""
        try:
            result = self.chain.process(event)
        except Exception as exc:  # as the batch job: one odd event fails alone
            return DryRunResult("failed", error=f"the pipeline steps failed on this event: {type(exc).__name__}: {exc}")
        if result is None:
            return DryRunResult("skipped", error=SKIPPED)
        if isinstance(result, Failure):
            return DryRunResult("failed", error=result.error)
        if type(result) is list:  # a transform made several rows: the first, then the others
            first, *others = [self.row_result(row) for row in result]
            first.more = others
            return first
        return self.row_result(result)

    def row_result(self, result: Row) -> DryRunResult:
        """One row's table and typed fields, or why it fails."""
        values = result.values
        if any(isinstance(v, dict | list) for v in values.values()):  # delivered as an object: shown flat
            values = flatten(values)
        casts = result.casts
        if self.unmapped is not None and self.unmapped.column is not None:
            values = dict(values)
            self.unmapped.place(values, (), self.unmapped.allowed(None, list(values)))
            casts = self.unmapped.casts(casts)
        header = header_for(result.table, values, casts)
        try:
            fields = [
                {"field": name, "type": self.dialect.column_type(f), "value": _json_value(coerce(values[name], f.type))}
                for name, f in header.fields.items()
            ]
        except ValueError as exc:
            return DryRunResult("failed", result.table, error=str(exc))
        counted = len(fields) - (self.unmapped is not None and self.unmapped.column in header.fields)
        if 0 < self.max_columns < counted:  # as a new table: fails whatever the other events
            error = f"table {result.table!r} would have {len(fields)} columns, more than max_columns {self.max_columns}"
            return DryRunResult("failed", result.table, error=error)
        return DryRunResult("ok", result.table, fields)


def _json_value(value: Any) -> Any:
    return format_timestamp(value) if isinstance(value, datetime) else value


_lookups: dict[str | None, tuple[GeoResolver | None, UserAgentParser]] = {}
_lock = threading.Lock()
"""Dry runs of one process take turns: the lookups' caches are not shared between threads."""


def dry_run(
    dest_id: str,
    dest: Any,
    events_dir: Any,
    geo_path: str | None,
    events: list[dict[str, Any]],
    max_columns: int = 0,
) -> list[DryRunResult]:
    """The results of enriched `events` in destination `dest_id` (blocking: the first call opens
    the GeoIP database and loads the UA parser's regexes; run it off an event loop);
    `max_columns`: `server.max_columns` (the destination's own `data_layout.max_columns` wins)."""
    with _lock:
        found = _lookups.get(geo_path)
        if found is None:
            found = _lookups[geo_path] = (GeoResolver.open(geo_path), UserAgentParser())
        runner = DryRun(dest_id, dest, events_dir, *found, max_columns)
        return [runner.run(event) for event in events]
