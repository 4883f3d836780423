"""The object store protocol: what each service of the files family implements (its `client.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, Protocol


class ObjectStore(Protocol):
    """One client of a bucket. Every method raises `TransientError` (unreachable, timeouts, 5xx,
    throttling) or `TerminalError` (no such bucket, access denied...), messages without secrets."""

    def put(self, key: str, data: IO[bytes], size: int, content_type: str) -> None:
        """Writes (or overwrites) object `key` with the `size` bytes of `data` (a seekable file at
        offset 0: a retry reads it again)."""
        ...

    def list(self, prefix: str) -> list[str]:
        """The names of the objects under `prefix`."""
        ...

    def delete(self, keys: Sequence[str]) -> None: ...

    def close(self) -> None: ...


class StoreSettings(Protocol):
    """Picklable: what opening a client of the bucket needs (sent to every executor)."""

    service: str
    """`s3` or `gcs`: for messages."""

    def open(self) -> ObjectStore: ...

    def url(self, key: str) -> str:
        """`s3://bucket/key`, `gs://bucket/key`: for messages."""
        ...
