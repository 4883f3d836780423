"""Users recognition, the pure part: which columns of a destination's rows hold the anonymous id
and the user ids, and what one row says about them (`docs/users-recognition.md`).

The config names nodes of the event (`/eventn_ctx/user/anonymous_id||/user/anonymous_id`: `||`
separates alternatives, the first present wins, as in EventNative). Rows reach the warehouse
mapped and flattened, so each node is turned into the column it ends up in by running the
destination's own mapper and `flatten` on an event holding only a marker at that node: a mapping
that moves `/user/id` to `/uid` makes the column `uid`; one that drops it leaves no column.
Reading the flattened row (rather than the event) means the ids are those the table really holds.

The alternatives pair up by position: rows whose anonymous id is in the 2nd alternative's column
(`user_anonymous_id`, JS SDK 2.x) get their user in the 2nd alternative's column of each
identification node (`user_id`), those of the 1st (`eventn_ctx_user_anonymous_id`, SDK 1.x) in the
1st (`eventn_ctx_user_id`), so a table holding rows of both SDKs gets both right. The index keeps
an anonymous id's rows per (table, anonymous column): `table_entry`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eventspark.steps.flatten import flatten
from eventspark.steps.mapping import Mapper
from eventspark.steps.paths import parse_path, set_path

MAX_ID_LENGTH = 512
"""Longer ids are ignored: they come from the internet and end up in the index and in SQL."""
_MARKER = "\x00eventspark-recognition-marker\x00"

Identity = tuple[str | None, ...]
"""A user's identification values, one per identification node (None: the node is absent)."""


@dataclass(frozen=True, slots=True)
class Sighting:
    """What one row says: its anonymous id and, when the row identifies a user, the values."""

    anonymous_id: str
    identity: Identity | None
    """None: an anonymous row (no identification value at all)."""
    column: str = ""
    """The column the anonymous id was read from."""


ENTRY_SEPARATOR = "\x1f"
"""Between a table name and an anonymous id column in `table_entry` (no column name has it)."""


def table_entry(table: str, column: str) -> str:
    """The index's name of the rows of a table whose anonymous id is in `column`."""
    return f"{table}{ENTRY_SEPARATOR}{column}" if column else table


def split_entry(entry: str) -> tuple[str, str | None]:
    """(table, anonymous id column) of a `table_entry` (None: a bare table name)."""
    table, separator, column = entry.rpartition(ENTRY_SEPARATOR)
    return (table, column) if separator else (entry, None)


@dataclass(frozen=True, slots=True)
class RecognitionColumns:
    """The columns of the recognition nodes in one destination's rows, alternatives in order."""

    anonymous: tuple[str, ...]
    identification: tuple[tuple[str, ...], ...]

    @classmethod
    def build(cls, anonymous_node: str, identification_nodes: list[str], mapper: Mapper) -> RecognitionColumns:
        """The columns `mapper` (the destination's mapping) and `flatten` give the nodes."""
        anonymous = _columns(anonymous_node, mapper)
        return cls(anonymous, tuple(_columns(node, mapper) for node in identification_nodes))

    @property
    def usable(self) -> bool:
        """Both an anonymous id and at least one identification node reach the rows."""
        return bool(self.anonymous) and any(self.identification)

    def read(self, values: Mapping[str, Any]) -> Sighting | None:
        """The row's sighting, or None when it has no (usable) anonymous id."""
        anonymous_id, column = _first(values, self.anonymous)
        if anonymous_id is None:
            return None
        identity = tuple(_first(values, alternatives)[0] for alternatives in self.identification)
        if all(value is None for value in identity):
            return Sighting(anonymous_id, None, column)
        return Sighting(anonymous_id, identity, column)

    def user_columns(self, anonymous: str) -> list[tuple[int, str]]:
        """(node index, column) of each identification node for rows whose anonymous id is in
        the column `anonymous`: the alternative of the same position (module docstring)."""
        position = self.anonymous.index(anonymous) if anonymous in self.anonymous else 0
        return [(i, names[position % len(names)]) for i, names in enumerate(self.identification) if names]

    def table_columns(
        self, columns: Mapping[str, Any], anonymous: str | None = None
    ) -> tuple[str, list[tuple[int, str]]] | None:
        """For a table with `columns`: the anonymous id column (`anonymous`, else the first
        alternative it has) and the (node index, column) of its user columns the table has; None
        when it lacks either (nothing to update there)."""
        if anonymous is None:
            anonymous = next((c for c in self.anonymous if c in columns), None)
        if anonymous is None or anonymous not in columns:
            return None
        users = [(i, column) for i, column in self.user_columns(anonymous) if column in columns]
        return (anonymous, users) if users else None


