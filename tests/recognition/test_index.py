"""The recognition index: in memory (TTL, bound) and in a real Redis (shared by two clients)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from eventspark.config.models import RedisConfig
from eventspark.recognition.index import MemoryIndex, RecognitionIndex
from eventspark.recognition.redis import RedisIndex

REDIS = RedisConfig(host="127.0.0.1", port=6379)


def exercise(index: RecognitionIndex) -> None:
    index.add_tables({"a1": ["pageview", "click"], "a2": ["pageview"]})
    index.add_tables({"a1": ["pageview", "signup"]})
    assert index.tables(["a1", "a2", "a3"]) == {"a1": {"pageview", "click", "signup"}, "a2": {"pageview"}}
    index.drop_tables("pageview", ["a1"])
    assert index.tables(["a1"]) == {"a1": {"click", "signup"}}
    index.set_identities({"a1": ("u1", None)})
    assert index.identities(["a1", "a2"]) == {"a1": ("u1", None)}
    index.add_pending(["a1", "a2"])
    index.drop_pending(["a2"])
    assert index.pending() == {"a1"}


def test_memory_index() -> None:
    exercise(MemoryIndex(3600, 100))


def test_memory_index_forgets_after_its_ttl_and_past_its_bound() -> None:
    index = MemoryIndex(0.05, 100)
    index.add_tables({"a": ["t"]})
    index.set_identities({"a": ("u",)})
    time.sleep(0.1)
    assert index.tables(["a"]) == {} and index.identities(["a"]) == {}
    small = MemoryIndex(3600, 2)
    small.add_tables({"a": ["t"], "b": ["t"], "c": ["t"]})
    assert set(small.tables(["a", "b", "c"])) == {"b", "c"}  # the oldest went first


@pytest.fixture
def redis_indexes() -> Iterator[tuple[RedisIndex, RedisIndex]]:
    try:
        redis.Redis(host=REDIS.host, port=REDIS.port).ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"Redis at {REDIS.host}:{REDIS.port} is needed (scripts/test-services.sh): {exc}")
    prefix = f"eventspark-test:{uuid.uuid4().hex}:"
    first, second = RedisIndex(REDIS, "pg", 3600, prefix), RedisIndex(REDIS, "pg", 3600, prefix)
    yield first, second
    first.delete_all()
    first.close()
    second.close()


def test_redis_index(redis_indexes: tuple[RedisIndex, RedisIndex]) -> None:
    exercise(redis_indexes[0])


def test_redis_index_is_shared_and_expires(redis_indexes: tuple[RedisIndex, RedisIndex]) -> None:
    first, second = redis_indexes  # as two processes (two nodes) would hold them
    first.add_tables({"a": ["t"]})
    first.set_identities({"a": ("u", "e@x")})
    assert second.tables(["a"]) == {"a": {"t"}} and second.identities(["a"]) == {"a": ("u", "e@x")}
    client = redis.Redis(host=REDIS.host, port=REDIS.port)
    ttl = client.ttl(f"{first.base}t:a")
    assert 0 < ttl <= 3600
    assert all(key.decode().startswith(first.base) for key in client.scan_iter(match=f"{first.base}*"))
