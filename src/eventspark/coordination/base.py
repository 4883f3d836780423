"""The coordination contract shared by collector nodes, stream workers and the Spark driver.

Several nodes may write to the same destination. Before changing a table's schema a node takes the
lock `<destination_id>_<table>`; after a patch it bumps the table's version so that other nodes know
their cached schema is stale. Each node also records a heartbeat so that the cluster can be listed.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

DEFAULT_LEASE_SECONDS = 15.0
"""How long a lock survives its holder's death; renewed every third of it while held."""

DEFAULT_HEARTBEAT_TTL = 30.0
"""How long a node stays listed after its last heartbeat (serve beats every third of it)."""


class CoordinationError(Exception):
    """Base of every coordination error."""


class CoordinationUnavailable(CoordinationError):
    """The coordination store cannot be reached (connection refused, timeout, authentication...).

    Transient: the caller keeps its data and retries later.
    """


class LockTimeout(CoordinationError):
    """A lock could not be taken within the allowed time; the caller retries the pair later."""

    def __init__(self, name: str, holder: str | None, waited: float) -> None:
        self.name = name
        self.holder = holder
        self.waited = waited
        held_by = f"held by {holder}" if holder else "holder unknown"
        super().__init__(
            f"could not take lock {name!r} within {waited:.1f} s ({held_by}); the pair will be retried later"
        )


class LockLost(CoordinationError):
    """A lock was found no longer held by this holder (its lease expired, or another node took it);
    the holder stopped before `step`, leaving the rest for whoever holds the lock next."""

    def __init__(self, name: str, step: str, message: str | None = None) -> None:
        self.name = name
        self.step = step
        super().__init__(
            message or f"lock {name!r} was lost while held (lease expired or taken over): stopped before {step}"
        )


class LockHandle:
    """What `Coordination.lock` yields: whether the lock is still this holder's.

    A lease can lapse while its holder goes on (a long GC pause, a partition): work that changes
    shared state asks `check(step)` first. `confirm` answers True while the lease is this holder's
    (None: a lock that cannot be lost, the in-process one).
    """

    def __init__(self, name: str, confirm: Callable[[], bool] | None = None) -> None:
        self.name = name
        self._confirm = confirm

    @property
    def lost(self) -> bool:
        return self._confirm is not None and not self._confirm()

    def check(self, step: str) -> None:
        """Raises `LockLost` naming `step` when the lock is no longer held."""
        if self.lost:
            raise LockLost(self.name, step)


@runtime_checkable
class Coordination(Protocol):
    """Locks, table versions and node liveness, in-process or in a shared store.

    Implementations are thread-safe. Locks are not re-entrant: taking a lock twice from the same
    node waits for the first holder like any other contender.
    """

    def lock(self, name: str, timeout: float = 30.0) -> AbstractContextManager[LockHandle]:
        """Hold the lock `name` (`<destination_id>_<table>`) for the duration of a `with` block.

        While held, its lease is renewed in the background; if the holder dies the lease expires
        and another node can take it. Waits up to `timeout` seconds, then raises `LockTimeout`.
        Yields a `LockHandle`: a holder whose lease lapsed finds out through it (`check`).
        """
        ...

    def table_version(self, name: str) -> int:
        """The number of patches recorded for table `name`; 0 when it was never patched."""
        ...

    def bump_table_version(self, name: str) -> int:
        """Record a patch of table `name` (call it under the table's lock); returns the new version."""
        ...

    def heartbeat(self) -> None:
        """Record this node as alive for the heartbeat TTL."""
        ...

    def instances(self) -> list[str]:
        """Names of the nodes whose last heartbeat is younger than the TTL, sorted."""
        ...

    def close(self) -> None:
        """Release connections and unlist this node; never raises for an unreachable store."""
        ...


def holder_value(node_name: str, token: str) -> str:
    """The value stored in a lock: who holds it, plus a random token proving it is this holder."""
    return f"{node_name}/{token}"


def holder_of(value: str | None) -> str | None:
    """The node name of a stored lock value (node names may contain '/', tokens do not)."""
    if not value:
        return None
    return value.rpartition("/")[0] or value
