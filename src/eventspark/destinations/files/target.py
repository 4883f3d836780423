"""The files family's two halves: `FilesTarget`, which executors write objects with, and
`FilesDestination`, the driver's adapter.

A files destination has no tables: the batch job (`Capabilities.stage == "objects"`) neither
reads nor patches any, nor keeps load markers. Each executor task writes one object per log split
and table at the end of its split (`batch.partition.PartitionTask.end_split`); the object's name
comes from the log and the split (`naming`), so rerunning a log after a crash overwrites the
objects the killed pass wrote. The driver's `commit` lists each log's objects of the table and
removes those this pass did not write (another split layout); the status file's per-pair
`uploaded` records completion.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eventspark.destinations.base import (
    DestinationAdapter,
    Load,
    ObjectBuffer,
    StagedChunk,
    TerminalError,
)
from eventspark.destinations.files.capabilities import FILES_CAPABILITIES
from eventspark.destinations.files.formats import CONTENT_TYPES, EventBuffer, FlatBuffer, encode_file, new_buffer
from eventspark.destinations.files.naming import OBJECT_NAMES, log_prefix, object_key, stale
from eventspark.destinations.files.store import ObjectStore, StoreSettings
from eventspark.steps.chain import SKIP, ChainResult, DestinationChain, Failure, Row
from eventspark.steps.diff import Table, TablePatch
from eventspark.steps.template import TemplateEvalError
from eventspark.steps.typing import BatchHeader

_NO_CASTS: Mapping[str, str] = {}


class EnrichedChain(DestinationChain):
    """The chain of the `json` format: table name template and lookups, no mapping, no flattening:
    `Row.values` is the event as received, after enrichment."""

    __slots__ = ()

    def process(self, event: dict[str, Any]) -> ChainResult:
        if self.transform is not None:  # the transformed events, as they are (docs/transforms.md)
            return self._process_transformed(event)
        try:
            table = self.template.render(event)
        except TemplateEvalError as exc:
            return Failure(f"table_name_template: {exc}")
        if not table:
            return SKIP
        if table not in self._accepted:
            refused = self._refuse(table)
            if refused is not None:
                return refused
        self.lookup.apply(event)
        return Row(table, event, _NO_CASTS)

    def _map(self, event: dict[str, Any]) -> tuple[dict[str, Any], Mapping[str, str]]:
        return event, _NO_CASTS  # the json format has no mapping


@dataclass
class FilesTarget:
    """Picklable (sent to every executor in the job plan): where and how objects are written.
    The store client is opened on first use in each task and closed with the task."""

    store: StoreSettings
    folder: str
    format: str
    compression: str
    _opened: ObjectStore | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_opened": None}

    def chain(self, dest_id: str, dest: Any, geo: Any, ua: Any, check_name: Any) -> DestinationChain:
        if self.format == "json":  # events as objects: not flattened, with a transform too
            return EnrichedChain.build(dest_id, dest, geo, ua, check_name, flat=False)
        return DestinationChain.build(dest_id, dest, geo, ua, check_name)

    def buffer(self, table: str) -> ObjectBuffer:
        return new_buffer(self.format, table)

    def write(self, buffer: ObjectBuffer, log: str, start: int, whole: bool) -> tuple[StagedChunk, BatchHeader]:
        assert isinstance(buffer, EventBuffer | FlatBuffer)
        key = object_key(self.folder, buffer.table, log, start, whole, self.format, self.compression)
        try:
            try:
                data, size, header = encode_file(buffer, self.format, self.compression)
            except (ValueError, TypeError, OverflowError) as exc:
                raise TerminalError(f"{self.store.service}: encoding {self.store.url(key)}: {exc}") from exc
            with data:
                if self._opened is None:
                    self._opened = self.store.open()
                self._opened.put(key, data, size, CONTENT_TYPES[self.format])
        finally:
            buffer.close()
        columns = {name: f.type for name, f in header.fields.items()}
        return StagedChunk(key, columns, buffer.total), header

    def close(self) -> None:
        if self._opened is not None:
            opened, self._opened = self._opened, None
            opened.close()


class FilesDestination(DestinationAdapter):
    """The driver's side of a files destination: no tables, no stage, no markers."""

    dialect = OBJECT_NAMES
    capabilities = FILES_CAPABILITIES

    def __init__(self, dest_id: str, store: StoreSettings, folder: str, fmt: str, compression: str) -> None:
        self.dest_id = dest_id
        self.store = store
        self.folder = folder
        self.format = fmt
        self.compression = compression
        self._opened: ObjectStore | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dest_id!r}, {self.store.url(self.folder)!r}, {self.format!r})"

    def _store(self) -> ObjectStore:
        if self._opened is None:
            self._opened = self.store.open()
        return self._opened

    def read_tables(self) -> dict[str, Table]:
        return {}

    def read_table(self, name: str) -> Table | None:
        return None

    def patch(self, patch: TablePatch) -> None:
        raise TerminalError(f"{self.store.service}: a files destination has no tables to patch")

    def stage_target(self, job_id: str, pass_bytes: int = 0) -> FilesTarget:  # type: ignore[override]
        return FilesTarget(self.store, self.folder, self.format, self.compression)

    def commit(self, load: Load) -> None:
        """Removes the objects of `load.files` in the table that this pass did not write."""
        written = {chunk.ref for chunk in load.chunks}
        store = self._store()
        for log in load.files:
            prefix = log_prefix(self.folder, load.table.name, log)
            extra = stale(prefix, store.list(prefix), written, self.format)
            if extra:
                store.delete(extra)

    def loaded_files(self, dest_id: str, files: Iterable[str]) -> set[tuple[str, str]]:
        return set()  # no markers: the status files record which pairs are uploaded

    def drop_stages(self, job_id: str) -> None:
        return None

    def drop_stale_stages(self, before: float) -> None:
        return None

    def insert(self, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
        raise TerminalError(f"{self.store.service}: a files destination runs in batch mode only")

    def close(self) -> None:
        if self._opened is not None:
            opened, self._opened = self._opened, None
            opened.close()
