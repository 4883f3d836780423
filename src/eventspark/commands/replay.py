"""Failed events and replay: `eventspark failed`, `eventspark replay`; and `eventspark process`
while a node serves the same directory (`process_through_node`)."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from eventspark.commands.common import ConfigOption, err, load_logged, out
from eventspark.config import LoadedConfig

WAIT_SECONDS = 600.0
"""How long the CLI waits for a pass that the serving node runs."""


def register(app: typer.Typer) -> None:
    """Adds this module's commands to the `eventspark` command."""
    app.command()(failed)
    app.command()(replay)


def failed(
    config: ConfigOption = None,
    destination: Annotated[str | None, typer.Option("--destination", "-d", help="Only this destination.")] = None,
    all_files: Annotated[bool, typer.Option("--all", help="Also the files moved by earlier replays.")] = False,
    top: Annotated[int, typer.Option(help="Reasons shown per file.")] = 5,
) -> None:
    """Lists the failed-event files with their counts and their most frequent reasons."""
    from eventspark.ops.fallback import failed_files, reasons

    loaded = load_logged(config)
    files = failed_files(Path(loaded.config.log.path), {destination} if destination else None, replayed=all_files)
    if not files:
        out.print("no failed events", highlight=False)
        return
    rows = []
    for file in files:
        events, common = reasons(file.path, top)
        rows.append((file.file_name, file.destination_id, events, file.path.stat().st_size, common))
    if out.is_terminal:
        _print_table(rows)
    else:
        for name, dest_id, events, size, common in rows:
            out.print(escape(f"{name}  destination={dest_id}  events={events}  bytes={size}"), highlight=False)
            for reason, count in common:
                out.print(escape(f"  {count} × {reason}"), highlight=False)
    total = sum(row[2] for row in rows)
    out.print(f"{total} failed event(s) in {len(rows)} file(s)", highlight=False)


def _print_table(rows: list[tuple[str, str, int, int, list[tuple[str, int]]]]) -> None:
    table = RichTable("file", "destination", "events", "top reasons")
    for name, dest_id, events, _size, common in rows:
        text = "\n".join(f"{count} × {reason}" for reason, count in common)
        table.add_row(escape(name), escape(dest_id), str(events), escape(text))
    out.print(table)


def replay(
    files: Annotated[list[str], typer.Argument(help="Names from `eventspark failed`, or failed/… or archive/… paths.")],
    config: ConfigOption = None,
    destination: Annotated[str | None, typer.Option("--destination", "-d", help="Replay into this one.")] = None,
    file_format: Annotated[str | None, typer.Option("--format", help="failed or raw_json (default by folder).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replay a file that was replayed already.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be replayed where; change nothing.")
    ] = False,
) -> None:
    """Replays failed files or archived logs through the pipeline again, then loads them."""
    from eventspark.ops.replay import ReplayError, count_events, hand_over, needs_batch_pass, plan_replay

    loaded = load_logged(config)
    plans = []
    try:
        for name in files:
            plans.append(plan_replay(loaded.config, name, destination, file_format, force))
    except ReplayError as exc:
        err.print(f"[red]{escape(str(name))}: {escape(exc.message)}[/] {escape(exc.error)}", highlight=False)
        raise typer.Exit(code=1) from None
    if dry_run:
        for plan in plans:
            events, unreadable = count_events(plan)
            into = ", ".join(f"{dest_id} ({mode})" for dest_id, mode in plan.targets.items())
            extra = f", {unreadable} unreadable line(s) left in the file" if unreadable else ""
            out.print(escape(f"would replay {events} event(s) of {plan.file_name} into {into}{extra}"), highlight=False)
        out.print("dry run: nothing changed", highlight=False)
        return
    records = []
    for plan in plans:
        try:
            record = hand_over(loaded.config, plan)
        except ReplayError as exc:  # another replay took the file meanwhile: the others go on
            err.print(f"[red]{escape(plan.file_name)}: {escape(exc.message)}[/] {escape(exc.error)}", highlight=False)
            continue
        except OSError as exc:  # the replay's record says what was handed over
            err.print(f"[red]{escape(plan.file_name)}: failed to hand the events over[/] {escape(str(exc))}")
            continue
        records.append(record)
        for dest_id, target in record["destinations"].items():
            where = target.get("replay_log") or target.get("queue") or "nothing to replay"
            out.print(escape(f"{plan.file_name}: {target['events']} event(s) → {dest_id} ({where})"), highlight=False)
    ok = len(records) == len(plans)
    if any(needs_batch_pass(record) for record in records):
        ok = _pass_for_replays(loaded, records) and ok
    raise typer.Exit(code=0 if ok else 1)


