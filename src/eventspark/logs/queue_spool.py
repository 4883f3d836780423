"""Stand-in for a stream destination's persistent queue: an append-only file in `queue.dst=<id>/`.

The collector appends each enriched event line here for every stream destination of the token;
the stream worker consumes the file. The persistent queue of the stream pipeline replaces this
class (same `append` contract: the line is in the OS before the call returns).
"""

from __future__ import annotations

from pathlib import Path

from eventspark.logs.incoming import AppendOnlyFile

__all__ = ["StreamSpool", "spool_dir"]


def spool_dir(log_path: Path, destination_id: str) -> Path:
    """`<log.path>/queue.dst=<destination_id>`."""
    return log_path / f"queue.dst={destination_id}"


class StreamSpool:
    """Lines for one stream destination, appended to `spool.log` (`spool.w=<n>.log` per worker)."""

    def __init__(self, directory: Path, worker: int | None = None) -> None:
        name = "spool.log" if worker is None else f"spool.w={worker}.log"
        self.file = AppendOnlyFile(directory / name)

    def append(self, line: bytes, lines: int = 1) -> None:
        """Appends whole newline-terminated lines (`lines` of them) with one write."""
        self.file.write(line, lines)

    def close(self, sync: bool = False) -> None:
        self.file.close(sync=sync)
