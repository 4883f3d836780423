"""The step chain: every pipeline step, in order, for one event and one destination.

template → lookup enrichment → mapping → flatten → typing. The collector's dry-run, the stream
workers and the Spark executors all call `DestinationChain.process`; `HeaderBuilder` merges the
types of many rows into one BatchHeader per table (per Spark partition, per stream micro-batch).

With a JavaScript transform (`steps/transform.py`) the order is EventNative 1.41's: lookup
enrichment → mapping → transform → per returned event: table (its `JITSU_TABLE_NAME`, else the
table name template over the transformed event) → flatten, with its `__sql_type_<field>` hints
as explicit column types. The transform may return several events (`process` then returns a
list of rows, possibly for several tables) or none (the event is skipped).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from eventspark.steps.flatten import column_name, flatten
from eventspark.steps.lookup import GeoResolver, LookupEnricher, UserAgentParser
from eventspark.steps.mapping import Mapper, MappingError, keep_whole, whole_kind
from eventspark.steps.mapping import _parse_type as check_sql_type
from eventspark.steps.template import (
    MAX_OUTPUT_CHARS,
    TableNameTemplate,
    TemplateEvalError,
    clean_table_name,
    compile_template,
    is_reserved_table,
)
from eventspark.steps.transform import (
    SQL_TYPE_PREFIX,
    TABLE_NAME_KEYS,
    Transform,
    TransformFailed,
    parse_result,
)
from eventspark.steps.typing import BatchHeader


@dataclass(slots=True)
class Row:
    """A flattened event ready for `table` (the mapped event, nested, from a chain built with
    `flat=False`); `casts` are the mapping's explicit column types."""

    table: str
    values: dict[str, Any]
    casts: Mapping[str, str]


@dataclass(slots=True)
class Failure:
    """The event cannot go to this destination; it goes to `events/failed` with `error`."""

    error: str


SKIP = None
"""`process` returns None when the table name template renders empty (or the transform returns
no event): the event is skipped."""

ChainResult = Row | list[Row] | Failure | None
"""A list (of two rows or more) only when a transform returned several events."""
MAX_ACCEPTED_NAMES = 10_000
"""Table names a chain remembers as checked (templates can make one per event: bounded)."""


class _LayoutConfig(Protocol):
    table_name_template: str


