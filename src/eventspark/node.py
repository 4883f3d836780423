"""What runs beside the HTTP collector in `eventspark serve`: the node's background services.

- the heartbeat that lists this node (`server.name`) in the coordination store;
- the batch uploader: one Spark job over the rotated logs every `log.uploader_period_sec`;
- one stream worker per stream destination;
- the retention of `archive/` and `failed/` (`logs.retention`): at start, every few minutes and
  after each batch pass.

They start in the serving process after any collector worker processes are forked (a fork must
not copy running threads or a JVM), and stop after the collector has flushed and rotated.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from eventspark.config import LoadedConfig
from eventspark.config.models import CoordinationConfig
from eventspark.config.sources import Reloader
from eventspark.coordination import Coordination, CoordinationError, build_coordination
from eventspark.coordination.base import DEFAULT_HEARTBEAT_TTL
from eventspark.destinations.sql import debug_log
from eventspark.logs.retention import Retention
from eventspark.logs.upload import node_name
from eventspark.ops.cache import events_cache_for, token_ids
from eventspark.ops.metrics import PipelineMetrics, Snapshots, pipeline_metrics, process_snapshots

log = logging.getLogger(__name__)


def heartbeat_period_of(section: CoordinationConfig | None) -> float:
    """A third of `coordination.heartbeat_ttl_sec` (10 s by default): a live node stays listed
    through two lost beats."""
    ttl = section.heartbeat_ttl_sec if section is not None else DEFAULT_HEARTBEAT_TTL
    return ttl / 3


class NodeServices:
    """Heartbeat, batch uploader and stream workers of one node; constructors do no I/O."""

    def __init__(self, loaded: LoadedConfig, heartbeat_period: float | None = None) -> None:
        """`heartbeat_period` None: a third of the configured heartbeat TTL (`heartbeat_period_of`)."""
        from eventspark.batch.uploader import Uploader
        from eventspark.stream.manager import StreamWorkers

        config = loaded.config
        self.coordination: Coordination = build_coordination(config.coordination, config.server.name)
        modes = {dest.mode for dest in config.destinations.values()}
        self.uploader = Uploader(loaded, self.coordination) if "batch" in modes else None
        self.stream = StreamWorkers(loaded, coordination=self.coordination) if "stream" in modes else None
        self.retention = Retention(config.log, node=node_name(config))  # its failed copies on log.remote
        self.heartbeat_period = heartbeat_period or heartbeat_period_of(config.coordination)
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self.log_path = Path(config.log.path)
        self._config = config
        self.pipeline: PipelineMetrics | None = None
        self.snapshots: Snapshots | None = None
        self.reloader = Reloader(loaded, self.apply) if loaded.sources else None
        debug_log.configure(config.sql_debug_log)  # the statements of stream workers and passes
        """api_keys / destinations given as URLs: fetched again every period (`config.sources`)."""

    def start(self) -> None:
        # The pipeline's counters and last-load records reach `/prometheus` and `eventspark status`
        # through files (any collector worker answers): see `eventspark.ops.metrics`.
        self.pipeline = pipeline_metrics()
        self.snapshots = process_snapshots(self.log_path)
        self.snapshots.add_source(self.pipeline.sample, self.pipeline.states.flush)
        self._beat()
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="eventspark-heartbeat", daemon=True)
        self._heartbeat.start()
        if self.stream is not None:
            self.stream.start()
        if self.uploader is not None:
            self.uploader.start()
        self.retention.start()
        if self.reloader is not None:
            self.reloader.start()

    def apply(self, loaded: LoadedConfig) -> None:
        """A reloaded config (on the reloader's thread): stream workers started, rebuilt or
        stopped; the uploader's next pass routes by it (the collector processes follow the
        published file themselves)."""
        from eventspark.batch.uploader import Uploader
        from eventspark.stream.manager import StreamWorkers

        modes = {dest.mode for dest in loaded.config.destinations.values()}
        if self.stream is None and "stream" in modes:
            self.stream = StreamWorkers(loaded, coordination=self.coordination)
        if self.stream is not None:
            self.stream.apply(loaded)
        if self.uploader is not None:
            self.uploader.loaded = loaded
        elif "batch" in modes:
            self.uploader = Uploader(loaded, self.coordination)
            self.uploader.start()
        self._config = loaded.config
        cache = events_cache_for(loaded.config)
        if cache is not None:  # the stream workers' results of new tokens show their ids
            cache.tokens.update(token_ids(loaded.config))

    def stop(self) -> None:
        """Stops the stream workers and waits for a batch pass in progress, then leaves the cluster."""
        self._stop.set()
        if self.reloader is not None:  # first: a reload must not start workers while they stop
            self.reloader.stop()
        if self.stream is not None:
            self.stream.stop()
        if self.uploader is not None:
            self.uploader.stop()
        self.retention.stop()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
        if self.snapshots is not None and self.pipeline is not None:
            self.snapshots.release(self.pipeline.sample, self.pipeline.states.flush)
        cache = events_cache_for(self._config)
        if cache is not None:  # the last results of the stream workers, written before exiting
            cache.close()
        self.coordination.close()

    def instances(self) -> list[str]:
        return self.coordination.instances()

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_period):
            self._beat()

    def _beat(self) -> None:
        try:
            self.coordination.heartbeat()
        except CoordinationError as exc:  # the store may be down for a while: keep serving events
            log.warning("heartbeat failed: %s", exc)
