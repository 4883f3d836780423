"""`eventspark status`: what waits, what failed, what loaded last, per destination."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.markup import escape
from rich.table import Table as RichTable

from eventspark.commands.common import ConfigOption, err, load_logged, out
from eventspark.config.models import Config
from eventspark.config.routing import token_routes
from eventspark.logs.incoming import parse_log_name
from eventspark.logs.replay import replay_destination
from eventspark.ops.status import UNLIMITED, DestinationStatus, StatusReader, storage_usage

ERROR_CHARS = 120
"""Errors are cut to this length in the table and the plain lines (`--json` has them whole)."""
STORE_TIMEOUT_SEC = 10.0
"""How long `status` waits for the store of `log.remote` (its listing and status files)."""


def register(app: typer.Typer) -> None:
    """Adds this module's commands to the `eventspark` command."""
    app.command()(status)


def status(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document instead of a table.")] = False,
    store_timeout: Annotated[
        float, typer.Option("--store-timeout", min=0.1, help="Seconds to wait for the store of log.remote.")
    ] = STORE_TIMEOUT_SEC,
) -> None:
    """Per destination: events waiting (queue depth, rotated logs), the oldest one's age, failed
    events, the last load and the last error. Reads the files under log.path: works whether a
    node serves them or not. With log.remote, also the logs waiting on the store (their count
    and bytes: their events are not counted there), and the local rotated logs are this node's
    not uploaded yet."""
    loaded = load_logged(config)
    # One read: counting everything costs about a second per GB of backlog, never an estimate.
    reader = StatusReader(loaded.config, budget=UNLIMITED)
    statuses = reader.read()
    store = read_store(loaded.config, store_timeout) if loaded.config.log.remote is not None else None
    if not statuses and not as_json:
        out.print("no destination configured", highlight=False)
    elif as_json:
        document = {"log_path": str(Path(loaded.config.log.path)), "destinations": [s.to_json() for s in statuses]}
        document["held_logs"] = reader.held
        storage = storage_usage(Path(loaded.config.log.path))  # measured by the serving node's retention
        if storage is not None:
            document["storage"] = storage
        if store is not None:
            document["store"] = store.to_json()
        out.file.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif out.is_terminal:
        _print_table(statuses, store)
    else:
        # Written as they are: the console would expand the tabs that separate the fields.
        out.file.write("".join(plain_line(found, store) + "\n" for found in statuses))
    if store is not None and not as_json:
        _store_notes(store)
    if reader.held and not as_json:  # on stderr: scripts parse the lines above
        err.print(
            f"{len(reader.held)} rotated log(s) kept in incoming/, not loaded: no batch destination takes"
            f" their token (back in api_keys, they load): {escape(', '.join(reader.held[:5]))}"
            + (" ..." if len(reader.held) > 5 else ""),
            highlight=False,
        )


def _store_notes(store: StoreBacklog) -> None:
    """On stderr, as the held logs above: the store's error, or its logs no destination takes."""
    if store.error:
        err.print(escape(store.error), highlight=False)
    elif store.held:
        err.print(
            f"{len(store.held)} log(s) kept on the store, not loaded: no batch destination takes their token:"
            f" {escape(', '.join(store.held[:5]))}" + (" ..." if len(store.held) > 5 else ""),
            highlight=False,
        )


def plain_line(found: DestinationStatus, store: StoreBacklog | None = None) -> str:
    """One destination as `key=value` fields on one line (for scripts and logs). With a store
    (`log.remote`), `pending_logs` are this node's rotated logs not uploaded yet, and
    `store_logs`/`store_bytes` what waits on the store (`store=unreachable` when it did not answer)."""
    fields = [
        found.destination,
        f"mode={found.mode}",
        f"queue={found.queue_events}",
        f"pending_logs={found.pending_logs}",
        f"pending_log_events={found.pending_log_events}",
        f"oldest_pending={age(found.oldest_pending_age)}",
        f"failed={found.failed_events}",
        f"retry_attempts={found.retry_attempts}",
        f"retry_age={age(found.retry_oldest_age)}",
        f"last_load={moment(found.last_load_at)}",
        f"last_load_events={found.last_load_events}",
        f"last_error_at={moment(found.last_error_at)}",
        f"last_error={orjson.dumps(found.last_error[:ERROR_CHARS]).decode()}",
    ]
    if not found.exact:
        fields.append("estimated=yes")
    if store is not None and found.mode == "batch":
        waiting = store.waiting.get(found.destination)
        if waiting is None:
            fields.append("store=unreachable")
        else:
            fields += [f"store_logs={waiting.logs}", f"store_bytes={waiting.bytes}"]
    return "\t".join(fields)


