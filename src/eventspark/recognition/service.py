"""Setting user ids on earlier anonymous rows, after a batch pass's commits or a stream flush.

`Recognizer.run(adapter, sightings)`:
1. records the tables of this batch's anonymous ids and the identities it found in the index;
2. takes the ids to settle: those identified now, anonymous ones whose user the index already
   knows (identified earlier: their new rows get the user too) and those whose update failed;
3. per table where those ids have rows without a user, one `recognize_users` call (an UPDATE,
   or a ClickHouse mutation) for all of them; a table that lacks the anonymous or every user
   column is left alone (nothing to set: columns are never added for this);
4. forgets the (id, table) entries it settled; an update that fails leaves them, marks the ids
   pending and is tried again on the next run (the identity stays in the index meanwhile).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from eventspark.destinations.base import DestinationAdapter, DestinationError
from eventspark.destinations.registry import destination_type
from eventspark.recognition.index import MemoryIndex, RecognitionIndex
from eventspark.steps.diff import Table, TablePatch
from eventspark.steps.mapping import Mapper
from eventspark.steps.recognition import Identity, RecognitionColumns, Sightings, missing_user_columns
from eventspark.steps.typing import DataType

log = logging.getLogger(__name__)

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
    """Users recognition for one destination."""

    def __init__(self, dest_id: str, columns: RecognitionColumns, index: RecognitionIndex) -> None:
        self.dest_id = dest_id
        self.columns = columns
        self.index = index
        self._paused_until = 0.0

    @classmethod
    def build(cls, config: Any, dest_id: str, dest: Any) -> Recognizer | None:
        section = recognition_of(config, dest)
        if section is None:
            return None
        return cls(dest_id, columns_of(section, dest), build_index(config, dest_id, section))

    def run(self, adapter: DestinationAdapter, sightings: Sightings) -> RunResult:
        """Steps 1-4 of the module's docstring. Index errors are logged: rows stay as loaded."""
        if time.monotonic() < self._paused_until:
            return RunResult(skipped=True)
        try:
            return self._run(adapter, sightings)
        except DestinationError:
            raise
        except Exception as exc:  # the index (Redis) is away: recognition waits, loading does not
            log.warning("users recognition of %s skipped: %s: %s", self.dest_id, type(exc).__name__, exc)
            self._paused_until = time.monotonic() + INDEX_PAUSE_SEC
            return RunResult(skipped=True)

    def _run(self, adapter: DestinationAdapter, sightings: Sightings) -> RunResult:
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
        pending = self.index.pending()
        known = self.index.identities(set(by_id) - set(sightings.identified))
        identities = {**known, **self.index.identities(pending - set(sightings.identified)), **sightings.identified}
        if not identities:
            return RunResult()
        work = _by_table(self.index.tables(identities), identities)
        return self._update(adapter, work, pending)

    def _update(
        self, adapter: DestinationAdapter, work: dict[str, dict[str, Identity]], pending: set[str]
    ) -> RunResult:
        result = RunResult()
        failed: set[str] = set()
        done: set[str] = set()
        for table_name, pairs in sorted(work.items()):
            try:
                result.updates += self._update_table(adapter, table_name, pairs)
            except DestinationError as exc:
                log.warning("users recognition of %s/%s failed, retried later: %s", self.dest_id, table_name, exc)
                failed.update(pairs)
                continue
            self.index.drop_tables(table_name, pairs)
            done.update(pairs)
        settled = (done | pending) - failed
        self.index.drop_pending(settled & pending)
        self.index.add_pending(failed)
        result.settled, result.pending = len(done - failed), len(failed)
        return result

    def _update_table(self, adapter: DestinationAdapter, table_name: str, pairs: Mapping[str, Identity]) -> int:
        """The statements for one table (one per UPDATE_IDS ids); 0 when it has nothing to set."""
        table = adapter.read_table(table_name)
        if table is None:
            return 0
        table = self._with_user_columns(adapter, table, pairs)
        found = self.columns.table_columns(table.columns)
        if found is None:
            return 0
        anonymous, users = found
        values = {a: [identity[i] if i < len(identity) else None for i, _ in users] for a, identity in pairs.items()}
        values = {a: v for a, v in values.items() if any(x is not None for x in v)}
        items = list(values.items())
        for start in range(0, len(items), UPDATE_IDS):
            part = dict(items[start : start + UPDATE_IDS])
            adapter.recognize_users(table, anonymous, [column for _, column in users], part)
        return (len(items) + UPDATE_IDS - 1) // UPDATE_IDS

    def _with_user_columns(self, adapter: DestinationAdapter, table: Table, pairs: Mapping[str, Identity]) -> Table:
        """The table, with the user columns it lacks added (text; never changed or dropped): its
        rows were all anonymous until now, so no row of it had the columns to add them."""
        with_values = {i for identity in pairs.values() for i, value in enumerate(identity) if value is not None}
        missing = missing_user_columns(self.columns, table.columns, with_values)
        if not missing:
            return table
        text = adapter.dialect.types[DataType.STRING]
        adapter.patch(TablePatch(table.name, add_columns=dict.fromkeys(missing, text)))
        return adapter.read_table(table.name) or table

    def close(self) -> None:
        self.index.close()


def _by_table(
    tables: Mapping[str, Iterable[str]], identities: Mapping[str, Identity]
) -> dict[str, dict[str, Identity]]:
    work: dict[str, dict[str, Identity]] = {}
    for anonymous_id, names in tables.items():
        for name in names:
            work.setdefault(name, {})[anonymous_id] = identities[anonymous_id]
    return work


def sightings_of(columns: RecognitionColumns, rows: Iterable[tuple[str, Mapping[str, Any]]]) -> Sightings:
    """The sightings of (table, row values) pairs: a stream flush's delivered rows."""
    found = Sightings()
    for table, values in rows:
        sighting = columns.read(values)
        if sighting is not None:
            found.add(table, sighting)
    return found


__all__ = ["Recognizer", "RunResult", "build_index", "columns_of", "recognition_of", "sightings_of"]
