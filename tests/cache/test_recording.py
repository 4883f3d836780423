"""Recording into the events cache: the rate limit, results, bounds, time parameters, the store
chosen for a config, and what the stream workers and the batch job report."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from eventspark.config.models import Config, RedisConfig
from eventspark.destinations.registry import destination_type
from eventspark.ops import cache as cache_module
from eventspark.ops.cache import (
    MAX_EVENT_ID_CHARS,
    MAX_FIELDS,
    MAX_ORIGINAL_BYTES,
    MAX_RECORD_CHARS,
    MAX_VALUE_CHARS,
    EventsCache,
    Outcome,
    RateLimit,
    events_cache_for,
    parse_time,
)
from eventspark.ops.cache_redis import RedisStore
from eventspark.ops.cache_results import StreamResults, record_of, record_samples, sample_row, settle_samples
from eventspark.ops.cache_store import MemoryStore, SqliteStore
from eventspark.steps.chain import Failure, Row
from eventspark.steps.typing import DataType


def event(n: int, **extra: Any) -> dict[str, Any]:
    return {"eventn_ctx": {"event_id": f"e{n}"}, "api_key": "secret", "n": n, **extra}


def memory_cache(size: int = 3, window: float = 60) -> EventsCache:
    return EventsCache(MemoryStore(size), size, window, local=True, tokens={"secret": "web"})


def statuses(cache: EventsCache, dest: str) -> dict[str, str]:
    return {e.event_id: e.status for e in cache.query([dest])[1]}


def test_rate_limit_counts_per_key_and_window() -> None:
    limit = RateLimit(3, 10)
    assert limit.take("a", 2, now=0) == 2
    assert limit.take("a", 2, now=1) == 1
    assert limit.take("a", 1, now=9.9) == 0
    assert limit.take("b", 5, now=9.9) == 3  # another key has its own budget
    assert limit.take("a", 5, now=10) == 3  # a new window


def test_accepted_events_are_pending_within_the_rate_limit() -> None:
    cache = memory_cache(size=3)
    cache.accepted(("pg", "dw"), "web", [event(1), event(2)])
    cache.accepted(("pg", "dw"), "web", [event(3), event(4)])  # one more fits the window of each
    cache.accepted(("pg",), "web", [event(5)])
    assert len(cache._queue) == 2  # a request over the limit hands nothing off
    cache.flush()
    total, found = cache.query(["pg", "dw"])
    assert total == 6
    assert [(e.destination_id, e.event_id) for e in found if e.destination_id == "pg"] == [
        ("pg", "e3"),
        ("pg", "e2"),
        ("pg", "e1"),
    ]
    assert {e.token_id for e in found} == {"web"} and {e.status for e in found} == {"pending"}
    assert orjson.loads(orjson.dumps(found[0].original)) == event(3)


def test_the_background_thread_writes_without_a_flush() -> None:
    cache = memory_cache()
    cache.accepted(("pg",), "web", [event(1)])
    deadline = 50
    while not cache.query(["pg"])[1] and deadline:
        deadline -= 1
        cache._stop.wait(0.05)
    assert statuses(cache, "pg") == {"e1": "pending"}
    cache.close()
    assert cache._thread is None


def test_results_update_entries_and_add_others_within_the_limit() -> None:
    cache = memory_cache(size=3)
    cache.accepted(("pg",), "web", [event(1), event(2), event(3), event(4)])
    cache.flush()
    line = orjson.dumps(event(4))
    record = {"table": "events", "record": [{"field": "n", "type": "bigint", "value": 1}]}
    outcomes = [Outcome("e1", orjson.dumps(event(1)), "success", success=lambda: record)]
    outcomes += [Outcome("", orjson.dumps(event(2)), "failed", error="column 'n': bad")]
    outcomes += [Outcome("", line, "skipped")]  # e4 was over the limit: a new entry
    cache.results("pg", outcomes)
    cache.flush()
    found = {e.event_id: e for e in cache.query(["pg"])[1]}
    assert {k: e.status for k, e in found.items()} == {"e2": "failed", "e3": "pending", "e4": "skipped"}
    assert found["e2"].error == "column 'n': bad" and found["e4"].token_id == "web"  # from its api_key
    cache.results("pg", [Outcome("", orjson.dumps(event(n)), "skipped") for n in range(10, 20)])
    cache.flush()  # the results' window has two places left
    assert len([e for e in cache.query(["pg"])[1] if e.event_id.startswith("e1")]) == 2


def test_entries_are_bounded_in_size() -> None:
    cache = memory_cache()
    huge = event(1, blob="x" * MAX_ORIGINAL_BYTES)
    cache.accepted(("pg",), "web", [huge])
    many = {f"f{i}": i for i in range(MAX_FIELDS + 5)}
    row = Row("events", many, {})
    long = Row("events", {f"f{i}": "y" * (MAX_VALUE_CHARS + 10) for i in range(MAX_FIELDS)}, {})
    cache.results(
        "pg",
        [
            Outcome("e2", orjson.dumps(event(2)), "success", success=lambda: record_of(row, None)),
            Outcome("e3", orjson.dumps(event(3)), "success", success=lambda: record_of(long, None)),
        ],
    )
    cache.flush()
    found = {e.event_id: e for e in cache.query(["pg"])[1]}
    assert found["e1"].original["_truncated"] is True
    assert found["e1"].original["size"] > MAX_ORIGINAL_BYTES
    assert len(found["e1"].body()) < 4 * 1024
    record = found["e2"].success["record"]  # type: ignore[index]
    assert len(record) == MAX_FIELDS + 1 and record[-1]["field"] == "_truncated"
    long_record = found["e3"].success["record"]  # type: ignore[index]
    assert len(long_record[0]["value"]) < MAX_VALUE_CHARS + 20 and long_record[-1]["field"] == "_truncated"
    assert sum(len(str(f["value"])) for f in long_record) < MAX_RECORD_CHARS + MAX_VALUE_CHARS + 100


def test_event_ids_are_bounded_in_keys() -> None:
    # The client chooses event ids: a megabyte of id must not become a Redis or SQLite key.
    cache = memory_cache(size=10)
    long_a, long_b = "a" * 100_000 + "1", "a" * 100_000 + "2"
    cache.accepted(("pg",), "web", [event(0, eventn_ctx={"event_id": long_a})])
    results = StreamResults(cache, "pg", None)
    row = Row("events", {"eventn_ctx_event_id": long_b}, {})
    line = orjson.dumps(event(0, eventn_ctx={"event_id": long_b}))
    results.record({"events": [(row, line)]}, [line], [])
    cache.flush()
    found = cache.query(["pg"])[1]
    assert len(found) == 2 and len({e.event_id for e in found}) == 2
    assert all(len(e.event_id) <= MAX_EVENT_ID_CHARS for e in found)
    assert {e.status for e in found} == {"pending", "success"}


def test_a_big_micro_batch_makes_few_outcomes() -> None:
    # A micro-batch of 1000 delivered events: the entries known (pending) are updated, at most
    # `size` others are offered, and the worker's thread only hands references over.
    cache = memory_cache(size=5)
    cache.accepted(("pg",), "web", [event(n) for n in range(3)])
    cache.close()  # written; and no thread drains the queue meanwhile:
    cache._pid = os.getpid()
    results = StreamResults(cache, "pg", None)
    lines = [orjson.dumps(event(n)) for n in range(1000)]
    rows = [(Row("events", {"eventn_ctx_event_id": f"e{n}"}, {}), line) for n, line in enumerate(lines)]
    results.record({"events": rows}, lines, [])
    ((kind, _dest, make, _stamp),) = cache._queue
    assert kind == "results" and callable(make)
    outcomes = make()
    assert len(outcomes) == 3 + 5 and {o.event_id for o in outcomes[:3]} == {"e0", "e1", "e2"}
    cache.flush()
    assert set(statuses(cache, "pg").values()) == {"success"} and len(statuses(cache, "pg")) == 5


def test_a_full_hand_off_queue_drops_records(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "MAX_QUEUED", 2)
    cache = EventsCache(MemoryStore(100), 100, 60, local=True)
    cache._pid = os.getpid()  # as if the thread were running: nothing drains meanwhile
    for n in range(5):
        cache.accepted(("pg",), "web", [event(n)])
    assert len(cache._queue) == 2 and cache.dropped == 3


@pytest.mark.parametrize(
    ("text", "stamp"),
    [
        ("1700000000", 1_700_000_000.0),
        ("1700000000.25", 1_700_000_000.25),
        ("2023-11-14T22:13:20Z", 1_700_000_000.0),
        ("2023-11-14T22:13:20.500000Z", 1_700_000_000.5),
        ("2023-11-14T23:13:20+01:00", 1_700_000_000.0),
        ("2023-11-14T22:13:20", 1_700_000_000.0),
    ],
)
def test_parse_time(text: str, stamp: float) -> None:
    assert parse_time(text) == stamp


@pytest.mark.parametrize("text", ["", "yesterday", "nan", "1e999", "2023-13-45T00:00:00Z", "1" * 100, "-5"])
def test_parse_time_refuses_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_time(text)


def config(tmp_path: Path, **server: Any) -> Config:
    return Config.model_validate({"server": server, "log": {"path": str(tmp_path)}, **server.pop("top", {})})


def test_the_store_follows_the_config(tmp_path: Path) -> None:
    one = events_cache_for(config(tmp_path))
    assert one is not None and isinstance(one.store, MemoryStore) and one.local
    assert events_cache_for(config(tmp_path)) is one  # the collector and the services of a process share it
    workers = events_cache_for(config(tmp_path, workers=2))
    assert workers is not None and isinstance(workers.store, SqliteStore)
    assert workers.store.path == tmp_path / "cache" / "events.sqlite"
    shared = events_cache_for(config(tmp_path, top={"meta": {"storage": {"redis": {"host": "127.0.0.1"}}}}))
    assert shared is not None and isinstance(shared.store, RedisStore)
    assert events_cache_for(config(tmp_path, cache={"enabled": False})) is None
    assert events_cache_for(config(tmp_path, cache={"events": {"size": 0}})) is None


def test_stream_results_of_a_micro_batch() -> None:
    cache = memory_cache(size=10)
    column_type = destination_type("postgres").dialect.column_type
    results = StreamResults(cache, "pg", column_type)
    stored, failed, skipped = (orjson.dumps(event(n)) for n in (1, 2, 3))
    row = Row("events", {"eventn_ctx_event_id": "e1", "n": 1, "_timestamp": "2023-11-14T22:13:20.000000Z"}, {})
    results.skipped(skipped)
    results.record({"events": [(row, stored)]}, [stored], [(failed, "column 'n': bad")])
    cache.flush()
    found = {e.event_id: e for e in cache.query(["pg"])[1]}
    assert {k: e.status for k, e in found.items()} == {"e1": "success", "e2": "failed", "e3": "skipped"}
    assert found["e1"].success == {
        "table": "events",
        "record": [
            {"field": "eventn_ctx_event_id", "type": "text", "value": "e1"},
            {"field": "n", "type": "bigint", "value": 1},
            {"field": "_timestamp", "type": "timestamp", "value": "2023-11-14T22:13:20.000000Z"},
        ],
    }
    assert found["e2"].error == "column 'n': bad"


def test_batch_samples_are_settled_by_their_pair() -> None:
    column_type = destination_type("postgres").dialect.column_type
    line = orjson.dumps(event(1))
    staged = Row("events", {"n": 1, "s": "5"}, {})
    payloads = [
        sample_row("pg", "web", line, staged, column_type, {"s": DataType.STRING}),
        sample_row("pg", "web", orjson.dumps(event(2)), Failure("table_name_template: boom"), column_type, None),
        sample_row("pg", "web", orjson.dumps(event(3)), None, column_type, None),
        sample_row("bad", "web", orjson.dumps(event(4)), Row("t", {"n": 1}, {}), column_type, None),
        sample_row("gone", "web", orjson.dumps(event(5)), Row("t", {"n": 1}, {}), column_type, None),
    ]
    settled = settle_samples(payloads, {("pg", "events"): "", ("bad", "t"): "permission denied"})
    assert [(s["id"], s["status"], s["error"]) for s in settled] == [
        ("e1", "success", ""),
        ("e2", "failed", "table_name_template: boom"),
        ("e3", "skipped", ""),
        ("e4", "failed", "permission denied"),
    ]
    assert settled[0]["success"]["record"] == [
        {"field": "n", "type": "bigint", "value": 1},
        {"field": "s", "type": "text", "value": "5"},
    ]
    cache = memory_cache(size=10)
    record_samples(cache, settled)
    cache.flush()
    found = {e.event_id: e for e in cache.query(["pg", "bad"])[1]}
    assert found["e1"].success == settled[0]["success"] and found["e4"].success is None
    assert orjson.loads(orjson.dumps(found["e1"].original)) == event(1)


def test_an_unreachable_store_loses_records_not_events() -> None:
    from tests.collector.conftest import free_port

    store = RedisStore(RedisConfig(host="127.0.0.1", port=free_port()), 10)
    cache = EventsCache(store, 10, 60)
    cache.accepted(("pg",), "web", [event(1), event(2)])
    cache.flush()  # no exception reaches the caller
    assert cache.dropped == 1 and not cache._queue
    with pytest.raises(redis.ConnectionError):
        cache.query(["pg"])


def test_close_stops_the_thread_and_writes_what_is_left() -> None:
    cache = memory_cache()
    cache.accepted(("pg",), "web", [event(1)])
    thread = cache._thread
    assert thread is not None and thread.is_alive()
    cache.close()
    assert not thread.is_alive()
    assert statuses(cache, "pg") == {"e1": "pending"}
