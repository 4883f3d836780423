"""The `failed/failed.dst=<destination_id>.log` files: one EventError JSON object per line.

A line is `{"event": <original event>, "error": "<reason>", "event_id": "<id>"}`. The Spark
executors spool the failures of a pass into files of their own; the driver appends a spool to the
destination's failed log once the pass's outcome for those events is final.

Spools of a destination/table pair are *parked* in `failed/pending/` before the pair is committed.
Once a pair is committed its log is never read for that table again, so a crash between the commit
and the append would otherwise lose those failures; the next pass finds the parked spools and
appends those whose pair the destination's load markers show committed (the others are dropped:
the retry of the pair spools them again). A crash between an append and the removal of its parked
spools can write those lines twice: the failed log is at-least-once. Spools are fsynced by the
executors, manifests and the failed log here, so a power loss loses none of it either.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from eventspark.logs.status import replace_file

log = logging.getLogger(__name__)

COPY_CHUNK = 1024 * 1024
PENDING_DIR = "pending"


def failed_log_path(failed_dir: Path, dest_id: str) -> Path:
    return failed_dir / f"failed.dst={dest_id}.log"


def event_id_of(event: Any) -> str:
    """`eventn_ctx.event_id`, else the flat `eventn_ctx_event_id`, else ''."""
    if not isinstance(event, dict):
        return ""
    ctx = event.get("eventn_ctx")
    found = ctx.get("event_id") if isinstance(ctx, dict) else None
    if found is None:
        found = event.get("eventn_ctx_event_id")
    return found if isinstance(found, str) else "" if found is None else str(found)


def event_error_line(event: Any, error: str, event_id: str | None = None) -> bytes:
    """One EventError line (with its newline). `event` is the parsed event (or an
    `orjson.Fragment` of the line as received), or the raw line when it was not JSON, so that
    nothing the client sent is lost. `event_id` defaults to the id found in `event`."""
    record = {
        "event": event,
        "error": error,
        "event_id": event_id_of(event) if event_id is None else event_id,
    }
    return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS)


def append_spools(failed_dir: Path, dest_id: str, spools: Iterable[Path]) -> int:
    """Appends spool files to the failed log of `dest_id` (streamed, not read into memory).

    Returns the number of bytes appended. Missing spools are ignored: a retry may have removed them.
    """
    failed_dir.mkdir(parents=True, exist_ok=True)
    written = 0
    with failed_log_path(failed_dir, dest_id).open("ab") as out:
        for spool in spools:
            try:
                with spool.open("rb") as src:
                    shutil.copyfileobj(src, out, COPY_CHUNK)
                    written += src.tell()
            except FileNotFoundError:
                continue
        out.flush()
        os.fsync(out.fileno())  # before the caller removes what it appended
    return written


# --- spools parked across a commit ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParkedSpools:
    """The failed-event spools of one (log, destination, table), parked while the pair commits."""

    manifest: Path
    log: str
    dest_id: str
    table: str
    spools: tuple[Path, ...]


def park_spools(failed_dir: Path, log_name: str, dest_id: str, table: str, spools: list[Path]) -> ParkedSpools:
    """Moves the spools under `failed/pending/` with a manifest naming their pair (module docstring)."""
    folder = failed_dir / PENDING_DIR / uuid.uuid4().hex
    folder.mkdir(parents=True)
    found = [spool for spool in spools if spool.exists()]
    if len(found) < len(spools):
        # Only on a cluster whose executors spool to their own disks: log.path must be shared.
        log.warning(
            "failed-event spools missing on this node (is log.path shared?): %d of %d",
            len(spools) - len(found),
            len(spools),
        )
    # shutil.move renames, or copies when the staging folder is on another file system.
    moved = tuple(Path(shutil.move(spool, folder / f"{index}.log")) for index, spool in enumerate(found))
    manifest = folder / "manifest.json"
    record = {"log": log_name, "dest": dest_id, "table": table, "spools": [p.name for p in moved]}
    replace_file(manifest, orjson.dumps(record))
    return ParkedSpools(manifest, log_name, dest_id, table, moved)


def parked_spools(failed_dir: Path) -> list[ParkedSpools]:
    """Every parked group a pass left behind; a folder without a manifest (cut short while parking) is removed."""
    found = []
    root = failed_dir / PENDING_DIR
    for folder in sorted(root.iterdir()) if root.is_dir() else ():
        try:
            record = orjson.loads((folder / "manifest.json").read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            shutil.rmtree(folder, ignore_errors=True)  # its spools came from a pass that never committed
            continue
        spools = tuple(folder / name for name in record["spools"])
        found.append(ParkedSpools(folder / "manifest.json", record["log"], record["dest"], record["table"], spools))
    return found


def settle_parked(failed_dir: Path, parked: Iterable[ParkedSpools], committed: bool) -> None:
    """Appends the parked spools to their destinations' failed logs when `committed`; removes them either way."""
    groups = list(parked)
    if committed:
        by_dest: dict[str, list[Path]] = {}
        for group in groups:
            by_dest.setdefault(group.dest_id, []).extend(group.spools)
        for dest_id, spools in by_dest.items():
            append_spools(failed_dir, dest_id, spools)
    for group in groups:
        group.manifest.unlink(missing_ok=True)  # first: a folder without a manifest is never appended
        shutil.rmtree(group.manifest.parent, ignore_errors=True)
