"""The `eventspark` command: serve, process, check, and the operator commands (`eventspark.commands`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from eventspark.commands import replay, status, tools, tracking_script
from eventspark.commands.common import ConfigOption, err, load_logged, out
from eventspark.logconfig import add_log_file

app = typer.Typer(help="eventspark: self-hosted event collection on Apache Spark.", no_args_is_help=True)


@app.command()
def check(
    config: ConfigOption = None,
    connect: Annotated[
        bool, typer.Option("--connect", help="Also test every destination: probe table, object or request.")
    ] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=1, max=600, help="Seconds for the tests.")] = 30,
) -> None:
    """Validates a config file and prints what it configures.

    Exits 2 when the config cannot be used, 1 when it can but some keys have no effect (unknown,
    misspelt, or useless where they are) or, with --connect, a destination's test fails, 0 otherwise."""
    loaded = load_logged(config)
    cfg = loaded.config
    out.print(f"config OK: {len(cfg.api_keys)} token(s), {len(cfg.destinations)} destination(s)")
    for dest_id, dest in cfg.destinations.items():
        template = dest.data_layout.table_name_template
        out.print(escape(f"  {dest_id}: {dest.type}, {dest.mode} mode, table {template!r}"), highlight=False)
    out.print(escape(f"  spark master: {cfg.spark.master}"), highlight=False)
    out.print(f"  compiled speed-ups: {_speedups_state()}", highlight=False)
    if connect:
        out.print("destination tests:")
        if not tools.check_connections(cfg, timeout):
            err.print("[bold red]a destination test failed[/] (see above)")
            raise typer.Exit(code=1)
    if loaded.warnings:
        err.print(f"[yellow]{len(loaded.warnings)} key(s) in the config have no effect[/] (see the warnings above)")
        raise typer.Exit(code=1)


def _speedups_state() -> str:
    from eventspark import speedups

    missing = speedups.missing()
    if not missing:
        return "in use (" + ", ".join(speedups.MODULES) + ")"
    if speedups.pure():
        return f"turned off ({speedups.PURE_ENV})"
    return (
        "not built or out of date: "
        + ", ".join(missing)
        + " (pure Python; `make install` with a C compiler builds them)"
    )


@app.command()
def serve(
    config: ConfigOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Runs the collector, the batch uploader and the stream workers."""
    loaded = load_logged(config, verbose)
    settings = loaded.config.server.log
    if settings.path:  # EventNative's server.log.path: serve's lines in a rotated file too
        add_log_file(settings.path, settings.format, settings.rotation_min, settings.max_backups)
    if loaded.generated_token is not None:
        out.print(f"no token configured; generated one: [bold]{loaded.generated_token.client_secret}[/]")
    from eventspark.collector.server import run_server
    from eventspark.node import NodeServices

    run_server(loaded, NodeServices(loaded))


@app.command()
def process(
    config: ConfigOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Rotates the incoming logs now, runs one batch pass and prints a summary; non-zero on failure."""
    loaded = load_logged(config, verbose)
    from eventspark.batch.process import process_once
    from eventspark.ops.replay import node_serves

    if node_serves(Path(loaded.config.log.path)):  # the live logs belong to `serve`: ask it
        ok = replay.process_through_node(loaded, console=out)
    else:
        ok = process_once(loaded, console=out)
    raise typer.Exit(code=0 if ok else 1)


@app.command()
def version() -> None:
    """Prints the eventspark version."""
    from eventspark import __version__

    out.print(__version__)


for _module in (replay, tools, status, tracking_script):
    _module.register(app)

if __name__ == "__main__":
    app()