class DestinationChain:
    """The steps configured for one destination, built once and applied per event."""

    __slots__ = (
        "_accepted",
        "_flat",
        "_shape",
        "check_name",
        "destination_id",
        "lookup",
        "mapper",
        "template",
        "transform",
    )

    def __init__(
        self,
        destination_id: str,
        template: TableNameTemplate,
        lookup: LookupEnricher,
        mapper: Mapper,
        check_name: Callable[[str], object] | None = None,
        flat: bool = True,
        transform: Transform | None = None,
    ) -> None:
        self.destination_id = destination_id
        self.template = template
        self.lookup = lookup
        self.mapper = mapper
        self.check_name = check_name
        """Raises ValueError for a table name the warehouse cannot take (the dialect's `quote`)."""
        self._accepted: set[str] = set()
        self._shape: Callable[[dict[str, Any]], dict[str, Any]] = flatten if flat else _as_is
        """`flatten`, or nothing for destinations that take events as objects (the HTTP family)."""
        self._flat = flat
        self.transform = transform
        """The destination's JavaScript transform, None without one (the usual, faster path)."""

    @classmethod
    def build(
        cls,
        destination_id: str,
        destination: Any,
        geo: GeoResolver | None,
        ua: UserAgentParser | None,
        check_name: Callable[[str], object] | None = None,
        flat: bool = True,
    ) -> DestinationChain:
        """`destination` is a destination config (`config.models.DestinationBase`); `check_name`
        refuses table names the warehouse cannot take (ValueError), so their events fail alone;
        `flat=False` leaves the mapped event nested (`Row.values` is then the event itself)."""
        layout = destination.data_layout
        rules = [(rule.name, rule.from_, rule.to) for rule in destination.enrichment]
        mappings = layout.mappings
        mapper = Mapper.build() if mappings is None else Mapper.build(mappings.keep_unmapped, mappings.rules())
        template = compile_template(layout.table_name_template)
        transform = transform_of(destination_id, destination)
        return cls(destination_id, template, LookupEnricher(rules, geo, ua), mapper, check_name, flat, transform)

    def process(self, event: dict[str, Any]) -> ChainResult:
        """Runs the chain on `event`, which it changes in place: give each destination its own copy."""
        if self.transform is not None:
            return self._process_transformed(event)
        try:
            table = self.template.render(event)
        except TemplateEvalError as exc:
            return Failure(f"table_name_template: {exc}")
        if not table:
            return SKIP
        if table not in self._accepted:
            refused = self._refuse(table)
            if refused is not None:
                return refused
        self.lookup.apply(event)
        mapped, casts = self.mapper.apply(event, in_place=True)  # the chain owns the event
        return Row(table, self._shape(mapped), casts)

    def process_many(self, events: list[dict[str, Any]]) -> list[ChainResult]:
        """`process` of each event, in order. With a transform, the events go to its engine many
        per round trip (a round trip costs more than a simple transform); each keeps its own
        limits and fails alone."""
        if self.transform is None:
            return [self.process(event) for event in events]
        prepared = [self._prepare(event) for event in events]
        outcomes = self.transform.run_many([text for _id, _time, _casts, text in prepared])
        return [self._finish(ready, outcome) for ready, outcome in zip(prepared, outcomes, strict=True)]

    # --- with a transform ----------------------------------------------------------------------

    def _process_transformed(self, event: dict[str, Any]) -> ChainResult:
        """lookup → mapping → transform → a row per returned event (EventNative 1.41's order)."""
        ready = self._prepare(event)
        assert self.transform is not None
        try:
            outcome: str | TransformFailed | None = self.transform.run_text(ready[3])
        except TransformFailed as exc:
            outcome = exc
        return self._finish(ready, outcome)

    def _prepare(self, event: dict[str, Any]) -> tuple[Any, Any, Mapping[str, str], str]:
        """The steps before the transform: the event's id and time, the mapping's casts, and the
        mapped event as JSON text (what the transform gets)."""
        event_id, timestamp = _identity(event)
        self.lookup.apply(event)
        mapped, casts = self._map(event)
        return event_id, timestamp, casts, _dumps(mapped)

    def _finish(
        self, ready: tuple[Any, Any, Mapping[str, str], str], outcome: str | TransformFailed | None
    ) -> ChainResult:
        """The rows of the events the transform returned (`outcome`, as JSON text)."""
        event_id, timestamp, casts, _text = ready
        if isinstance(outcome, TransformFailed):
            return Failure(f"transform: {outcome}")
        try:
            returned = parse_result(outcome)
        except TransformFailed as exc:
            return Failure(f"transform: {exc}")
        text = outcome
        hinted = text is not None and SQL_TYPE_PREFIX in text
        rows: list[Row] = []
        for index, item in enumerate(returned):
            row = self._transformed_row(item, casts, hinted)
            if type(row) is Failure:
                return row
            if row is not None:
                if self._flat:  # as EventNative: each row keeps the event's id (made unique) and time
                    _stamp(row.values, event_id, timestamp, index)
                rows.append(row)
        if not rows:
            return SKIP
        return rows[0] if len(rows) == 1 else rows

    def _map(self, event: dict[str, Any]) -> tuple[dict[str, Any], Mapping[str, str]]:
        """The mapping step (the json files format overrides it: no mapping)."""
        return self.mapper.apply(event, in_place=True)

    def _transformed_row(self, item: dict[str, Any], casts: Mapping[str, str], hinted: bool) -> Row | Failure | None:
        """One returned event as a row: its table, its type hints, its shape (None: skipped)."""
        table = self._table_of(item)
        if type(table) is Failure or table is None:
            return table
        try:
            hints = _take_type_hints(item, (), {}) if hinted else {}
        except ValueError as exc:
            return Failure(f"transform: {exc}")
        if hints and self._flat:
            casts = {**casts, **hints}
        return Row(table, self._shape(item), casts)

    def _table_of(self, item: dict[str, Any]) -> str | Failure | None:
        """`JITSU_TABLE_NAME` (removed from the event), else the template over the event."""
        raw: object = None
        for key in TABLE_NAME_KEYS:
            value = item.pop(key, None)
            if raw is None and isinstance(value, str):
                raw = value
        if isinstance(raw, str):
            if len(raw) > MAX_OUTPUT_CHARS:
                return Failure(f"transform: JITSU_TABLE_NAME is longer than {MAX_OUTPUT_CHARS} characters")
            table = "" if raw.strip().lower() in ("null", "false") else clean_table_name(raw)
            where = "transform: JITSU_TABLE_NAME"
        else:
            try:
                table = self.template.render(item)
            except TemplateEvalError as exc:
                return Failure(f"table_name_template: {exc}")
            where = "table_name_template"
        if not table:
            return None
        if table not in self._accepted:
            refused = self._refuse(table)
            if refused is not None:
                return Failure(refused.error.replace("table_name_template", where, 1))
        return table

    def _refuse(self, table: str) -> Failure | None:
        """Why no event can go to `table`, else None (and `table` is remembered as fine)."""
        if is_reserved_table(table):
            return Failure(f"table_name_template: table name {table!r} is reserved for eventspark's own tables")
        if self.check_name is not None:
            try:
                self.check_name(table)
            except ValueError as exc:
                return Failure(f"table_name_template: {exc}")
        if len(self._accepted) >= MAX_ACCEPTED_NAMES:
            self._accepted.clear()
        self._accepted.add(table)
        return None


