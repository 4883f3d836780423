"""Setting up a destination: `eventspark dry-run` (and `check --connect` in eventspark.cli)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Adds this module's commands to the `eventspark` command."""
