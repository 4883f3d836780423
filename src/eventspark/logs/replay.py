"""Replay logs: `incoming/replay.dst=<destination id>-YYYY-MM-DDTHH-MM-SS.mmm-<tag>.log`.

A replay (`eventspark.ops.replay`) writes the events it replays into a batch destination as one
of these, beside the rotated incoming logs. The batch job loads it like a rotated log (status
file, load markers, archive) but into the destination its name gives, whatever the token of its
events: a replay never reaches the token's other destinations.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from urllib.parse import quote, unquote

PREFIX = "replay.dst="
_STAMP = "%Y-%m-%dT%H-%M-%S"
_NAME = re.compile(
    r"^replay\.dst=(?P<dst>[^/\\\x00]+)-(?P<stamp>\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d)\.(?P<ms>\d{3})-(?P<tag>[0-9a-f]{8})\.log$"
)


def replay_log_name(dest_id: str, at: datetime | None = None, tag: str | None = None) -> str:
    """A new replay log name for `dest_id` (UTC stamp; a random tag keeps two replays apart)."""
    at = (at or datetime.now(UTC)).astimezone(UTC)
    tag = tag or uuid.uuid4().hex[:8]
    # Destination ids come from the config; percent-encoding keeps `/` and friends out of the name.
    return f"{PREFIX}{quote(dest_id, safe='')}-{at.strftime(_STAMP)}.{at.microsecond // 1000:03d}-{tag}.log"


def replay_destination(name: str) -> str | None:
    """The destination a replay log loads into; None when `name` is not a replay log."""
    match = _NAME.match(name)
    return None if match is None else unquote(match.group("dst"))
