"""Multiplexing at receipt: which files a token's events are written to.

A token's events go to its incoming log when at least one batch destination takes the token,
and to the persistent queue of every stream destination that takes it (`only_tokens`: ids or secrets;
absent means every token). Routes are computed once at start, not per event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from eventspark.collector.auth import Token
from eventspark.config.models import Config, Destination
from eventspark.config.routing import takes_token
from eventspark.logs.incoming import AppendOnlyFile, IncomingLogs
from eventspark.stream.queue import QueueWriter, queue_dir


class LineFile(Protocol):
    """What the collector needs of a file it appends event lines to (incoming log, stream queue)."""

    lines: int

    def write(self, data: bytes, lines: int = 1) -> None: ...

    def fsync(self) -> None: ...

    def close(self, sync: bool = False) -> None: ...


@dataclass(frozen=True, slots=True)
class Route:
    """Where one token's events go."""

    token_id: str
    batch_destinations: tuple[str, ...]
    stream_destinations: tuple[str, ...]
    incoming: AppendOnlyFile | None
    spools: tuple[QueueWriter, ...]
    files: tuple[LineFile, ...]
    """Every file a line of this token is appended to: the incoming log, then the spools."""

    @property
    def has_destination(self) -> bool:
        return bool(self.batch_destinations or self.stream_destinations)


def build_routes(
    config: Config,
    tokens: list[Token],
    logs: IncomingLogs,
    worker: int | None = None,
    existing: Mapping[str, QueueWriter] | None = None,
) -> tuple[dict[str, Route], dict[str, QueueWriter]]:
    """One route per token id, and the stream spools by destination id (`existing` ones kept:
    a reload of the config's sources)."""
    log_path = Path(config.log.path)
    existing = existing or {}
    spools = {
        dest_id: existing.get(dest_id) or QueueWriter(queue_dir(log_path, dest_id), worker)
        for dest_id, dest in config.destinations.items()
        if dest.mode == "stream"
    }
    routes = {token.id: _route(token, config.destinations, logs, spools) for token in tokens}
    return routes, spools


def _route(
    token: Token, destinations: Mapping[str, Destination], logs: IncomingLogs, spools: dict[str, QueueWriter]
) -> Route:
    taking = [dest_id for dest_id, dest in destinations.items() if takes_token(dest, token)]
    batch = tuple(d for d in taking if destinations[d].mode == "batch")
    stream = tuple(d for d in taking if destinations[d].mode == "stream")
    incoming = logs.file_for(token.id) if batch else None
    route_spools = tuple(spools[d] for d in stream)
    files: tuple[LineFile, ...] = ((incoming,) if incoming is not None else ()) + tuple(s.file for s in route_spools)
    return Route(token.id, batch, stream, incoming, route_spools, files)
