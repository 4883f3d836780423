"""The step chain: every pipeline step, in order, for one event and one destination.

template → lookup enrichment → mapping → flatten → typing. The collector's dry-run, the stream
workers and the Spark executors all call `DestinationChain.process`; `HeaderBuilder` merges the
types of many rows into one BatchHeader per table (per Spark partition, per stream micro-batch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from eventspark.steps.flatten import flatten
from eventspark.steps.lookup import GeoResolver, LookupEnricher, UserAgentParser
from eventspark.steps.mapping import Mapper
from eventspark.steps.template import TableNameTemplate, TemplateEvalError, compile_template, is_reserved_table
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
"""`process` returns None when the table name template renders empty: the event is skipped."""

ChainResult = Row | Failure | None
MAX_ACCEPTED_NAMES = 10_000
"""Table names a chain remembers as checked (templates can make one per event: bounded)."""


class _LayoutConfig(Protocol):
    table_name_template: str


class DestinationChain:
    """The steps configured for one destination, built once and applied per event."""

    __slots__ = ("_accepted", "_shape", "check_name", "destination_id", "lookup", "mapper", "template")

    def __init__(
        self,
        destination_id: str,
        template: TableNameTemplate,
        lookup: LookupEnricher,
        mapper: Mapper,
        check_name: Callable[[str], object] | None = None,
        flat: bool = True,
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
        return cls(destination_id, template, LookupEnricher(rules, geo, ua), mapper, check_name, flat)

    def process(self, event: dict[str, Any]) -> ChainResult:
        """Runs the chain on `event`, which it changes in place: give each destination its own copy."""
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
