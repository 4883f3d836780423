"""The ids of a batch pass kept on disk until recognition has run on them.

A pass commits its tables, then runs recognition. A crash in between must not lose the ids: a rerun
skips the committed pairs (their load markers), so their rows would never be seen again. The driver
writes each destination's ids to `<log.path>/state/recognition/dst=<id>.json` before the commits,
merges what a crashed pass left there into the next pass, and removes the file once recognition
ran (its failures are then pending in the index)."""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import quote

import orjson

from eventspark.logs.status import replace_file
from eventspark.steps.recognition import Sightings

log = logging.getLogger(__name__)


def _folder(log_path: Path) -> Path:
    return log_path / "state" / "recognition"


def _path(log_path: Path, dest_id: str) -> Path:
    return _folder(log_path) / f"dst={quote(dest_id, safe='')}.json"


def keep_sightings(log_path: Path, sightings: dict[str, Sightings], dest_ids: set[str]) -> None:
    """Adds what an earlier pass left for `dest_ids` to `sightings`, then writes them all down."""
    for dest_id in dest_ids:
        path = _path(log_path, dest_id)
        if path.exists():
            try:
                left = Sightings.from_dict(orjson.loads(path.read_bytes()))
            except (OSError, ValueError) as exc:
                log.warning("users recognition: unreadable %s ignored: %s", path, exc)
                continue
            sightings.setdefault(dest_id, Sightings()).merge(left)
    for dest_id, seen in sightings.items():
        _folder(log_path).mkdir(parents=True, exist_ok=True)
        replace_file(_path(log_path, dest_id), orjson.dumps(seen.to_dict()))


def done_sightings(log_path: Path, dest_id: str) -> None:
    _path(log_path, dest_id).unlink(missing_ok=True)
