"""The stream workers of `eventspark serve`: one thread per `mode: stream` destination.

`StreamWorkers(loaded).start()` builds, for each stream destination, its adapter, step chain,
queue reader (`<log.path>/queue.dst=<id>/`), streaming archive and failed log, and starts its
worker thread; `stop()` lets each finish the batch in progress. Start it in the process that
serves (after forking collector workers, if any: a fork must not copy running threads).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from eventspark.config import LoadedConfig
from eventspark.config.base import RetrySection
from eventspark.config.models import Config, Destination
from eventspark.coordination import Coordination, build_coordination
from eventspark.destinations import build_destination
from eventspark.destinations.registry import destination_type
from eventspark.ops.cache import events_cache_for
from eventspark.ops.cache_results import StreamResults
from eventspark.recognition.stream import StreamRecognition
from eventspark.retry import retry_policy
from eventspark.steps.chain import DestinationChain
from eventspark.steps.diff import UnmappedRule
from eventspark.steps.lookup import GeoResolver, UserAgentParser
from eventspark.stream.archive import StreamArchive
from eventspark.stream.delivery import EventDelivery, TableDelivery
from eventspark.stream.queue import QueueReader, queue_dir
from eventspark.stream.worker import StreamSettings, StreamWorker

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class _PolicyDefaults:
    """What `retry_policy` reads of a config: its `retry:` section, and the node's stream backoff."""

    config: Config
    stream: StreamSettings

    @property
    def retry(self) -> RetrySection:
        return self.config.retry


class StreamWorkers:
    """Every stream worker of one node. Constructing it does no I/O."""

    def __init__(
        self,
        loaded: LoadedConfig,
        coordination: Coordination | None = None,
        settings: StreamSettings | None = None,
    ) -> None:
        self.config = loaded.config
        self.settings = settings or StreamSettings.from_config(getattr(self.config, "stream", None))
        self._own_coordination = coordination is None
        self.coordination = coordination or build_coordination(self.config.coordination, self.config.server.name)
        self.workers: dict[str, StreamWorker] = {}

    @property
    def destination_ids(self) -> list[str]:
        """The stream destinations of the config (the config refuses a type without stream mode)."""
        return [dest_id for dest_id, dest in self.config.destinations.items() if dest.mode == "stream"]

    def start(self) -> None:
        """Builds and starts a worker per stream destination (idempotent)."""
        started = []
        for dest_id in self.destination_ids:
            if dest_id not in self.workers:
                worker = self.workers[dest_id] = self.build(dest_id, self.config.destinations[dest_id])
                worker.start()
                started.append(dest_id)
        if started:
            log.info("stream workers started: %s", ", ".join(sorted(started)))

    def build(self, dest_id: str, dest: Destination) -> StreamWorker:
        """The worker of one destination, not started."""
        events_dir = Path(self.config.log.path)
        adapter = build_destination(dest_id, dest, events_dir)
        layout = dest.data_layout
        entry = destination_type(dest.type)
        tables = entry.capabilities.delivery == "tables"
        delivery: TableDelivery | EventDelivery
        if tables:
            delivery = TableDelivery(
                dest_id,
                adapter,
                self.coordination,
                layout.primary_key_fields,
                layout.max_columns or self.config.server.max_columns,
                unmapped=UnmappedRule.of(layout, layout.max_columns or self.config.server.max_columns),
            )
        else:  # events after enrichment and mapping, as objects (the HTTP family)
            delivery = EventDelivery(dest_id, adapter)  # type: ignore[arg-type]
        # Lookup caches are not shared between threads: each worker has its own resolvers.
        geo = GeoResolver.open(self.config.geo.maxmind_path)
        check_name = entry.dialect.quote
        chain = DestinationChain.build(dest_id, dest, geo, UserAgentParser(), check_name, flat=tables)
        reader = QueueReader(
            queue_dir(events_dir, dest_id),
            poll_interval=self.settings.poll_ms / 1000,
            fsync=self.config.server.fsync,
        )
        archive = StreamArchive(events_dir / "archive", dest_id)
        failed_dir = events_dir / "failed"
        worker = StreamWorker(dest_id, chain, reader, delivery, archive, failed_dir, self.settings_for(dest))
        cache = events_cache_for(self.config)
        if cache is not None:
            worker.cache = StreamResults(cache, dest_id, entry.dialect.column_type if tables else None)
        worker.recognition = StreamRecognition.build(self.config, dest_id, dest, self.coordination) if tables else None
        return worker

    def settings_for(self, dest: Destination) -> StreamSettings:
        """The node's settings with the destination's minimum insert interval and rows: from its
        `stream:` block, else its type's capabilities (ClickHouse: 1 s, 10,000 rows; others: none).
        They are per destination: the node's own values of those two fields are not used."""
        capabilities = destination_type(dest.type).capabilities
        own = dest.stream
        interval = own.min_insert_interval_sec
        rows = own.min_insert_rows
        # The retry policy: the destination's `retry:`, else the global one, else this node's
        # backoff (`stream.retry_min_sec`/`retry_max_sec`, which tests may pass as settings).
        policy = retry_policy(_PolicyDefaults(self.config, self.settings), dest)
        return dataclasses.replace(
            self.settings,
            min_insert_interval_sec=capabilities.min_insert_interval_sec if interval is None else interval,
            min_insert_rows=capabilities.min_insert_rows if rows is None else rows,
            retry_min_sec=policy.base_sec,
            retry_max_sec=policy.max_sec,
            retry_max_age_sec=policy.max_age_sec,
            fsync=self.config.server.fsync,
        )

    def apply(self, loaded: LoadedConfig, timeout: float | None = 30.0) -> None:
        """Switches to a reloaded config (`config.sources`): a new stream destination's worker
        starts; a removed one's stops after its batch in progress, its queue left on disk (resumed
        if the destination comes back); a changed one is stopped and rebuilt."""
        old = self.config.destinations
        self.config = loaded.config
        new = self.config.destinations
        stale = [d for d in self.workers if d not in new or new[d].mode != "stream" or new[d] != old.get(d)]
        # The global `retry:` section and `server.fsync` change a worker's settings too.
        stale += [d for d in self.workers if d not in stale and self.settings_for(new[d]) != self.workers[d].settings]
        for dest_id in stale:
            self.workers[dest_id].request_stop()
        for dest_id in stale:
            self.workers.pop(dest_id).stop(timeout)
            log.info("stream worker %s stopped (config reloaded)", dest_id)
        self.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stops every worker after its batch in progress; unacknowledged events stay queued."""
        for worker in self.workers.values():
            worker.request_stop()  # all at once: a worker waiting to retry must not delay the others
        for worker in self.workers.values():
            worker.stop(timeout)
        self.workers.clear()
        if self._own_coordination:
            self.coordination.close()
