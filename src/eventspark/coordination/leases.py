"""Machinery shared by the networked backends: waiting for a lock, renewing its lease, releasing it."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from eventspark.coordination.base import CoordinationError, LockTimeout

logger = logging.getLogger(__name__)

FIRST_POLL_DELAY = 0.01
MAX_POLL_DELAY = 0.25
"""Waiters poll at most 4 times a second: locks guard DDL, which takes far longer than that."""


def wait_for_lock(name: str, timeout: float, attempt: Callable[[], tuple[bool, str | None]]) -> None:
    """Call `attempt` (returning acquired, current holder) with growing pauses until it succeeds.

    Raises `LockTimeout` once `timeout` seconds have passed without success.
    """
    started = time.monotonic()
    deadline = started + max(timeout, 0.0)
    delay = FIRST_POLL_DELAY
    while True:
        acquired, holder = attempt()
        if acquired:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LockTimeout(name, holder, time.monotonic() - started)
        # Jitter keeps contenders that started together from polling in lockstep.
        time.sleep(min(remaining, delay * random.uniform(0.5, 1.5)))
        delay = min(delay * 2, MAX_POLL_DELAY)


@contextmanager
def releasing(what: str) -> Iterator[None]:
    """Around the release of `what` (a lock, a lease): a `CoordinationError` is logged, not raised.

    The lease expires on its own; failing the caller's finished work would be worse.
    """
    try:
        yield
    except CoordinationError as exc:
        logger.warning("could not release %s, it will expire: %s", what, exc)


class LeaseRenewer:
    """Calls `renew` every `interval` seconds in a daemon thread until `stop()` (or, used as a
    context manager, from entering the `with` block until leaving it).

    `renew` returns False when the lease is gone (expired, or taken over): renewal then stops and
    `lost` becomes True. A `CoordinationError` from `renew` is logged and retried at the next tick,
    since the lease may still be alive for a while. `confirm()` tells the holder whether the lease
    is still its own (`LockHandle`). Build it right after the lease was granted or the lock taken:
    that moment counts as the first confirmation.
    """

    def __init__(self, renew: Callable[[], bool], interval: float, description: str) -> None:
        self._renew = renew
        self._interval = interval
        self._description = description
        self._stopped = threading.Event()
        self._renewing = threading.Lock()  # the thread and `confirm` never renew at once
        self._confirmed_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"lease-{description}", daemon=True)
        self.lost = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> LeaseRenewer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def confirm(self) -> bool:
        """True while the lease is this holder's.

        A renewal younger than one interval is trusted (the lease had two thirds of its time left
        then), so a caller faster than the renewer costs nothing. An older one is not: a process
        paused longer than the lease (GC, swap, a stopped VM) resumes with its renewer, and the
        caller may run before the renewer's next tick. The lease is then renewed now; a store that
        cannot be reached cannot confirm it (False, not `lost`: the renewer keeps trying)."""
        if self.lost:
            return False
        if time.monotonic() - self._confirmed_at < self._interval:
            return True
        try:
            return self._renew_now()
        except CoordinationError as exc:
            logger.warning("could not confirm the lease of %s: %s", self._description, exc)
            return False

    def _renew_now(self) -> bool:
        """One renewal; False (and `lost`) when the lease is gone. Raises `CoordinationError`."""
        with self._renewing:
            if self.lost:
                return False
            started = time.monotonic()  # the renewed lease runs from before the request at the latest
            if self._renew():
                self._confirmed_at = started
                return True
            self.lost = True
        logger.error("the lease of %s expired while held: another node may have taken it", self._description)
        return False

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                alive = self._renew_now()
            except CoordinationError as exc:
                logger.warning("could not renew the lease of %s, retrying: %s", self._description, exc)
                continue
            if not alive:
                return
