"""The retry policy of a destination: exponential back-off with a cap and a maximum age.

One policy for batch and stream (`retry:` globally, `destinations.<id>.retry` per destination;
docs/reliability.md). A transient error (the warehouse down, a connection cut, a 5xx) is retried
after `base_sec`, then twice as long after each failed attempt, never more than `max_sec` apart.
Once the first failure is older than `max_age_hours`, the events go to `events/failed` with the
last error, once; a replay brings them back.

Batch: the attempts of each (rotated log, destination, table) live in the log's status file
(`logs.status.PairStatus`), so the policy holds across passes and restarts. Stream: one clock per
destination, from the first failed attempt after its last progress, in the queue's `retry.json`
(`stream.queue.RetryState`), so it holds across restarts too; past the maximum age the rows held
give up, and later ones get a few attempts each until a delivery succeeds (`stream.worker`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DAY_HOURS = 24.0
DEFAULT_MAX_AGE_HOURS = 3 * DAY_HOURS
"""A long weekend of outage is retried; past it, the events wait in `failed/` for a replay."""
BATCH_BASE_SEC = 60.0
BATCH_MAX_SEC = 3600.0
EARLY_FRACTION = 0.1
"""A batch retry is due this fraction of its back-off early (`due`)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    base_sec: float
    max_sec: float
    max_age_sec: float

    def delay(self, attempts: int) -> float:
        """The wait after the `attempts`-th failed attempt (1: `base_sec`)."""
        if attempts <= 1:
            return min(self.base_sec, self.max_sec)
        # 2 ** 60 already exceeds any cap; bounding the exponent keeps the float finite.
        return min(self.base_sec * 2.0 ** min(attempts - 1, 60), self.max_sec)

    def next_attempt(self, attempts: int, last_attempt: float) -> float:
        """When the next attempt is due (epoch seconds) after `attempts` failures, the last at `last_attempt`."""
        return last_attempt + self.delay(attempts)

    def expired(self, first_failure: float, now: float) -> bool:
        """True once the events have failed for longer than the maximum age."""
        return now - first_failure >= self.max_age_sec

    def to_json(self) -> dict[str, float]:
        return {"base_sec": self.base_sec, "max_sec": self.max_sec, "max_age_hours": self.max_age_sec / 3600}


def retry_policy(config: Any, dest: Any) -> RetryPolicy:
    """The policy of destination `dest` (a `DestinationBase`) under `config`: its own `retry:`
    fields, else the global `retry:` section's, else its mode's defaults."""
    own = getattr(dest, "retry", None)
    shared = getattr(config, "retry", None)

    def pick(name: str, default: float) -> float:
        for section in (own, shared):
            value = getattr(section, name, None) if section is not None else None
            if value is not None:
                return float(value)
        return default

    if getattr(dest, "mode", "batch") == "stream":
        stream = getattr(config, "stream", None)
        base_default = float(getattr(stream, "retry_min_sec", 0.5))
        max_default = float(getattr(stream, "retry_max_sec", 60.0))
    else:
        base_default, max_default = BATCH_BASE_SEC, BATCH_MAX_SEC
    base = pick("base_sec", base_default)
    return RetryPolicy(
        base, max(base, pick("max_sec", max_default)), pick("max_age_hours", DEFAULT_MAX_AGE_HOURS) * 3600
    )


def due(last_attempt: float, next_attempt: float, now: float) -> bool:
    """Whether a batch pair's retry is due at `now`. Passes come every `uploader_period_sec` after
    the previous one ends, or from cron, with some jitter: a pass a few seconds before
    `next_attempt` retries (up to `EARLY_FRACTION` of the back-off early) rather than leaving the
    pair a whole period more (the default base equals the default period)."""
    return now >= next_attempt - EARLY_FRACTION * max(0.0, next_attempt - last_attempt)


def give_up_reason(attempts: int, first_failed: float, now: float, last_error: str) -> str:
    """The reason written with each event of a pair that gave up (`events/failed`)."""
    took = _duration(max(0.0, now - first_failed))
    return f"gave up after {attempts} attempt{'s' if attempts != 1 else ''} in {took}: {last_error}"


def _duration(seconds: float) -> str:
    """`42 s`, `17 min`, `72.0 h`: readable whatever the policy's maximum age."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
