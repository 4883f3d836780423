"""`ops.probe`'s bounds, in this process with real threads: the deadline, and the number of
destination tests running at once."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from eventspark.ops import probe


def test_run_bounded_answers_or_times_out() -> None:
    assert probe.run_bounded(lambda: "fine", 5) == "fine"
    with pytest.raises(ValueError, match="broken"):
        probe.run_bounded(lambda: (_ for _ in ()).throw(ValueError("broken")), 5)
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(probe.ProbeTimeout, match=r"no answer within 0\.3 s"):
        probe.run_bounded(lambda: release.wait(30), 0.3)
    assert time.monotonic() - started < 2
    release.set()


def test_at_most_four_tests_at_once() -> None:
    release = threading.Event()
    try:
        for _ in range(probe.MAX_CONCURRENT):
            with pytest.raises(probe.ProbeTimeout):
                probe.run_bounded(lambda: release.wait(30), 0.01)
        with pytest.raises(probe.Busy):
            probe.run_bounded(lambda: "never runs", 1)
    finally:
        release.set()
    deadline = time.monotonic() + 10
    while True:  # the slots come back as the waiting threads end
        try:
            assert probe.run_bounded(lambda: "again", 1) == "again"
            break
        except probe.Busy:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_run_bounded_async_does_not_block_the_loop() -> None:
    async def main() -> tuple[str, int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        result = await probe.run_bounded_async(lambda: time.sleep(0.3) or "slept", 5)
        ticker.cancel()
        return result, ticks

    result, ticks = asyncio.run(main())
    assert result == "slept" and ticks >= 10


def test_run_all_reports_each() -> None:
    release = threading.Event()
    results = probe.run_all(
        {
            "fast": lambda: "ok",
            "broken": lambda: (_ for _ in ()).throw(OSError("gone")),
            "hung": lambda: str(release.wait(30)),
        },
        0.5,
    )
    release.set()
    assert results["fast"] == (True, "ok")
    assert results["broken"][0] is False and "gone" in results["broken"][1]
    assert results["hung"][0] is False and "no answer within 0.5 s" in results["hung"][1]
