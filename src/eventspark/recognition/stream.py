"""Users recognition in a stream worker: each flush's ids are recorded in the index before the
flush is acknowledged; their rows are settled after the acknowledgement, or less often for
destinations whose updates are expensive (ClickHouse mutations: at most one settle every
MUTATION_INTERVAL_SEC, the pending ids gathered in the index meanwhile, so that with a Redis
index a crash in between loses none)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from eventspark.coordination import Coordination, CoordinationError
from eventspark.destinations.base import DestinationAdapter, DestinationError
from eventspark.destinations.registry import destination_type
from eventspark.recognition.service import Recognizer
from eventspark.steps.chain import Row
from eventspark.steps.recognition import Sightings

log = logging.getLogger(__name__)

MUTATION_INTERVAL_SEC = 60.0
"""Least time between two settles of a `mutation` destination in stream mode."""


class StreamRecognition:
    """The recognition of one stream destination; called from its worker thread only."""

    def __init__(self, recognizer: Recognizer, interval: float = 0.0) -> None:
        self.recognizer = recognizer
        self.interval = interval
        self.unrecorded = Sightings()
        """Ids the index could not take yet (Redis away): recorded with the next flush's (bounded)."""
        self._due = True  # a first settle takes what a stopped or crashed worker left pending
        self._last = time.monotonic()

    @classmethod
    def build(cls, config: Any, dest_id: str, dest: Any, coordination: Coordination) -> StreamRecognition | None:
        recognizer = Recognizer.build(config, dest_id, dest, coordination)
        if recognizer is None:
            return None
        style = destination_type(dest.type).capabilities.users_recognition
        return cls(recognizer, MUTATION_INTERVAL_SEC if style == "mutation" else 0.0)

    def delivered(self, tables: Mapping[str, Iterable[tuple[Row, bytes]]], failed: set[int]) -> None:
        """Records the ids of a flush's delivered rows (`failed`: ids of the lines that failed),
        before the flush is acknowledged: once acknowledged, its rows are never read again.
        Never raises: an index away keeps them for the next flush."""
        seen, self.unrecorded = self.unrecorded, Sightings()
        columns = self.recognizer.columns
        for table, items in tables.items():
            for row, line in items:
                if id(line) not in failed:
                    sighting = columns.read(row.values)
                    if sighting is not None:
                        seen.add(table, sighting)  # bounded: past MAX_SIGHTINGS ids, counted as dropped
        self._record(seen)

    def _record(self, seen: Sightings) -> None:
        if not seen:
            return
        if self.recognizer.record(seen):
            self._due = True
        else:
            self.unrecorded = seen

    def run_if_due(self, adapter: DestinationAdapter, force: bool = False) -> None:
        """Settles the pending ids when something was recorded and the interval has passed
        (`force`: now, e.g. when the worker stops)."""
        if force:
            seen, self.unrecorded = self.unrecorded, Sightings()
            self._record(seen)
        elif not self._due or time.monotonic() - self._last < self.interval:
            return
        self._last = time.monotonic()
        try:
            done = self.recognizer.settle(adapter)
        except (DestinationError, CoordinationError) as exc:  # the ids stay pending: a later settle
            log.warning("users recognition of %s failed: %s", self.recognizer.dest_id, exc)
            return
        self._due = done.skipped or done.pending > 0
        if done.updates:
            log.info(
                "users recognition of %s: %d update(s), %d id(s) settled, %d pending",
                self.recognizer.dest_id,
                done.updates,
                done.settled,
                done.pending,
            )
