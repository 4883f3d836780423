"""The `eventspark` command: serve, process, check."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from eventspark.config import ConfigError, LoadedConfig, load_config
from eventspark.destinations.base import DestinationError

app = typer.Typer(help="eventspark: self-hosted event collection on Apache Spark.", no_args_is_help=True)
err = Console(stderr=True, soft_wrap=True)  # messages stay whole lines, for grep and logs
out = Console(soft_wrap=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML or JSON config; without it, the embedded defaults."),
]


def _load(path: Path | None) -> LoadedConfig:
    try:
        loaded = load_config(path)
    except ConfigError as exc:
        err.print(f"[bold red]config error[/]: {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=2) from None
    for warning in loaded.warnings:
        err.print(f"[yellow]warning[/]: {escape(warning)}", highlight=False)
    _require_drivers(loaded)
    return loaded


def _require_drivers(loaded: LoadedConfig) -> None:
    """Exits 2 naming the pip extra when the driver of a destination or of the coordination
    backend is not installed."""
    from eventspark.destinations.registry import destination_type

    problems = []
    for dest_id, dest in loaded.config.destinations.items():
        try:
            destination_type(dest.type).require_driver()
        except DestinationError as exc:
            problems.append(f"destinations.{dest_id}: {exc}")
    from eventspark.coordination import CoordinationError, build_coordination

    try:  # imports the backend's driver; connects only on first use
        build_coordination(loaded.config.coordination, loaded.config.server.name).close()
    except CoordinationError as exc:
        problems.append(str(exc))
    for problem in problems:
        err.print(f"[bold red]config error[/]: {escape(problem)}", highlight=False)
    if problems:
        raise typer.Exit(code=2)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@app.command()
def check(config: ConfigOption = None) -> None:
    """Validates a config file and prints what it configures.

    Exits 2 when the config cannot be used, 1 when it can but some keys have no effect (unknown,
    misspelt, or useless where they are), 0 otherwise."""
    loaded = _load(config)
    cfg = loaded.config
    out.print(f"config OK: {len(cfg.api_keys)} token(s), {len(cfg.destinations)} destination(s)")
    for dest_id, dest in cfg.destinations.items():
        template = dest.data_layout.table_name_template
        out.print(escape(f"  {dest_id}: {dest.type}, {dest.mode} mode, table {template!r}"), highlight=False)
    out.print(escape(f"  spark master: {cfg.spark.master}"), highlight=False)
    if loaded.warnings:
        err.print(f"[yellow]{len(loaded.warnings)} key(s) in the config have no effect[/] (see the warnings above)")
        raise typer.Exit(code=1)


@app.command()
def serve(
    config: ConfigOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Runs the collector, the batch uploader and the stream workers."""
    _setup_logging(verbose)
    loaded = _load(config)
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
    _setup_logging(verbose)
    loaded = _load(config)
    from eventspark.batch.process import process_once

    ok = process_once(loaded, console=out)
    raise typer.Exit(code=0 if ok else 1)


@app.command()
def version() -> None:
    """Prints the eventspark version."""
    from eventspark import __version__

    out.print(__version__)


if __name__ == "__main__":
    app()