def _print_table(statuses: list[DestinationStatus], store: StoreBacklog | None = None) -> None:
    logs_header = "pending logs" if store is None else "not uploaded"
    table = RichTable(
        "destination", "mode", "queue", logs_header, "oldest", "failed", "retrying", "last load", "last error"
    )
    if store is not None:
        table.add_column("on the store")
    for found in statuses:
        queue = f"{found.queue_events}{'' if found.exact else ' (est.)'}"
        logs = f"{found.pending_logs} ({found.pending_log_events} events)" if found.mode == "batch" else "-"
        last_load = f"{moment(found.last_load_at)} ({found.last_load_events})" if found.last_load_at else "never"
        error = f"{moment(found.last_error_at)}: {found.last_error[:ERROR_CHARS]}" if found.last_error else ""
        failed = f"[red]{found.failed_events}[/]" if found.failed_events else "0"
        table.add_row(
            escape(found.destination),
            found.mode,
            queue,
            logs,
            age(found.oldest_pending_age),
            failed,
            _retrying(found),
            last_load,
            f"[red]{escape(error)}[/]" if error else "",
            *([] if store is None else [_store_cell(found, store)]),
        )
    out.print(table)


def _store_cell(found: DestinationStatus, store: StoreBacklog) -> str:
    if found.mode != "batch":
        return "-"
    waiting = store.waiting.get(found.destination)
    return "[red]unreachable[/]" if waiting is None else f"{waiting.logs} logs ({waiting.bytes} bytes)"


def _retrying(found: DestinationStatus) -> str:
    """`-`, or the failed attempts and the age of the first (the retry policy's clock)."""
    if not found.retry_attempts:
        return "-"
    return f"[yellow]{found.retry_attempts} ({age(found.retry_oldest_age)})[/]"


def age(seconds: float | None) -> str:
    """`-`, `42s`, `5m07s`, `3h05m`, `2d04h`."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def moment(epoch: float | None) -> str:
    """`-` or the UTC time, `2026-01-02T15:04:05Z`."""
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the store of `log.remote` --------------------------------------------------------------------


@dataclass(slots=True)
class Waiting:
    """Rotated logs on the store that a destination has not loaded, and their bytes."""

    logs: int = 0
    bytes: int = 0


@dataclass(slots=True)
class StoreBacklog:
    """What waits on the store, per batch destination; `error` ("store unreachable: ...") when
    the store did not answer in time (then `waiting` is empty)."""

    url: str
    waiting: dict[str, Waiting] = field(default_factory=dict)
    held: list[str] = field(default_factory=list)
    """Logs on the store that no batch destination takes (kept there by the pass)."""
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        if self.error:
            return {"url": self.url, "error": self.error}
        waiting = {dest: {"pending_logs": w.logs, "pending_bytes": w.bytes} for dest, w in self.waiting.items()}
        return {"url": self.url, "destinations": waiting, "held_logs": self.held}


def read_store(config: Config, timeout: float) -> StoreBacklog:
    """The store's backlog, or an error after `timeout` seconds: the store is read on a daemon
    thread, so a store that never answers (a black-holed endpoint, retries of its client) cannot
    keep `status` from printing what this node knows, nor from exiting."""
    assert config.log.remote is not None
    url = config.log.remote.shown_url
    answer: list[StoreBacklog | BaseException] = []

    def work() -> None:
        try:
            answer.append(_store_backlog(config))
        except BaseException as exc:  # handed to the waiting thread, which words it
            answer.append(exc)

    thread = threading.Thread(target=work, name="eventspark-status-store", daemon=True)
    thread.start()
    thread.join(timeout)
    if not answer:
        return StoreBacklog(url, error=f"store unreachable: no answer from {url} within {timeout:g} s")
    found = answer[0]
    if isinstance(found, BaseException):
        return StoreBacklog(url, error=f"store unreachable: {url}: {type(found).__name__}: {found}")
    return found


def _store_backlog(config: Config) -> StoreBacklog:
    """One listing of the store's incoming/ and one concurrent read of its status files."""
    from eventspark.logs.store import log_store

    assert config.log.remote is not None
    store = log_store(config)
    logs = store.rotated()
    statuses = store.read_statuses(logs)
    batch = {d: dest for d, dest in config.destinations.items() if dest.mode == "batch"}
    _secrets, token_dests, default = token_routes(config.api_keys, batch)
    found = StoreBacklog(config.log.remote.shown_url, {dest_id: Waiting() for dest_id in batch})
    for logfile in logs:
        name = parse_log_name(logfile.name)
        replay = replay_destination(logfile.name) if name is None else None
        dests = (replay,) if replay is not None else token_dests.get(name.token_id, default) if name else ()
        if not dests:
            found.held.append(logfile.name)
        status = statuses.get(logfile.name, {})
        for dest_id in dests:
            tables = status.get(dest_id)
            if dest_id in found.waiting and not (tables is not None and all(p.settled for p in tables.values())):
                found.waiting[dest_id].logs += 1
                found.waiting[dest_id].bytes += logfile.size
    return found
