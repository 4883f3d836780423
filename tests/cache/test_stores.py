"""The events cache's stores: memory, a SQLite file shared by processes, Redis (127.0.0.1:6379)."""

from __future__ import annotations

import multiprocessing
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventspark.config.models import RedisConfig
from eventspark.ops.cache import CachedEvent, CacheStore
from eventspark.ops.cache_redis import RedisStore
from eventspark.ops.cache_store import MemoryStore, SqliteStore

SIZE = 5
T0 = 1_700_000_000.0


def entry(dest: str, n: int, status: str = "pending", token: str = "tok", **extra: Any) -> CachedEvent:
    return CachedEvent(dest, f"e{n}", T0 + n, token, status, {"n": n}, **extra)


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CacheStore]:
    if request.param == "memory":
        yield MemoryStore(SIZE)
    elif request.param == "sqlite":
        sqlite = SqliteStore(tmp_path / "cache" / "events.sqlite", SIZE)
        yield sqlite
        sqlite.close()
    else:
        redis = RedisStore(RedisConfig(host="127.0.0.1", port=6379), SIZE, prefix=f"test:{uuid.uuid4().hex}:")
        yield redis
        keys = redis._client.keys(f"{redis.prefix}*")
        if keys:
            redis._client.delete(*keys)
        assert not redis._client.keys(f"{redis.prefix}*")
        redis.close()


def ids(found: list[CachedEvent]) -> list[str]:
    return [e.event_id for e in sorted(found, key=lambda e: e.timestamp, reverse=True)]


def test_keeps_the_newest_entries_up_to_the_size(store: CacheStore) -> None:
    store.add([entry("a", n) for n in range(8)])
    store.add([entry("b", 1)])
    total, found = store.query(["a"], None, None, set(), 100)
    assert total == SIZE
    assert ids(found) == ["e7", "e6", "e5", "e4", "e3"]
    total, found = store.query(["a", "b"], None, None, set(), 2)
    assert total == SIZE + 1
    assert sorted(ids(found)) == ["e1", "e6", "e7"]  # the limit is per destination


def test_a_pending_event_never_hides_a_result(store: CacheStore) -> None:
    store.set([entry("a", 1, "success", success={"table": "t", "record": []})])
    store.add([entry("a", 1)])  # the collector's record, arriving after the worker's
    _total, found = store.query(["a"], None, None, set(), 10)
    assert [(e.status, e.success) for e in found] == [("success", {"table": "t", "record": []})]


def test_a_result_replaces_the_entry_and_keeps_its_time(store: CacheStore) -> None:
    store.add([entry("a", 1), entry("a", 2)])
    late = entry("a", 1, "failed", error="column 'x': not a number")
    late.timestamp = T0 + 100
    store.set([late])
    _total, found = store.query(["a"], None, None, set(), 10)
    assert [(e.event_id, e.status, e.error, e.timestamp) for e in sorted(found, key=lambda e: e.event_id)] == [
        ("e1", "failed", "column 'x': not a number", T0 + 1),
        ("e2", "pending", "", T0 + 2),
    ]
    assert store.existing("a", ["e1", "e2", "e3"]) == {"e1", "e2"}
    assert store.existing("b", ["e1"]) == set()


def test_time_and_token_filters(store: CacheStore) -> None:
    store.add([entry("a", n, token="web" if n % 2 else "app") for n in range(5)])
    _total, found = store.query(["a"], T0 + 1, T0 + 3, set(), 10)
    assert ids(found) == ["e3", "e2", "e1"]
    _total, found = store.query(["a"], None, None, {"web"}, 10)
    assert ids(found) == ["e3", "e1"]
    _total, found = store.query(["a"], None, None, {"web"}, 1)
    assert ids(found) == ["e3"]
    assert store.query(["missing"], None, None, set(), 10) == (0, [])


def test_entries_round_trip_their_json(store: CacheStore) -> None:
    original = orjson.Fragment(b'{"user":{"id":42},"url":"https://example.com/?q=\\u00e9"}')
    record = {"table": "events", "record": [{"field": "user_id", "type": "bigint", "value": 42}]}
    store.set([CachedEvent("a", "e1", T0, "tok", "success", original, record, "")])
    _total, [found] = store.query(["a"], None, None, set(), 10)
    assert orjson.loads(orjson.dumps(found.to_json())) == {
        "destination_id": "a",
        "token_id": "tok",
        "event_id": "e1",
        "timestamp": "2023-11-14T22:13:20.000000Z",
        "status": "success",
        "original": {"user": {"id": 42}, "url": "https://example.com/?q=é"},
        "success": record,
        "error": "",
    }


def test_redis_keys_expire(tmp_path: Path) -> None:
    redis = RedisStore(RedisConfig(host="127.0.0.1", port=6379), SIZE, prefix=f"test:{uuid.uuid4().hex}:", ttl=60)
    try:
        redis.add([entry("a", 1)])
        index, entries = redis.keys("a")
        assert 0 < redis._client.ttl(index) <= 60
        assert 0 < redis._client.ttl(entries) <= 60
    finally:
        redis.delete(["a"])
        redis.close()


def _write_from_a_process(path: str, first: int) -> None:
    store = SqliteStore(Path(path), 1000)
    for n in range(first, first + 50):
        store.add([entry("a", n)])
    store.close()


def test_sqlite_is_shared_by_processes(tmp_path: Path) -> None:
    path = tmp_path / "events.sqlite"
    store = SqliteStore(path, 1000)
    store.add([entry("a", 1000)])  # opened here before the fork: each process opens its own
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_write_from_a_process, args=(str(path), 50 * i)) for i in range(4)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(60)
        assert process.exitcode == 0
    total, found = store.query(["a"], None, None, set(), 1000)
    assert total == 201
    assert set(ids(found)) == {f"e{n}" for n in [*range(200), 1000]}
    store.close()
