"""Finding the rotated incoming logs that the batch job reads, and the token of each."""

from __future__ import annotations

from pathlib import Path

from eventspark.logs.incoming import parse_log_name
from eventspark.logs.replay import replay_destination


def rotated_token(name: str) -> str | None:
    """The token id in a rotated log's file name; None when `name` is not a rotated log."""
    parsed = parse_log_name(name)
    if parsed is None or parsed.rotated_at is None:
        return None
    return parsed.token_id


def rotated_logs(incoming_dir: Path) -> list[Path]:
    """Rotated logs and replay logs (`logs.replay`) waiting in `incoming_dir`, by name (live logs
    and status files excluded)."""
    if not incoming_dir.is_dir():
        return []
    return sorted(
        p
        for p in incoming_dir.iterdir()
        if p.is_file() and (rotated_token(p.name) is not None or replay_destination(p.name) is not None)
    )
