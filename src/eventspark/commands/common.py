"""What the CLI's commands share: consoles, the config option, loading a config, logging."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from eventspark.config import ConfigError, LoadedConfig, load_config
from eventspark.config.models import ServerLogConfig
from eventspark.destinations.base import DestinationError
from eventspark.logconfig import configure

err = Console(stderr=True, soft_wrap=True)  # messages stay whole lines, for grep and logs
out = Console(soft_wrap=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML or JSON config; without it, the embedded defaults."),
]


def load(path: Path | None) -> LoadedConfig:
    try:
        loaded = load_config(path)
    except ConfigError as exc:
        err.print(f"[bold red]config error[/]: {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=2) from None
    for warning in loaded.warnings:
        err.print(f"[yellow]warning[/]: {escape(warning)}", highlight=False)
    require_drivers(loaded)
    return loaded


def require_drivers(loaded: LoadedConfig) -> None:
    """Exits 2 naming the pip extra when the driver of a destination or of the coordination
    backend is not installed."""
    from eventspark.destinations.registry import destination_type

    problems = []
    for dest_id, dest in loaded.config.destinations.items():
        try:
            destination_type(dest.type).require_driver()
        except DestinationError as exc:
            problems.append(f"destinations.{dest_id}: {exc}")
    if loaded.config.log.remote is not None:  # fsspec and s3fs/gcsfs are optional (remote-* extras)
        from eventspark.logs.remote import RemoteUnavailable, require_remote

        try:
            require_remote(loaded.config.log.remote)
        except RemoteUnavailable as exc:
            problems.append(str(exc))
    from eventspark.coordination import CoordinationError, build_coordination

    try:  # imports the backend's driver; connects only on first use
        build_coordination(loaded.config.coordination, loaded.config.server.name).close()
    except CoordinationError as exc:
        problems.append(str(exc))
    for problem in problems:
        err.print(f"[bold red]config error[/]: {escape(problem)}", highlight=False)
    if problems:
        raise typer.Exit(code=2)


def setup_logging(verbose: bool, settings: ServerLogConfig | None = None) -> None:
    """The process's log: `server.log` of the config (text or JSON lines, level); DEBUG with -v."""
    settings = settings or ServerLogConfig()
    configure(settings.format, settings.level, verbose)


def load_logged(path: Path | None, verbose: bool = False) -> LoadedConfig:
    """`load` with the process's log set up: first the defaults (for the config's own errors),
    then the config's `server.log`. Every command that reads a config starts with this."""
    setup_logging(verbose)
    loaded = load(path)
    setup_logging(verbose, loaded.config.server.log)
    return loaded
