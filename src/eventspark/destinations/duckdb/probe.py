"""DuckDB's probe: the SQL probe, on the database file the node would open.

DuckDB lets one process at a time open a file for writing. In the serving process itself (one
collector worker) the probe's connection shares the node's open database, whose transactions
keep them apart; from another process (collector workers, `check --connect` beside `serve`)
opening a file the node holds fails at once with DuckDB's lock message, naming the holder's
PID: the probe answers that error and the node's file is untouched. A batch pass that opens the
file during the probe's few milliseconds gets a TransientError and retries the pair. A file the
probe creates is left in place (empty but for the marker table, as the node's first load would
make it): removing it could race with a node that opened it meanwhile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eventspark.destinations.sql import probe as sql_probe


def probe(adapter: Any, send_event: bool = False) -> str:
    path: Path = adapter.path
    existed = path.exists()
    checked = sql_probe.probe(adapter, send_event)
    return f"{checked} in {path}" + ("" if existed else " (the file was created)")
