"""The `failed/failed.dst=<destination_id>.log` files: one EventError JSON object per line.

A line is `{"event": <original event>, "error": "<reason>", "event_id": "<id>"}`. The Spark
executors spool the failures of a pass into files of their own; the driver appends a spool to the
destination's failed log once the pass's outcome for those events is final.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

COPY_CHUNK = 1024 * 1024


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
    return written
