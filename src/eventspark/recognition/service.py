"""Setting user ids on earlier anonymous rows, after a batch pass's commits or a stream flush.

Two steps, so that no id waits only in memory (`docs/users-recognition.md`):
- `Recognizer.record(sightings)` writes a batch's ids into the index: the tables of its anonymous
  ids, the identities it found, and, as "pending", the ids to settle (those identified now and the
  anonymous ones whose user the index already knows: identified earlier, their new rows get the
  user too). A stream worker records every flush at once, even when it settles later (ClickHouse).
- `Recognizer.settle(adapter)` takes the pending ids: per table where they have rows without a
  user, one `recognize_users` call (an UPDATE, or a ClickHouse mutation) for all of them; then
  forgets the (id, table) entries it settled. An update that fails leaves its ids pending for the
  next settle (the identity stays in the index meanwhile).

A table whose rows were all anonymous has no user column yet: the missing ones are added as
text, like any table patch (`destinations.sync`): under the table's coordination lock, within
`max_columns` and `schema_freeze`, bumping its version so that other nodes read it again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from eventspark.coordination import Coordination, CoordinationError
from eventspark.destinations.base import DestinationAdapter, DestinationError, TerminalError
from eventspark.destinations.registry import destination_type
from eventspark.destinations.sync import LOCK_TIMEOUT, sync_table, table_lock
from eventspark.recognition.index import MemoryIndex, RecognitionIndex
from eventspark.steps.diff import ColumnLimitError, Table, UnmappedRule
from eventspark.steps.mapping import Mapper
from eventspark.steps.recognition import (
    Identity,
    RecognitionColumns,
    Sightings,
    missing_user_columns,
    split_entry,
)
from eventspark.steps.typing import DataType, coerce, format_timestamp

log = logging.getLogger(__name__)
T = TypeVar("T")

UPDATE_IDS = 5000
"""Most anonymous ids in one update statement (ClickHouse: one mutation)."""
INDEX_PAUSE_SEC = 30.0
"""After the index (Redis) failed, runs are skipped this long: a stream worker must not wait on
an unreachable index at every flush."""

_memory: dict[tuple[str, str], MemoryIndex] = {}
"""(log.path, destination id) → its memory index: one per destination of a config, per process."""
_memory_lock = threading.Lock()


def recognition_of(config: Any, dest: Any) -> Any | None:
    """The destination's `users_recognition` in force (its own, else the global one) when it is
    enabled and the destination's type can update rows; else None."""
    section = dest.users_recognition if dest.users_recognition is not None else config.users_recognition
    if section is None or not section.enabled:
        return None
    if destination_type(dest.type).capabilities.users_recognition == "none":
        return None
    return section


def build_index(config: Any, dest_id: str, section: Any) -> RecognitionIndex:
    """Redis (`meta.storage.redis`) when configured, else this process's memory index."""
    ttl = section.index_ttl_hours * 3600
    redis_config = config.meta.storage.redis
    if redis_config is not None:
        from eventspark.recognition.redis import RedisIndex  # the driver only when used

        return RedisIndex(redis_config, dest_id, ttl)
    key = (str(config.log.path), dest_id)
    with _memory_lock:
        found = _memory.get(key)
        if found is None:
            found = _memory[key] = MemoryIndex(ttl, section.index_max_ids)
        return found


def columns_of(section: Any, dest: Any) -> RecognitionColumns:
    """The recognition columns of `dest`'s rows (its mapping applied to the nodes)."""
    mappings = dest.data_layout.mappings
    mapper = Mapper.build() if mappings is None else Mapper.build(mappings.keep_unmapped, mappings.rules())
    return RecognitionColumns.build(section.anonymous_id_node, section.nodes(), mapper)


@dataclass(frozen=True, slots=True)
class Patching:
    """How the destination's tables are patched (`destinations.sync`), which recognition follows
    when it adds user columns: the coordination store (lock, version) and the column rules."""

    coordination: Coordination
    max_columns: int
    unmapped: UnmappedRule | None

    @classmethod
    def of(cls, config: Any, dest: Any, coordination: Coordination) -> Patching:
        layout = dest.data_layout
        max_columns = layout.max_columns or config.server.max_columns
        return cls(coordination, max_columns, UnmappedRule.of(layout, max_columns))


