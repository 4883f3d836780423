"""`GET /api/v1/events/cache` over real HTTP against `eventspark serve` (a subprocess): a stream
destination into Postgres (success with the table and typed fields, failed with the reason,
skipped), a batch destination after a pass (a sample), `server.workers: 2`, two nodes sharing
Redis, and the parameters' limits."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis

from tests.collector import conftest as collector_fixtures
from tests.collector.conftest import Server, start_server
from tests.vectors import hashed_id

run_server = collector_fixtures.run_server

ADMIN = "cache-admin"
JS = "cache-js-secret"
S2S = "cache-s2s-secret"
KEYS = [{"id": "web", "client_secret": JS, "server_secret": S2S}]
SKIP_TEMPLATE = '{{if eq .event_type "heartbeat"}}{{else}}events{{end}}'
CACHE_PATH = "/api/v1/events/cache"
USER_AGENT = "cache-test/1.0"
HASHED_ID = hashed_id("127.0.0.1", USER_AGENT)
"""`hashed_anonymous_id` of the events sent here (from the peer address, no X-Forwarded-For)."""


def send(server: Server, *events: dict[str, Any]) -> None:
    body = events[0] if len(events) == 1 else list(events)
    answer = httpx.post(
        f"{server.url}/api/v1/s2s/event?token={S2S}",
        content=orjson.dumps(body),
        headers={"User-Agent": USER_AGENT},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text


def cached(server: Server, **params: Any) -> httpx.Response:
    return httpx.get(f"{server.url}{CACHE_PATH}", params={"token": ADMIN, **params}, timeout=10)


def wait_for(
    server: Server, done: Callable[[dict[str, dict[str, Any]]], bool], timeout: float = 60, **params: Any
) -> dict[str, dict[str, Any]]:
    """Polls the cache until `done(entries by event id)`; the entries."""
    deadline = time.monotonic() + timeout
    while True:
        answer = cached(server, **params)
        assert answer.status_code == 200, answer.text
        entries = {e["event_id"]: e for e in answer.json()["events"]}
        if done(entries):
            return entries
        assert time.monotonic() < deadline, f"the cache never got there: {orjson.dumps(entries)[:3000]!r}"
        time.sleep(0.2)


def event_id(n: int) -> str:
    return f"evt-{n:04d}"


def event(number: int, **extra: Any) -> dict[str, Any]:
    return {"eventn_ctx": {"event_id": event_id(number)}, "event_type": "click", "n": number, **extra}


def fields(entry: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    return {f["field"]: (f["type"], f["value"]) for f in entry["success"]["record"]}


def stream_config(pg_datasource: dict[str, Any], **server: Any) -> dict[str, Any]:
    return {
        "server": {"admin_token": ADMIN, **server},
        "api_keys": KEYS,
        "stream": {"batch_wait_ms": 20, "poll_ms": 5},
        "destinations": {
            "pg": {
                "type": "postgres",
                "mode": "stream",
                "datasource": pg_datasource,
                "data_layout": {"table_name_template": SKIP_TEMPLATE},
            }
        },
    }


def check_stream_outcomes(server: Server) -> None:
    send(server, event(1, price=9.5, user={"id": 42}))
    first = wait_for(server, lambda e: e.get(event_id(1), {}).get("status") == "success")[event_id(1)]
    assert first["destination_id"] == "pg" and first["token_id"] == "web" and first["error"] == ""
    assert first["original"]["user"] == {"id": 42, "hashed_anonymous_id": HASHED_ID}  # as enriched
    assert first["original"]["src"] == "api"
    assert first["success"]["table"] == "events"
    stored = fields(first)
    assert stored["n"] == ("bigint", 1)
    assert stored["price"] == ("numeric(38,18)", 9.5)
    assert stored["user_id"] == ("bigint", 42)
    assert stored["user_hashed_anonymous_id"] == ("text", HASHED_ID)
    assert stored["eventn_ctx_event_id"] == ("text", event_id(1))
    assert stored["_timestamp"][0] == "timestamp"
    # `n` is a bigint column now: a word does not fit it.
    send(server, event(2, n="many"), event(3, event_type="heartbeat"))
    decided = {"failed", "skipped"}
    entries = wait_for(server, lambda e: {e.get(event_id(k), {}).get("status") for k in (2, 3)} <= decided)
    assert entries[event_id(2)]["status"] == "failed"
    assert "'n'" in entries[event_id(2)]["error"] and entries[event_id(2)]["success"] is None
    assert entries[event_id(2)]["original"]["n"] == "many"
    assert entries[event_id(3)]["status"] == "skipped"
    answer = cached(server).json()
    assert answer["total_events"] == answer["response_events"] == 3
    assert [e["event_id"] for e in answer["events"]] == [event_id(3), event_id(2), event_id(1)]  # newest first


def test_stream_destination(run_server: Any, pg_datasource: dict[str, Any]) -> None:
    server = run_server(stream_config(pg_datasource))
    check_stream_outcomes(server)
    assert "Traceback" not in server.text()


def test_stream_destination_with_two_workers(run_server: Any, pg_datasource: dict[str, Any]) -> None:
    """Forked collector workers record pending events, the parent's stream worker the results: a
    SQLite file under log.path/cache/ joins them, and any worker answers."""
    server = run_server(stream_config(pg_datasource, workers=2))
    check_stream_outcomes(server)
    for n in range(10, 30):  # several connections: both workers take some
        send(server, event(n))
    wanted = {event_id(n) for n in range(10, 30)}
    entries = wait_for(server, lambda e: all(e.get(k, {}).get("status") == "success" for k in wanted))
    assert all(fields(entries[k])["n"][0] == "bigint" for k in wanted)
    assert (server.events_dir / "cache" / "events.sqlite").is_file()
    assert "Traceback" not in server.text()


def test_batch_destination_records_a_sample_after_a_pass(run_server: Any, pg_datasource: dict[str, Any]) -> None:
    config = {
        "server": {"admin_token": ADMIN},
        "api_keys": KEYS,
        "log": {"rotation_min": 0.02, "uploader_period_sec": 1},
        "spark": {"master": "local[1]"},
        "destinations": {"dw": {"type": "postgres", "datasource": pg_datasource}},
    }
    server = run_server(config)
    send(server, *[event(n) for n in range(20)])
    pending = wait_for(server, lambda e: len(e) == 20)
    assert {e["status"] for e in pending.values()} == {"pending"}  # recorded by the collector
    entries = wait_for(server, lambda e: any(x["status"] == "success" for x in e.values()), timeout=180)
    done = {k: e for k, e in entries.items() if e["status"] == "success"}
    # A sample: the first lines of the log's one split, not a copy of every event.
    assert 1 <= len(done) <= 5 and len(entries) == 20
    assert set(done) <= {event_id(n) for n in range(5)}
    for key, entry in done.items():
        assert entry["success"]["table"] == "events"
        assert fields(entry)["n"] == ("bigint", int(key[-4:]))
        assert entry["original"]["eventn_ctx"]["event_id"] == key
    assert "Traceback" not in server.text()


@pytest.fixture
def shared_destination() -> Iterator[str]:
    """A destination id of its own (its Redis keys), deleted from Redis afterwards."""
    dest = f"dw_{uuid.uuid4().hex[:10]}"
    yield dest
    client = redis.Redis(host="127.0.0.1", port=6379)
    keys = client.keys(f"eventspark:events_cache:*:{dest}")
    if keys:
        client.delete(*keys)
    client.close()


def test_two_nodes_share_the_cache_in_redis(tmp_path: Path, shared_destination: str) -> None:
    def node(name: str) -> Server:
        config = {
            "server": {"name": name, "admin_token": ADMIN},
            "api_keys": KEYS,
            "log": {"path": str(tmp_path / name), "uploader_period_sec": 3600},
            "meta": {"storage": {"redis": {"host": "127.0.0.1", "port": 6379}}},
            "destinations": {shared_destination: {"type": "duckdb"}},
        }
        (tmp_path / name).mkdir()
        return start_server(tmp_path / name, config)

    a, b = node("a"), node("b")
    try:
        send(a, event(1))
        send(b, event(2))
        for server in (a, b):
            entries = wait_for(server, lambda e: {event_id(1), event_id(2)} <= e.keys())
            assert entries[event_id(1)]["original"]["n"] == 1 and entries[event_id(2)]["original"]["n"] == 2
        keys = redis.Redis(host="127.0.0.1", port=6379).keys(f"eventspark:events_cache:*:{shared_destination}")
        assert len(keys) == 2
    finally:
        for server in (a, b):
            server.stop(signal.SIGTERM)


# --- parameters and limits (one server) ------------------------------------------------------------

SIZE = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    config = {
        "server": {"admin_token": ADMIN, "cache": {"events": {"size": SIZE, "time_window_sec": 0.001}}},
        "api_keys": [*KEYS, {"id": "app", "server_secret": "app-s2s"}],
        "log": {"uploader_period_sec": 3600},
        "destinations": {"dw": {"type": "duckdb"}, "other": {"type": "duckdb", "only_tokens": ["app"]}},
    }
    running = start_server(tmp_path_factory.mktemp("cache"), config)
    for n in range(10):
        send(running, event(n))
        time.sleep(0.002)  # past the rate limit's window: each event is recorded
    wait_for(running, lambda e: event_id(9) in e)
    yield running
    running.stop(signal.SIGTERM)


def test_the_size_bound_is_honoured(server: Server) -> None:
    answer = cached(server, destination_ids="dw").json()
    assert answer["total_events"] == answer["response_events"] == SIZE
    assert [e["event_id"] for e in answer["events"]] == [event_id(n) for n in (9, 8, 7, 6)]


def test_limit_and_destinations(server: Server) -> None:
    answer = cached(server, destination_ids="dw", limit=2).json()
    assert answer["total_events"] == SIZE and answer["response_events"] == 2
    assert [e["event_id"] for e in answer["events"]] == [event_id(9), event_id(8)]
    assert cached(server, destination_ids="other").json() == {"total_events": 0, "response_events": 0, "events": []}
    assert cached(server, destination_ids="nowhere,dw").json()["response_events"] == SIZE
    assert cached(server).json()["response_events"] == SIZE  # no destination_ids: all of them
    assert cached(server, token_ids="app").json()["response_events"] == 0
    assert cached(server, token_ids="web,app").json()["response_events"] == SIZE


def test_start_and_end(server: Server) -> None:
    events = cached(server).json()["events"]
    middle = events[1]["timestamp"]  # the second newest
    stamp = datetime.strptime(middle, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    assert [e["event_id"] for e in cached(server, start=middle).json()["events"]] == [event_id(9), event_id(8)]
    assert [e["event_id"] for e in cached(server, end=middle).json()["events"]] == [event_id(n) for n in (8, 7, 6)]
    around = {"start": f"{stamp - 0.0000005:.7f}", "end": f"{stamp + 0.0000005:.7f}"}  # unix seconds
    assert cached(server, **around).json()["response_events"] == 1
    assert cached(server, start=str(int(time.time()) + 100)).json()["response_events"] == 0
    assert cached(server, end="2020-01-01T00:00:00Z").json()["response_events"] == 0


@pytest.mark.parametrize(
    "params",
    [
        {"limit": "0"},
        {"limit": "1001"},
        {"limit": "ten"},
        {"limit": "9" * 5000},
        {"start": "yesterday"},
        {"end": "2023-02-30T00:00:00Z"},
        {"destination_ids": ",".join(f"d{n}" for n in range(101))},
        {"destination_ids": "x" * 300},
    ],
)
def test_bad_parameters_are_400(server: Server, params: dict[str, str]) -> None:
    answer = cached(server, **params)
    assert answer.status_code == 400
    assert set(answer.json()) == {"message", "error"} and answer.json()["message"].startswith("Bad ")


def test_the_admin_token_is_needed(server: Server) -> None:
    assert httpx.get(f"{server.url}{CACHE_PATH}", timeout=10).status_code == 401
    assert httpx.get(f"{server.url}{CACHE_PATH}?token={S2S}", timeout=10).status_code == 401
    answer = httpx.get(f"{server.url}{CACHE_PATH}", headers={"X-Admin-Token": ADMIN}, timeout=10)
    assert answer.status_code == 200


def test_a_disabled_cache_says_so(run_server: Any) -> None:
    config = {
        "server": {"admin_token": ADMIN, "cache": {"enabled": False}},
        "api_keys": KEYS,
        "destinations": {"dw": {"type": "duckdb"}},
    }
    server = run_server(config)
    send(server, event(1))
    answer = cached(server)
    assert answer.status_code == 404
    assert answer.json()["message"] == "The events cache is disabled"


def test_an_unreachable_redis_is_503_and_events_are_still_accepted(run_server: Any) -> None:
    config = {
        "server": {"admin_token": ADMIN},
        "api_keys": KEYS,
        "log": {"uploader_period_sec": 3600},
        "meta": {"storage": {"redis": {"host": "127.0.0.1", "port": collector_fixtures.free_port()}}},
        "destinations": {"dw": {"type": "duckdb"}},
    }
    server = run_server(config)
    server.mark()
    send(server, event(1))
    assert [e["n"] for e in server.new_events()] == [1]
    answer = cached(server)
    assert answer.status_code == 503
    assert answer.json()["message"] == "The events cache store is unavailable"
