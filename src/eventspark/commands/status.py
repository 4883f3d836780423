"""`eventspark status`: what waits, what failed, what loaded last, per destination."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.markup import escape
from rich.table import Table as RichTable

from eventspark.commands.common import ConfigOption, err, load_logged, out
from eventspark.ops.status import UNLIMITED, DestinationStatus, StatusReader, storage_usage

ERROR_CHARS = 120
"""Errors are cut to this length in the table and the plain lines (`--json` has them whole)."""


def register(app: typer.Typer) -> None:
    """Adds this module's commands to the `eventspark` command."""
    app.command()(status)


def status(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document instead of a table.")] = False,
) -> None:
    """Per destination: events waiting (queue depth, rotated logs), the oldest one's age, failed
    events, the last load and the last error. Reads the files under log.path: works whether a
    node serves them or not."""
    loaded = load_logged(config)
    # One read: counting everything costs about a second per GB of backlog, never an estimate.
    reader = StatusReader(loaded.config, budget=UNLIMITED)
    statuses = reader.read()
    if not statuses and not as_json:
        out.print("no destination configured", highlight=False)
    elif as_json:
        document = {"log_path": str(Path(loaded.config.log.path)), "destinations": [s.to_json() for s in statuses]}
        document["held_logs"] = reader.held
        storage = storage_usage(Path(loaded.config.log.path))  # measured by the serving node's retention
        if storage is not None:
            document["storage"] = storage
        out.file.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif out.is_terminal:
        _print_table(statuses)
    else:
        # Written as they are: the console would expand the tabs that separate the fields.
        out.file.write("".join(plain_line(found) + "\n" for found in statuses))
    if reader.held and not as_json:  # on stderr: scripts parse the lines above
        err.print(
            f"{len(reader.held)} rotated log(s) kept in incoming/, not loaded: no batch destination takes"
            f" their token (back in api_keys, they load): {escape(', '.join(reader.held[:5]))}"
            + (" ..." if len(reader.held) > 5 else ""),
            highlight=False,
        )


def plain_line(found: DestinationStatus) -> str:
    """One destination as `key=value` fields on one line (for scripts and logs)."""
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
    return "\t".join(fields)


def _print_table(statuses: list[DestinationStatus]) -> None:
    table = RichTable(
        "destination", "mode", "queue", "pending logs", "oldest", "failed", "retrying", "last load", "last error"
    )
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
        )
    out.print(table)


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
