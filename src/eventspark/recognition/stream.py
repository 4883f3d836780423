"""Users recognition in a stream worker: after each acknowledged flush, or less often for
destinations whose updates are expensive (ClickHouse mutations: at most one run per table every
MUTATION_INTERVAL_SEC, the flushes' ids gathered meanwhile)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from eventspark.destinations.base import DestinationAdapter, DestinationError
from eventspark.destinations.registry import destination_type
from eventspark.recognition.service import Recognizer
from eventspark.steps.chain import Row
from eventspark.steps.recognition import Sightings

log = logging.getLogger(__name__)

MUTATION_INTERVAL_SEC = 60.0
"""Least time between two recognition runs of a `mutation` destination in stream mode."""


class StreamRecognition:
    """The recognition of one stream destination; called from its worker thread only."""

    def __init__(self, recognizer: Recognizer, interval: float = 0.0) -> None:
        self.recognizer = recognizer
        self.interval = interval
        self.waiting = Sightings()
        self._last = time.monotonic()

    @classmethod
    def build(cls, config: Any, dest_id: str, dest: Any) -> StreamRecognition | None:
        recognizer = Recognizer.build(config, dest_id, dest)
        if recognizer is None:
            return None
        style = destination_type(dest.type).capabilities.users_recognition
        return cls(recognizer, MUTATION_INTERVAL_SEC if style == "mutation" else 0.0)

    def delivered(
        self, adapter: DestinationAdapter, tables: Mapping[str, Iterable[tuple[Row, bytes]]], failed: set[int]
    ) -> None:
        """Notes the ids of the delivered rows (`failed`: ids of the lines that failed) and runs
        when due. Never raises: recognition must not hold the queue up."""
        columns = self.recognizer.columns
        for table, items in tables.items():
            for row, line in items:
                if id(line) not in failed:
                    sighting = columns.read(row.values)
                    if sighting is not None:
                        self.waiting.add(table, sighting)
        self.run_if_due(adapter)

    def run_if_due(self, adapter: DestinationAdapter, force: bool = False) -> None:
        if not self.waiting and not force:
            return
        if not force and time.monotonic() - self._last < self.interval:
            return
        seen, self.waiting = self.waiting, Sightings()
        self._last = time.monotonic()
        try:
            done = self.recognizer.run(adapter, seen)
        except DestinationError as exc:  # the ids are in the index: settled on a later run
            log.warning("users recognition of %s failed: %s", self.recognizer.dest_id, exc)
            return
        if done.updates:
            log.info(
                "users recognition of %s: %d update(s), %d id(s) settled, %d pending",
                self.recognizer.dest_id,
                done.updates,
                done.settled,
                done.pending,
            )
