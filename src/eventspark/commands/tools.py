"""Setting up a destination: `eventspark dry-run`, and the probes of `eventspark check --connect`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.markup import escape
from rich.table import Table

from eventspark.commands.common import ConfigOption, err, load_logged, out

MAX_INPUT_BYTES = 64 * 1024 * 1024


def register(app: typer.Typer) -> None:
    """Adds this module's commands to the `eventspark` command."""
    app.command("dry-run")(dry_run)


def dry_run(
    destination: Annotated[str, typer.Option("--destination", "-d", help="The destination id in the config.")],
    config: ConfigOption = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="The event(s) as JSON; without it, standard input.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    token: Annotated[
        str | None, typer.Option("--token", help="Token id whose secret becomes api_key; default: the first one.")
    ] = None,
) -> None:
    """Shows what events (one JSON object, an array, or a template body) would become in a
    destination: table, columns, types and values; nothing is written.

    Exits 0 when every event would be stored or skipped, 1 when one would fail, 2 on bad input."""
    loaded = load_logged(config)
    cfg = loaded.config
    dest = cfg.destinations.get(destination)
    if dest is None:
        _fail(f"no destination {destination!r} in the config (it has: {', '.join(cfg.destinations) or 'none'})")
    events = _read_events(file)
    secret = _token_secret(cfg, dest, token)
    from eventspark.ops.dryrun import dry_run as run
    from eventspark.steps.context import enrich_context, utc_timestamp

    now = utc_timestamp()
    for event in events:  # as the s2s endpoint enriches them, from this machine
        enrich_context(event, token=secret, source_ip="127.0.0.1", user_agent=None, server_side=True, timestamp=now)
    results = run(destination, dest, Path(cfg.log.path), cfg.geo.maxmind_path, events, cfg.server.max_columns)
    if as_json:
        document = {"destination_id": destination, "events": [r.to_dict() for r in results]}
        sys.stdout.buffer.write(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        for index, result in enumerate(results):
            _print_result(index, len(results), result)
    if any(r.status == "failed" for r in results):
        raise typer.Exit(code=1)


def _fail(message: str) -> Any:
    err.print(f"[bold red]error[/]: {escape(message)}", highlight=False)
    raise typer.Exit(code=2)


def _read_events(file: Path | None) -> list[dict[str, Any]]:
    from eventspark.collector.body import parse_events
    from eventspark.collector.http import HTTPError
    from eventspark.ops.dryrun import MAX_EVENTS

    try:
        raw = file.read_bytes() if file is not None else sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        return _fail(f"cannot read {file}: {exc.strerror or exc}")
    if len(raw) > MAX_INPUT_BYTES:
        _fail(f"the input is larger than {MAX_INPUT_BYTES} bytes")
    try:
        events = parse_events(raw)
    except HTTPError as exc:
        return _fail(f"{exc.message}: {exc.error}")
    if not 1 <= len(events) <= MAX_EVENTS:
        _fail(f"a dry run takes 1 to {MAX_EVENTS} events, got {len(events)}")
    return events


def _token_secret(cfg: Any, dest: Any, token_id: str | None) -> str:
    """The server secret (else client secret) of `token_id`, else of the first token the
    destination takes; '' when it takes none."""
    from eventspark.config.routing import takes_token

    keys = [k for k in cfg.api_keys if token_id is None or token_id in (k.id, k.client_secret, k.server_secret)]
    if token_id is not None and not keys:
        _fail(f"no token {token_id!r} in the config")
    taking = [k for k in keys if takes_token(dest, k)]
    if token_id is not None and not taking:
        _fail(f"the destination does not take token {token_id!r} (only_tokens)")
    return (taking[0].server_secret or taking[0].client_secret) if taking else ""


def _print_result(index: int, count: int, result: Any) -> None:
    which = f"event {index + 1}/{count}: " if count > 1 else ""
    if result.status != "ok":
        colour = "yellow" if result.status == "skipped" else "bold red"
        out.print(f"{which}[{colour}]{result.status}[/]: {escape(result.error)}", highlight=False)
        return
    out.print(f"{which}table [bold]{escape(result.table)}[/]", highlight=False)
    table = Table("field", "type", "value")
    for row in result.fields:
        value = row["value"]
        shown = value if isinstance(value, str) else orjson.dumps(value).decode()
        table.add_row(escape(row["field"]), escape(row["type"]), escape(shown))
    out.print(table)


def check_connections(cfg: Any, timeout: float) -> bool:
    """`check --connect`: every destination's probe at once; prints ok/error per destination."""
    from eventspark.ops.probe import probe_destination, run_all

    events_dir = Path(cfg.log.path)

    def work(dest_id: str, dest: Any) -> Any:
        return lambda: probe_destination(dest_id, dest, events_dir)

    works = {dest_id: work(dest_id, dest) for dest_id, dest in cfg.destinations.items()}
    results = run_all(works, timeout)
    for dest_id in cfg.destinations:
        ok, text = results[dest_id]
        label = "[green]ok[/]" if ok else "[bold red]error[/]"
        out.print(f"  {escape(dest_id)}: {label}: {escape(text)}", highlight=False)
    return all(ok for ok, _ in results.values())
