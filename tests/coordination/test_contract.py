"""The contract every backend keeps: memory, Redis and etcd (see conftest.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from eventspark.coordination import Coordination, LockTimeout
from tests.coordination.conftest import Backend


def _contend(nodes: list[Coordination], lock: str, rounds: int) -> tuple[int, int]:
    """Threads (two per node) increment a shared counter under the lock; returns (counter, max inside)."""
    state = {"counter": 0, "inside": 0, "max_inside": 0}
    errors: list[BaseException] = []

    def work(node: Coordination) -> None:
        try:
            for _ in range(rounds):
                with node.lock(lock, timeout=20):
                    state["inside"] += 1
                    state["max_inside"] = max(state["max_inside"], state["inside"])
                    value = state["counter"]
                    time.sleep(0.002)  # an unprotected read-modify-write would lose updates here
                    state["counter"] = value + 1
                    state["inside"] -= 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(node,)) for node in nodes for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return state["counter"], state["max_inside"]


def test_lock_excludes_threads_of_one_node(backend: Backend) -> None:
    node = backend.node("node-a")
    counter, max_inside = _contend([node], "dest_events", rounds=8)
    assert (counter, max_inside) == (16, 1)


def test_lock_excludes_threads_of_two_nodes(shared_backend: Backend) -> None:
    nodes = [shared_backend.node("node-a"), shared_backend.node("node-b")]
    counter, max_inside = _contend(nodes, "dest_events", rounds=5)
    assert (counter, max_inside) == (20, 1)


def test_different_locks_do_not_block_each_other(backend: Backend) -> None:
    node = backend.node("node-a")
    with node.lock("dest_events", timeout=1), node.lock("dest_users", timeout=1):
        pass


def test_busy_lock_times_out_naming_the_holder(backend: Backend) -> None:
    holder = backend.node("node-a")
    contender = backend.peer(holder)
    with holder.lock("dest_events"):
        started = time.monotonic()
        with pytest.raises(LockTimeout) as caught, contender.lock("dest_events", timeout=0.3):
            pytest.fail("the lock was taken twice")
        waited = time.monotonic() - started
    error = caught.value
    assert error.name == "dest_events"
    assert error.holder is not None and error.holder.startswith("node-a")
    assert 0.3 <= error.waited <= waited
    assert "dest_events" in str(error) and "node-a" in str(error) and "retried later" in str(error)


def test_lock_is_free_again_after_release_and_after_an_error(backend: Backend) -> None:
    node_a = backend.node("node-a")
    node_b = backend.peer(node_a)
    with node_a.lock("dest_events"):
        pass
    with pytest.raises(RuntimeError), node_a.lock("dest_events"):
        raise RuntimeError("patch failed")
    started = time.monotonic()
    with node_b.lock("dest_events", timeout=5):
        assert time.monotonic() - started < 1.0


def test_lock_lease_is_renewed_while_held(shared_backend: Backend) -> None:
    holder, contender = shared_backend.node("node-a"), shared_backend.node("node-b")
    lease = shared_backend.lease_seconds
    with holder.lock("dest_events"):
        time.sleep(lease * 1.25)
        # Without renewal the lease would have expired by now and the contender would get it.
        with pytest.raises(LockTimeout), contender.lock("dest_events", timeout=lease * 0.5):
            pytest.fail(f"the lock expired after its {lease} s lease although its holder was alive")


def test_table_versions_start_at_zero_and_increase(backend: Backend) -> None:
    node = backend.node("node-a")
    assert node.table_version("dest_events") == 0
    assert [node.bump_table_version("dest_events") for _ in range(3)] == [1, 2, 3]
    assert node.table_version("dest_events") == 3
    assert node.table_version("dest_users") == 0


def test_table_versions_are_shared_between_nodes(shared_backend: Backend) -> None:
    node_a, node_b = shared_backend.node("node-a"), shared_backend.node("node-b")
    node_a.bump_table_version("dest_events")
    assert node_b.bump_table_version("dest_events") == 2
    assert node_a.table_version("dest_events") == 2


def test_concurrent_bumps_never_repeat_a_version(backend: Backend) -> None:
    node_a = backend.node("node-a")
    nodes = [node_a, backend.peer(node_a)]
    seen: list[int] = []

    def bump(node: Coordination) -> None:
        for _ in range(5):
            seen.append(node.bump_table_version("dest_events"))

    threads = [threading.Thread(target=bump, args=(nodes[i % 2],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(seen) == list(range(1, 21))


def test_names_from_the_internet_are_kept_apart(backend: Backend) -> None:
    node = backend.node("node-ü*")
    odd = "dest_таблица*?[x]/../events"
    with node.lock(odd, timeout=1):
        assert node.bump_table_version(odd) == 1
    assert node.table_version("dest_таблица*?[x]") == 0
    node.heartbeat()
    assert node.instances() == ["node-ü*"]


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_instances_lists_live_nodes_until_their_heartbeat_expires(shared_backend: Backend) -> None:
    node_a, node_b = shared_backend.node("node-a"), shared_backend.node("node-b")
    assert node_a.instances() == []
    node_a.heartbeat()
    node_b.heartbeat()
    assert node_a.instances() == ["node-a", "node-b"]
    ttl = shared_backend.heartbeat_ttl
    # node-a keeps beating, node-b stops (as if it died): after the TTL only node-a is listed.
    started = time.monotonic()
    while time.monotonic() - started < ttl * 0.5:
        node_a.heartbeat()
        time.sleep(ttl / 4)
    assert node_b.instances() == ["node-a", "node-b"]

    def only_a_listed() -> bool:
        node_a.heartbeat()
        return node_b.instances() == ["node-a"]

    gone = _wait_for(only_a_listed, ttl * 2 + 1)
    assert gone, f"node-b still listed {time.monotonic() - started:.1f} s after its last heartbeat"


def test_closed_node_is_unlisted_at_once(backend: Backend) -> None:
    node_a = backend.node("node-a")
    node_b = backend.peer(node_a)
    node_a.heartbeat()
    assert "node-a" in node_b.instances()
    node_a.close()
    assert "node-a" not in node_b.instances()


def test_memory_lists_itself_until_its_heartbeat_expires() -> None:
    from eventspark.coordination import MemoryCoordination

    node = MemoryCoordination("solo", heartbeat_ttl=0.2)
    assert node.instances() == []
    node.heartbeat()
    assert node.instances() == ["solo"]
    assert _wait_for(lambda: node.instances() == [], 2)