@dataclass(slots=True)
class RunResult:
    """What one run did: statements issued, ids settled, ids left pending."""

    updates: int = 0
    settled: int = 0
    pending: int = 0
    skipped: bool = False
    """The index could not be used: nothing was recorded (a batch pass keeps its ids on disk)."""

    def __str__(self) -> str:
        return f"{self.updates} update(s), {self.settled} id(s) settled, {self.pending} pending"


class Recognizer:
    """Users recognition for one destination (one thread uses it at a time)."""

    def __init__(self, dest_id: str, columns: RecognitionColumns, index: RecognitionIndex, patching: Patching) -> None:
        self.dest_id = dest_id
        self.columns = columns
        self.index = index
        self.patching = patching
        self._paused_until = 0.0
        self._recent: dict[str, set[str]] = {}
        """Tables of the ids this recognizer recorded to settle, until its next settle: another node
        settling the same id may drop the index's entry between this node's load and its settle."""

    @classmethod
    def build(cls, config: Any, dest_id: str, dest: Any, coordination: Coordination) -> Recognizer | None:
        section = recognition_of(config, dest)
        if section is None:
            return None
        index = build_index(config, dest_id, section)
        return cls(dest_id, columns_of(section, dest), index, Patching.of(config, dest, coordination))

    def run(self, adapter: DestinationAdapter, sightings: Sightings) -> RunResult:
        """`record`, then `settle` (a batch pass). Index errors are logged: rows stay as loaded."""
        if not self.record(sightings):
            return RunResult(skipped=True)
        return self.settle(adapter)

    def record(self, sightings: Sightings) -> bool:
        """Writes the ids into the index; False when the index is away (nothing was recorded)."""
        return self._guarded(lambda: self._record(sightings), False)

    def settle(self, adapter: DestinationAdapter) -> RunResult:
        """Sets the user of the pending ids' rows; skipped (logged) when the index is away."""
        return self._guarded(lambda: self._settle(adapter), RunResult(skipped=True))

    def _guarded(self, step: Callable[[], T], skipped: T) -> T:
        """`step()`, or `skipped` while the index is away (and when it fails now: a pause)."""
        if time.monotonic() < self._paused_until:
            return skipped
        try:
            return step()
        except (DestinationError, CoordinationError):
            raise
        except Exception as exc:  # the index (Redis) is away: recognition waits, loading does not
            log.warning("users recognition of %s skipped: %s: %s", self.dest_id, type(exc).__name__, exc)
            self._paused_until = time.monotonic() + INDEX_PAUSE_SEC
            return skipped

    def _record(self, sightings: Sightings) -> bool:
        if sightings.dropped:
            log.warning(
                "users recognition of %s: %d rows past the bound were not tracked", self.dest_id, sightings.dropped
            )
        by_id: dict[str, set[str]] = {}
        for table, ids in sightings.anonymous.items():
            for anonymous_id in ids:
                by_id.setdefault(anonymous_id, set()).add(table)
        self.index.add_tables(by_id)
        self.index.set_identities(sightings.identified)
        known = self.index.identities(set(by_id) - set(sightings.identified))
        to_settle = set(sightings.identified) | set(known)
        self.index.add_pending(to_settle)
        for anonymous_id in to_settle & set(by_id):
            self._recent.setdefault(anonymous_id, set()).update(by_id[anonymous_id])
        return True

    def _settle(self, adapter: DestinationAdapter) -> RunResult:
        recent, self._recent = self._recent, {}
        pending = self.index.pending() | set(recent)
        if not pending:
            return RunResult()
        identities = self.index.identities(pending)
        tables = self.index.tables(identities)
        for anonymous_id, names in recent.items():
            if anonymous_id in identities:
                tables.setdefault(anonymous_id, set()).update(names)
        result, failed = self._update(adapter, _by_table(tables, identities))
        self.index.drop_pending(pending - failed)
        self.index.add_pending(failed)
        return result

    def _update(self, adapter: DestinationAdapter, work: dict[str, dict[str, Identity]]) -> tuple[RunResult, set[str]]:
        """The updates of every table; the ids of the tables that failed (to retry)."""
        result = RunResult()
        failed: set[str] = set()
        done: set[str] = set()
        for entry, pairs in sorted(work.items()):
            table_name = split_entry(entry)[0]
            try:
                result.updates += self._update_table(adapter, entry, pairs)
            except TerminalError as exc:  # refused (a ClickHouse key column...): it would fail again
                log.warning("users recognition of %s/%s refused, not retried: %s", self.dest_id, table_name, exc)
            except (DestinationError, CoordinationError) as exc:
                log.warning("users recognition of %s/%s failed, retried later: %s", self.dest_id, table_name, exc)
                failed.update(pairs)
                continue
            self.index.drop_tables(entry, pairs)
            done.update(pairs)
        result.settled, result.pending = len(done - failed), len(failed)
        return result, failed

    def _update_table(self, adapter: DestinationAdapter, entry: str, pairs: Mapping[str, Identity]) -> int:
        """The statements for the rows of one `table_entry` (one per UPDATE_IDS ids); 0 when it
        has nothing to set."""
        table_name, anonymous_column = split_entry(entry)
        table = adapter.read_table(table_name)
        if table is None:
            return 0
        table = self._with_user_columns(adapter, table, pairs, anonymous_column)
        found = self.columns.table_columns(table.columns, anonymous_column)
        if found is None:
            return 0
        anonymous, users = found
        types = [adapter.data_type_of(table.columns[column]) for _, column in users]
        values = {
            a: [_fit(identity, i, t) for (i, _), t in zip(users, types, strict=True)] for a, identity in pairs.items()
        }
        items = [(a, v) for a, v in values.items() if any(x is not None for x in v)]
        # Rows whose id is in an earlier alternative are another visitor's (a hashed id is shared).
        alternatives = self.columns.anonymous
        earlier = alternatives[: alternatives.index(anonymous)] if anonymous in alternatives else ()
        unset = [column for column in earlier if column in table.columns]
        for start in range(0, len(items), UPDATE_IDS):
            part = dict(items[start : start + UPDATE_IDS])
            adapter.recognize_users(table, anonymous, [column for _, column in users], part, unset)
        return (len(items) + UPDATE_IDS - 1) // UPDATE_IDS

    def _with_user_columns(
        self, adapter: DestinationAdapter, table: Table, pairs: Mapping[str, Identity], anonymous: str | None
    ) -> Table:
        """The table, with the user columns it lacks added as text (e.g. its rows were all
        anonymous until now): a table patch like a load's, under the table's lock and rules."""
        with_values = {i for identity in pairs.values() for i, value in enumerate(identity) if value is not None}
        missing = missing_user_columns(self.columns, table.columns, with_values, anonymous)
        if not missing:
            return table
        text = adapter.dialect.types[DataType.STRING]
        wanted = Table(table.name, dict.fromkeys(missing, text))
        patching = self.patching
        lock = table_lock(self.dest_id, table.name)
        try:
            with patching.coordination.lock(lock, LOCK_TIMEOUT):
                synced = sync_table(
                    adapter, patching.coordination, lock, wanted, patching.max_columns, patching.unmapped
                )
        except ColumnLimitError as exc:  # schema_freeze or max_columns: the rows stay anonymous
            log.info("users recognition of %s/%s: user columns not added: %s", self.dest_id, table.name, exc)
            return adapter.read_table(table.name) or table
        if synced.patch is not None:
            log.info("users recognition of %s/%s: added %s", self.dest_id, table.name, ", ".join(missing))
        return synced.table

    def close(self) -> None:
        self.index.close()


def _fit(identity: Identity, index: int, data_type: DataType | None) -> str | None:
    """The identity's value of node `index` as text its column takes (None: absent, or it does not
    fit, e.g. an email into a bigint column: one such value must not fail the whole statement)."""
    value = identity[index] if index < len(identity) else None
    if value is None or data_type is None:  # None: a type the warehouse casts (uuid, json...)
        return value
    try:
        converted = coerce(value, data_type)
    except ValueError:
        return None
    if isinstance(converted, bool):
        return "true" if converted else "false"
    if data_type is DataType.TIMESTAMP:
        return format_timestamp(converted)  # type: ignore[arg-type]
    return str(converted)


def _by_table(
    tables: Mapping[str, Iterable[str]], identities: Mapping[str, Identity]
) -> dict[str, dict[str, Identity]]:
    work: dict[str, dict[str, Identity]] = {}
    for anonymous_id, names in tables.items():
        for name in names:
            work.setdefault(name, {})[anonymous_id] = identities[anonymous_id]
    return work


__all__ = ["Patching", "Recognizer", "RunResult", "build_index", "columns_of", "recognition_of"]
