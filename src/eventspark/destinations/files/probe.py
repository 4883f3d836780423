"""The files family's probe (`DestinationType.probe`): put a small object, then delete it.

The object is `<folder>/_eventspark_probe/<job id>.txt`: beside the destination's table folders,
never inside one, so the driver's stale-object removal (per table folder) never meets it.
"""

from __future__ import annotations

import io
import time
from typing import Any

from eventspark.destinations.base import new_job_id

PROBE_FOLDER = "_eventspark_probe"
PROBE_BODY = b"eventspark destination test: this object is deleted right after it is written\n"


def probe(adapter: Any, send_event: bool = False) -> str:
    """Writes and deletes the probe object; DestinationError with the store's message."""
    key = "/".join(part for part in (adapter.folder, PROBE_FOLDER, f"{new_job_id(time.time())}.txt") if part)
    store = adapter.store.open()
    try:
        store.put(key, io.BytesIO(PROBE_BODY), len(PROBE_BODY), "text/plain")
        store.delete([key])
    finally:
        store.close()
    return f"wrote and deleted {adapter.store.url(key)}"