def _as_is(event: dict[str, Any]) -> dict[str, Any]:
    return event


def transform_of(destination_id: str, destination: Any) -> Transform | None:
    """The destination's transform, compiled, or None: none set, or `transform_enabled: false`.
    EventNative's place is `data_layout.transform` / `data_layout.transform_enabled`; eventspark
    also takes both on the destination itself (which wins)."""
    layout = destination.data_layout
    source = getattr(destination, "transform", None) or getattr(layout, "transform", None)
    enabled = getattr(destination, "transform_enabled", None)
    if enabled is None:
        enabled = getattr(layout, "transform_enabled", None)
    if not source or not source.strip() or enabled is False:
        return None
    variables = {"destinationId": destination_id, "destinationType": str(destination.type)}
    limits = {"timeout_ms": destination.transform_timeout_ms, "memory_mb": destination.transform_memory_mb}
    return Transform.compile(source, variables=variables, **limits)


def _dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def _identity(event: dict[str, Any]) -> tuple[Any, Any]:
    """The event's id and `_timestamp` before the transform (every row it makes keeps them)."""
    ctx = event.get("eventn_ctx")
    event_id = ctx.get("event_id") if isinstance(ctx, dict) else None
    if event_id is None:
        event_id = event.get(_FLAT_ID)
    return event_id, event.get("_timestamp")


_FLAT_ID = "eventn_ctx_event_id"


def _stamp(values: dict[str, Any], event_id: Any, timestamp: Any, index: int) -> None:
    """EventNative's rule for SQL destinations: rows after the first get `<id>_<n>`, so that
    tables keyed by the event id (ClickHouse's default) keep them all."""
    if event_id is not None:
        values[_FLAT_ID] = event_id if index == 0 else f"{event_id}_{index}"
    if timestamp is not None:
        values["_timestamp"] = timestamp


def _take_type_hints(obj: dict[str, Any], path: tuple[str, ...], hints: dict[str, str]) -> dict[str, str]:
    """Removes the `__sql_type_<field>` keys under `obj`; returns their types by column name
    (the name flattening gives `<field>` at that depth). ValueError for a bad type."""
    for key in [key for key in obj if isinstance(key, str) and key.startswith(SQL_TYPE_PREFIX)]:
        field = key[len(SQL_TYPE_PREFIX) :]
        hint = obj.pop(key)
        if field:
            sql_type = hints[column_name((*path, field))] = _sql_type(key, hint)
            whole = whole_kind(sql_type)
            if whole is not None and field in obj:  # a JSON column keeps the subtree whole (jitsu#951)
                obj[field] = keep_whole(whole, obj[field])
    if len(path) < _MAX_HINT_DEPTH:
        for key, value in obj.items():
            if isinstance(value, dict):
                _take_type_hints(value, (*path, str(key)), hints)
    return hints


_MAX_HINT_DEPTH = 64


def _sql_type(key: str, hint: object) -> str:
    """`"type"`, `["type"]` or `["type", "column DDL"]` (EventNative; the DDL wins when given)."""
    if isinstance(hint, list) and 1 <= len(hint) <= 2 and all(isinstance(part, str) for part in hint):
        hint = hint[-1]
    if not isinstance(hint, str):
        raise ValueError(f"{key} must be an SQL type, or [type] or [type, column DDL]")
    try:
        return check_sql_type(key, hint)
    except MappingError as exc:
        raise ValueError(str(exc)) from None


class HeaderBuilder:
    """Accumulates the BatchHeader of each table from rows, promoting types as they meet."""

    __slots__ = ("headers",)

    def __init__(self) -> None:
        self.headers: dict[str, BatchHeader] = {}

    def add(self, row: Row) -> None:
        header = self.headers.get(row.table)
        if header is None:
            header = self.headers[row.table] = BatchHeader(row.table)
        header.add_row(row.values, row.casts)

    def merge(self, other: HeaderBuilder) -> None:
        for table, header in other.headers.items():
            mine = self.headers.get(table)
            if mine is None:
                self.headers[table] = header
            else:
                mine.merge(header)
