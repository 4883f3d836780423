"""Failed events and replay: `eventspark failed`, `eventspark replay`."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Adds this module's commands to the `eventspark` command."""
