"""The handle `Coordination.lock` yields: a holder whose lease lapsed finds out before its next step."""

from __future__ import annotations

import time

import etcd3gw
import pytest
import redis

from eventspark.coordination import LockHandle, LockLost
from eventspark.coordination.base import CoordinationUnavailable
from eventspark.coordination.leases import LeaseRenewer
from tests.coordination.conftest import REDIS_HOST, REDIS_PORT, Backend


def test_a_held_lock_is_not_lost(backend: Backend) -> None:
    node = backend.node("node-a")
    with node.lock("dest_events", timeout=1) as handle:
        assert isinstance(handle, LockHandle) and handle.name == "dest_events"
        time.sleep(backend.lease_seconds * 0.5)
        assert not handle.lost
        handle.check("the commit")  # does not raise


def _take_over(backend: Backend, name: str) -> None:
    """What a lapsed lease comes to: the lock key gone and another holder's in its place (Redis),
    the lock's lease revoked as if it expired (etcd)."""
    if backend.kind == "redis":
        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT)
        try:
            client.set(f"{backend.key_prefix}lock:{name}", "node-b/othertoken")
        finally:
            client.close()
        return
    host_port = backend.config["endpoint"].removeprefix("http://")
    host, port = host_port.split(":")
    client = etcd3gw.Etcd3Client(host=host, port=int(port), timeout=5)
    try:
        ((value, _meta),) = client.get(f"{backend.key_prefix}lock/{name}".encode(), metadata=True)
        lease_id = int(value.decode().rpartition("/")[2], 16)
        etcd3gw.Lease(lease_id, client=client).revoke()
    finally:
        client.session.close()


def test_a_lease_taken_over_while_held_shows_on_the_handle(shared_backend: Backend) -> None:
    node = shared_backend.node("node-a")
    with node.lock("batch-pass", timeout=1) as handle:
        assert not handle.lost
        _take_over(shared_backend, "batch-pass")
        # Found by the renewer's next tick or, asked later than a renewal interval, by a renewal now.
        time.sleep(shared_backend.lease_seconds / 3 + 0.1)
        assert handle.lost
        with pytest.raises(LockLost, match=r"stopped before the commit of pg\.t") as caught:
            handle.check("the commit of pg.t")
        assert caught.value.name == "batch-pass" and caught.value.step == "the commit of pg.t"


def test_a_held_lease_stays_confirmed_across_renewals(shared_backend: Backend) -> None:
    node = shared_backend.node("node-a")
    with node.lock("batch-pass", timeout=1) as handle:
        deadline = time.monotonic() + shared_backend.lease_seconds * 1.5
        while time.monotonic() < deadline:
            assert not handle.lost
            time.sleep(0.1)


def test_confirm_trusts_a_fresh_renewal_and_renews_a_stale_one_itself() -> None:
    # The renewer thread is not started: as in a process paused for longer than the lease, only
    # `confirm` can find out.
    answers = [True, False]
    calls: list[float] = []

    def renew() -> bool:
        calls.append(time.monotonic())
        return answers.pop(0)

    renewer = LeaseRenewer(renew, 0.05, "lock 'batch-pass'")
    assert renewer.confirm() and calls == []  # just taken: no request
    time.sleep(0.06)
    assert renewer.confirm() and len(calls) == 1  # stale: renewed now
    assert renewer.confirm() and len(calls) == 1  # fresh again
    time.sleep(0.06)
    assert not renewer.confirm() and renewer.lost and len(calls) == 2
    assert not renewer.confirm() and len(calls) == 2  # lost for good: no more requests


def test_confirm_cannot_vouch_for_a_stale_lease_while_the_store_is_unreachable() -> None:
    answers: list[bool | Exception] = [CoordinationUnavailable("down"), True]

    def renew() -> bool:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    renewer = LeaseRenewer(renew, 0.02, "lock 'batch-pass'")
    time.sleep(0.03)
    assert not renewer.confirm() and not renewer.lost  # the renewer may still get through
    assert renewer.confirm() and not renewer.lost


def test_the_thread_and_confirm_never_renew_at_once() -> None:
    inside: list[int] = []
    overlaps: list[int] = []

    def renew() -> bool:
        inside.append(1)
        if len(inside) > 1:
            overlaps.append(1)
        time.sleep(0.005)
        inside.pop()
        return True

    with LeaseRenewer(renew, 0.001, "lock 'batch-pass'") as renewer:
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            renewer._confirmed_at = 0.0  # always stale: every call renews
            assert renewer.confirm()
    assert overlaps == []
