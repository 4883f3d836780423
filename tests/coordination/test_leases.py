from __future__ import annotations

import logging
import threading
import time

import pytest

from eventspark.coordination.base import CoordinationUnavailable, LockTimeout, holder_of, holder_value
from eventspark.coordination.leases import LeaseRenewer, wait_for_lock


def test_wait_for_lock_retries_until_acquired() -> None:
    answers = iter([(False, "node-a"), (False, "node-a"), (True, None)])
    calls: list[int] = []

    def attempt() -> tuple[bool, str | None]:
        calls.append(1)
        return next(answers)

    wait_for_lock("dest_events", 5, attempt)
    assert len(calls) == 3


def test_wait_for_lock_times_out_with_the_last_holder_seen() -> None:
    holders = iter(["node-a", "node-b", "node-c", "node-d", "node-e", "node-f", "node-g", "node-h"])
    started = time.monotonic()
    with pytest.raises(LockTimeout) as caught:
        wait_for_lock("dest_events", 0.1, lambda: (False, next(holders)))
    elapsed = time.monotonic() - started
    assert 0.1 <= caught.value.waited <= elapsed < 1.0
    assert caught.value.holder is not None and caught.value.holder != "node-a"


def test_zero_timeout_tries_once() -> None:
    calls: list[int] = []

    def attempt() -> tuple[bool, str | None]:
        calls.append(1)
        return False, None

    with pytest.raises(LockTimeout, match="holder unknown"):
        wait_for_lock("dest_events", 0, attempt)
    assert calls == [1]


def test_renewer_renews_until_stopped() -> None:
    renewed = threading.Event()
    count: list[int] = []

    def renew() -> bool:
        count.append(1)
        if len(count) == 3:
            renewed.set()
        return True

    renewer = LeaseRenewer(renew, 0.01, "test lease")
    renewer.start()
    assert renewed.wait(5)
    renewer.stop()
    stopped_at = len(count)
    time.sleep(0.05)
    assert len(count) == stopped_at and not renewer.lost


def test_renewer_keeps_trying_through_outages_and_reports_a_lost_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers = iter([CoordinationUnavailable("down"), True, False])
    done = threading.Event()

    def renew() -> bool:
        answer = next(answers)
        if answer is False:
            done.set()
        if isinstance(answer, Exception):
            raise answer
        return answer

    renewer = LeaseRenewer(renew, 0.01, "lock 'dest_events'")
    with caplog.at_level(logging.WARNING, logger="eventspark.coordination.leases"):
        renewer.start()
        assert done.wait(5)
        renewer.stop()
    assert renewer.lost
    messages = [record.getMessage() for record in caplog.records]
    assert any("could not renew" in message and "down" in message for message in messages)
    assert any("expired while held" in message and "dest_events" in message for message in messages)


def test_stopping_a_renewer_that_never_started_is_harmless() -> None:
    LeaseRenewer(lambda: True, 1, "unused").stop()


@pytest.mark.parametrize("node", ["node-a", "node/with/slashes", "ü"])
def test_holder_value_round_trips_the_node_name(node: str) -> None:
    assert holder_of(holder_value(node, "0123abcd")) == node


def test_holder_of_nothing_is_unknown() -> None:
    assert holder_of(None) is None
    assert holder_of("") is None