def _pass_for_replays(loaded: LoadedConfig, records: list[dict[str, Any]]) -> bool:
    from eventspark.ops.replay import run_batch_pass, save_pass

    request_id, answer = run_batch_pass(loaded, WAIT_SECONDS, "eventspark replay")
    for record in records:
        save_pass(Path(loaded.config.log.path), record, request_id, answer)
    return print_answer(answer, request_id, out)


def print_answer(answer: dict[str, Any] | None, request_id: str | None, console: Console) -> bool:
    """Prints a pass's answer like `eventspark process` prints its summary; False unless it is OK."""
    if answer is None:
        console.print(f"the pass has not finished yet; request {request_id} (GET /api/v1/batch/run)")
        return False
    pairs = answer.get("pairs") or []
    if not pairs:
        console.print("nothing to load", highlight=False)
    else:
        table = RichTable("destination", "table", "rows", "failed", "skipped", "status")
        for pair in pairs:
            status = f"[red]FAILED: {escape(pair['error'])}[/]" if pair["error"] else "[green]OK[/]"
            counts = (str(pair["rows"]), str(pair["failed"]), str(pair["skipped"]))
            table.add_row(escape(pair["destination_id"]), escape(pair["table"] or "-"), *counts, status)
        console.print(table)
    if answer.get("error"):
        console.print(f"[red]{escape(answer['error'])}[/]")
    console.print(
        f"{answer.get('archived', 0)} log(s) archived, {answer.get('kept', 0)} kept for retry, "
        f"{answer.get('deleted_empty', 0)} empty deleted",
        highlight=False,
    )
    return answer.get("status") == "ok"


# --- `eventspark process` while a node serves -----------------------------------------------------


def process_through_node(loaded: LoadedConfig, console: Console) -> bool:
    """Asks the node serving this directory for a pass now and prints its summary.

    With `server.admin_token`, through `POST /api/v1/batch/run`; without it (or when the node does
    not answer over HTTP), through a pass request file. Either way the node's collector processes
    are asked to rotate their live logs first (`ops.passes.RotationRequests`)."""
    from eventspark.ops.passes import request_pass, wait_answer

    config = loaded.config
    if not any(dest.mode == "batch" for dest in config.destinations.values()):
        console.print("nothing to load: no batch destination (stream destinations load continuously)")
        return True
    console.print("a node serves this directory: asking it for a pass now", highlight=False)
    answer = _ask_over_http(loaded) if config.server.admin_token else None
    if answer is None:
        request_id = request_pass(Path(config.log.path), "eventspark process", rotate=True)
        answer = wait_answer(Path(config.log.path), request_id, WAIT_SECONDS)
        return print_answer(answer, request_id, console)
    if answer.get("status") in ("pending", "running"):  # 202: not finished in time
        return print_answer(None, answer.get("request_id"), console)
    return print_answer(answer, answer.get("request_id"), console)


def _ask_over_http(loaded: LoadedConfig) -> dict[str, Any] | None:
    server = loaded.config.server
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(server.host, server.host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    url = f"http://{host}:{server.port}/api/v1/batch/run?wait={WAIT_SECONDS:g}"
    request = urllib.request.Request(url, method="POST", headers={"X-Admin-Token": server.admin_token or ""})
    try:
        with urllib.request.urlopen(request, timeout=WAIT_SECONDS + 30) as response:
            answer: dict[str, Any] = orjson.loads(response.read())
    except (urllib.error.URLError, OSError, orjson.JSONDecodeError) as exc:
        err.print(f"[yellow]the node did not answer on {escape(url)}[/]: {escape(str(exc))}", highlight=False)
        return None
    return answer