def _columns(node: str, mapper: Mapper) -> tuple[str, ...]:
    """The column of each alternative of `node` after mapping and flattening (duplicates once)."""
    found: list[str] = []
    for alternative in node.split("||"):
        path = parse_path(alternative)
        event: dict[str, Any] = {}
        if not path or not set_path(event, path, _MARKER):
            continue
        mapped, _casts = mapper.apply(event)
        column = next((k for k, v in flatten(mapped).items() if v == _MARKER), None)
        if column is not None and column not in found:
            found.append(column)
    return tuple(found)


def _first(values: Mapping[str, Any], columns: tuple[str, ...]) -> tuple[str | None, str]:
    """The first of `columns` holding an id, as text (numbers too: ids are compared as text), and
    that column; (None, "") when none does."""
    for column in columns:
        value = values.get(column)
        if value is None or value == "" or isinstance(value, dict | list):
            continue
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        if len(text) <= MAX_ID_LENGTH:
            return text, column
    return None, ""


MAX_SIGHTINGS = 200_000
"""Ids one batch (a Spark task, a stream flush) remembers per destination; past it, rows are not
tracked (`Sightings.dropped` counts them, the driver logs it): their ids stay without a user."""


class Sightings:
    """The anonymous ids and identities seen in a batch of rows of one destination: ids only."""

    __slots__ = ("anonymous", "dropped", "identified", "limit", "size")

    def __init__(self, limit: int = MAX_SIGHTINGS) -> None:
        self.anonymous: dict[str, set[str]] = {}
        """`table_entry` (table and anonymous id column) → anonymous ids of the anonymous rows
        written there."""
        self.identified: dict[str, Identity] = {}
        """Anonymous id → the identity of its user (the last seen wins)."""
        self.limit = limit
        self.size = 0
        self.dropped = 0

    def __bool__(self) -> bool:
        return bool(self.anonymous or self.identified)

    def add(self, table: str, sighting: Sighting) -> None:
        if sighting.identity is not None:
            if sighting.anonymous_id not in self.identified and not self._room():
                return
            self.identified[sighting.anonymous_id] = sighting.identity
            return
        entry = table_entry(table, sighting.column)
        ids = self.anonymous.get(entry)
        if ids is None:
            ids = self.anonymous[entry] = set()
        if sighting.anonymous_id not in ids and self._room():
            ids.add(sighting.anonymous_id)

    def _room(self) -> bool:
        if self.size >= self.limit:
            self.dropped += 1
            return False
        self.size += 1
        return True

    def merge(self, other: Sightings) -> None:
        """Adds `other`'s ids (the driver folding its tasks': the bound applies per task)."""
        for table, ids in other.anonymous.items():
            self.anonymous.setdefault(table, set()).update(ids)
        self.identified.update(other.identified)
        self.dropped += other.dropped

    def to_dict(self) -> dict[str, Any]:
        return {
            "anonymous": {table: sorted(ids) for table, ids in self.anonymous.items()},
            "identified": self.identified,
            "dropped": self.dropped,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sightings:
        found = cls()
        found.anonymous = {table: set(ids) for table, ids in data.get("anonymous", {}).items()}
        found.identified = {a: tuple(values) for a, values in data.get("identified", {}).items()}
        found.dropped = int(data.get("dropped", 0))
        return found


def missing_user_columns(
    columns: RecognitionColumns, table: Mapping[str, Any], nodes_with_values: set[int], anonymous: str | None = None
) -> list[str]:
    """The user columns to add to a table holding anonymous rows (in `anonymous`, else its first
    anonymous id column), so that they can get their user: per identification node with a value,
    its column for that anonymous column (`user_columns`) when the table lacks it."""
    if anonymous is None:
        anonymous = next((c for c in columns.anonymous if c in table), None)
    if anonymous is None or anonymous not in table:
        return []
    return [c for i, c in columns.user_columns(anonymous) if i in nodes_with_values and c not in table]
