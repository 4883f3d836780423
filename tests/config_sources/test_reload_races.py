"""A reload while requests are in flight (the ASGI app in-process, so the timing is exact).

A request takes its route before it reads its body; a reload may land in between, and with
`server.fsync` the request then waits on the group commit of the files it wrote.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from eventspark.collector.app import CollectorApp
from eventspark.config.models import Config
from eventspark.stream.queue import queue_dir
from tests.collector.test_app import run

TOKEN = {"id": "t", "client_secret": "js", "server_secret": "s2s"}


def config(tmp_path: Path, stream: bool, **extra: Any) -> Config:
    destinations: dict[str, Any] = {"dw": {"type": "duckdb"}}
    if stream:
        datasource = {"host": "127.0.0.1", "db": "test", "username": "postgres"}
        destinations["live"] = {"type": "postgres", "mode": "stream", "datasource": datasource}
    raw = {"api_keys": [TOKEN], "log": {"path": str(tmp_path / "events")}, "destinations": destinations, **extra}
    return Config.model_validate(raw)


@pytest.mark.parametrize("fsync", [True, False])
def test_a_request_in_flight_when_its_stream_destination_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync: bool
) -> None:
    server = {"fsync": fsync}
    app = CollectorApp(config(tmp_path, stream=True, server=server))
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:  # the group commit is still running when the reload lands
        time.sleep(0.05)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    reading = asyncio.Event()
    reloaded = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        reading.set()
        await reloaded.wait()  # the route was taken; now the destination is gone
        yield orjson.dumps({"n": 1})

    async def scenario(client: httpx.AsyncClient) -> list[int]:
        first = asyncio.create_task(client.post("/api/v1/s2s/event?token=s2s", content=slow_body()))
        await reading.wait()
        app.reconfigure(config(tmp_path, stream=False, server=server))  # `live` removed
        reloaded.set()
        codes = [(await first).status_code]
        # while the first one's fsync may still run: the destination comes back
        app.reconfigure(config(tmp_path, stream=True, server=server))
        answer = await client.post("/api/v1/s2s/event?token=s2s", json={"n": 2})
        return [*codes, answer.status_code]

    assert run(app, scenario) == [200, 200]
    monkeypatch.undo()
    # Both events are in the destination's queue (the first one in its retired spool, which the
    # destination took up again when it came back: one writer, one lock).
    segments = sorted(queue_dir(tmp_path / "events", "live").iterdir())
    data = b"".join(p.read_bytes() for p in segments if p.is_file() and not p.name.endswith(".lock"))
    assert b'"n":1' in data and b'"n":2' in data


def test_a_request_in_flight_when_its_token_is_removed_with_the_events_cache(tmp_path: Path) -> None:
    app = CollectorApp(config(tmp_path, stream=False))
    reading = asyncio.Event()
    reloaded = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        reading.set()
        await reloaded.wait()
        yield orjson.dumps({"n": 1})

    async def scenario(client: httpx.AsyncClient) -> int:
        first = asyncio.create_task(client.post("/api/v1/s2s/event?token=s2s", content=slow_body()))
        await reading.wait()
        other = {**TOKEN, "id": "u", "client_secret": "js2", "server_secret": "s2s2"}
        raw = {
            "api_keys": [other],
            "log": {"path": str(tmp_path / "events")},
            "destinations": {"dw": {"type": "duckdb"}},
        }
        app.reconfigure(Config.model_validate(raw))
        reloaded.set()
        return (await first).status_code

    # The request was authenticated before the reload: its events are kept (the log of a token
    # no destination takes any more is held in incoming/ by the batch pass), and it gets its 200.
    assert run(app, scenario) == 200
    events = [
        orjson.loads(line)
        for p in (tmp_path / "events" / "incoming").glob("*.log")
        for line in p.read_bytes().splitlines()
    ]
    assert [e["n"] for e in events] == [1]
