"""The ASGI app in-process (httpx.ASGITransport): failure paths that real HTTP cannot provoke."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from eventspark.collector.app import CollectorApp
from eventspark.config.models import Config
from eventspark.stream.queue import QueueWriter


def make_app(tmp_path: Path, **overrides: Any) -> CollectorApp:
    raw: dict[str, Any] = {
        "api_keys": [{"id": "t", "client_secret": "js", "server_secret": "s2s"}],
        "log": {"path": str(tmp_path / "events")},
        "destinations": {"dw": {"type": "duckdb"}},
        **overrides,
    }
    return CollectorApp(Config.model_validate(raw))


def run(app: CollectorApp, scenario: Callable[[httpx.AsyncClient], Awaitable[Any]]) -> Any:
    """Opens the app, runs `scenario` with a client on it, closes the app."""

    async def main() -> Any:
        app.open()
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://collector") as client:
                return await scenario(client)
        finally:
            app.close()

    return asyncio.run(main())


def incoming_events(tmp_path: Path) -> list[dict[str, Any]]:
    files = sorted((tmp_path / "events" / "incoming").glob("*.log"))
    return [orjson.loads(line) for path in files for line in path.read_bytes().splitlines()]


def test_admin_endpoints_without_an_admin_token_are_401(tmp_path: Path) -> None:
    async def scenario(client: httpx.AsyncClient) -> list[httpx.Response]:
        return [await client.get(path, params={"token": ""}) for path in ("/api/v1/cluster", "/prometheus")]

    for response in run(make_app(tmp_path), scenario):
        assert response.status_code == 401
        assert response.json()["message"] == "Admin token is not configured"


def test_prometheus_disabled_is_404(tmp_path: Path) -> None:
    app = make_app(tmp_path, server={"admin_token": "a", "metrics": {"prometheus": {"enabled": False}}})

    async def scenario(client: httpx.AsyncClient) -> httpx.Response:
        return await client.get("/prometheus", headers={"X-Admin-Token": "a"})

    assert run(app, scenario).status_code == 404


def test_streamed_body_is_read_whole(tmp_path: Path) -> None:
    async def chunks() -> Any:
        for part in (b'[{"a"', b": 1}, ", b'{"a": 2}]'):
            yield part

    async def scenario(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post("/api/v1/event?token=js", content=chunks())

    assert run(make_app(tmp_path), scenario).status_code == 200
    assert [e["a"] for e in incoming_events(tmp_path)] == [1, 2]


def test_write_failure_is_503_and_leaves_no_partial_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    failing = {"on": False}

    def write(fd: int, data: Any) -> int:
        if failing["on"]:
            real_write(fd, bytes(data)[:5])
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    async def scenario(client: httpx.AsyncClient) -> list[httpx.Response]:
        first = await client.post("/api/v1/event?token=js", json={"n": 1})
        failing["on"] = True
        second = await client.post("/api/v1/event?token=js", json={"n": 2})
        failing["on"] = False
        third = await client.post("/api/v1/event?token=js", json={"n": 3})
        return [first, second, third]

    monkeypatch.setattr(os, "write", write)
    statuses = [r.status_code for r in run(make_app(tmp_path), scenario)]
    monkeypatch.undo()
    assert statuses == [200, 503, 200]
    assert [e["n"] for e in incoming_events(tmp_path)] == [1, 3]


def test_group_commit_shares_fsyncs_between_requests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_fsync = os.fsync
    calls: list[int] = []

    def slow_fsync(fd: int) -> None:
        calls.append(fd)
        time.sleep(0.02)
        real_fsync(fd)

    async def scenario(client: httpx.AsyncClient) -> list[int]:
        requests = [client.post("/api/v1/event?token=js", json={"n": n}) for n in range(40)]
        return [r.status_code for r in await asyncio.gather(*requests)]

    monkeypatch.setattr(os, "fsync", slow_fsync)
    app = make_app(tmp_path, server={"fsync": True})
    assert run(app, scenario) == [200] * 40
    monkeypatch.undo()
    assert sorted(e["n"] for e in incoming_events(tmp_path)) == list(range(40))
    assert 1 <= len(calls) < 40


def test_fsync_failure_is_503(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    async def scenario(client: httpx.AsyncClient) -> httpx.Response:
        monkeypatch.setattr(os, "fsync", broken_fsync)
        try:
            return await client.post("/api/v1/event?token=js", json={"n": 1})
        finally:
            monkeypatch.undo()

    response = run(make_app(tmp_path, server={"fsync": True}), scenario)
    assert response.status_code == 503
    assert response.json() == {"message": "Failed to store events", "error": "Input/output error"}


def test_a_stream_queue_failure_cuts_the_request_out_of_the_incoming_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The incoming log is written first; a 503 must not leave lines there for the batch to load.
    real_write = QueueWriter.write

    def full_queue(self: QueueWriter, data: bytes, lines: int = 1) -> None:
        raise OSError(28, "No space left on device")

    async def scenario(client: httpx.AsyncClient) -> list[int]:
        statuses = [(await client.post("/api/v1/event?token=js", json={"n": 1})).status_code]
        monkeypatch.setattr(QueueWriter, "write", full_queue)
        statuses.append((await client.post("/api/v1/event?token=js", json={"n": 2})).status_code)
        monkeypatch.setattr(QueueWriter, "write", real_write)
        statuses.append((await client.post("/api/v1/event?token=js", json={"n": 3})).status_code)
        return statuses

    live = {"type": "postgres", "mode": "stream", "datasource": {"host": "127.0.0.1", "port": 1, "db": "x"}}
    app = make_app(tmp_path, destinations={"dw": {"type": "duckdb"}, "live": live})
    assert run(app, scenario) == [200, 503, 200]
    assert [e["n"] for e in incoming_events(tmp_path)] == [1, 3]


def test_close_is_idempotent_and_rotates(tmp_path: Path) -> None:
    app = make_app(tmp_path)

    async def scenario(client: httpx.AsyncClient) -> None:
        await client.post("/api/v1/event?token=js", json={"n": 1})

    run(app, scenario)
    assert app.close() == []
    [rotated] = (tmp_path / "events" / "incoming").glob("*.log")
    assert rotated.name.startswith("incoming.tok=t-")


def test_lifespan_opens_and_closes(tmp_path: Path) -> None:
    app = make_app(tmp_path, log={"path": str(tmp_path / "events"), "rotation_min": 0.001})
    sent: list[str] = []

    async def main() -> None:
        messages = asyncio.Queue[dict[str, Any]]()
        await messages.put({"type": "lifespan.startup"})

        async def send(message: dict[str, Any]) -> None:
            sent.append(message["type"])

        task = asyncio.create_task(app({"type": "lifespan"}, messages.get, send))
        await asyncio.sleep(0.01)
        assert (tmp_path / "events" / "incoming").is_dir()
        await messages.put({"type": "lifespan.shutdown"})
        await task

    asyncio.run(main())
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def test_unexpected_errors_are_500_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = make_app(tmp_path)

    def boom(*args: Any, **kwargs: Any) -> bytes:
        raise ZeroDivisionError

    monkeypatch.setattr(app, "prepare", boom)

    async def scenario(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post("/api/v1/event?token=js", json={})

    response = run(app, scenario)
    assert response.status_code == 500
    assert response.json() == {"message": "Internal server error", "error": "ZeroDivisionError"}


def test_origin_echo_follows_each_tokens_rules_past_the_answer_cache(tmp_path: Path) -> None:
    # JS answers are cached by token and origin; the cache must never let one token's
    # allowed origin through for another token, nor grow without bound.
    from eventspark.collector.api import events as routes

    keys = [
        {"id": "open", "client_secret": "js-open", "server_secret": "s-open"},
        {"id": "shop", "client_secret": "js-shop", "server_secret": "s-shop", "origins": ["*.shop.io"]},
    ]
    origins = [f"https://site{n}.shop.io" for n in range(routes.MAX_CACHED_ORIGINS + 5)]

    async def scenario(client: httpx.AsyncClient) -> list[tuple[str, str | None, str | None]]:
        seen = []
        for origin in [*origins, "https://evil.io", origins[0]]:
            for secret in ("js-open", "js-shop"):
                response = await client.post(f"/api/v1/event?token={secret}", content=b"{}", headers={"Origin": origin})
                assert response.status_code == 200
                seen.append((secret, origin, response.headers.get("access-control-allow-origin")))
        return seen

    seen = run(make_app(tmp_path, api_keys=keys), scenario)
    assert len(routes._JS_ANSWERS) <= routes.MAX_CACHED_ORIGINS
    for secret, origin, echoed in seen:
        allowed = secret == "js-open" or origin.endswith(".shop.io")
        assert echoed == (origin if allowed else None), (secret, origin)


def test_the_plain_token_fast_path_answers_like_the_general_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `?token=<client secret>` alone is served without a Request object; any other query takes
    # the general path. Both must answer, store and count exactly alike (ids are given: a generated
    # one would differ).
    from eventspark.collector import app as app_module

    built: list[object] = []

    class CountedRequest(app_module.Request):
        __slots__ = ()

        def __init__(self, *args: Any) -> None:
            built.append(self)
            super().__init__(*args)

    monkeypatch.setattr(app_module, "Request", CountedRequest)
    cases: list[tuple[str, dict[str, str], bytes]] = [
        (
            "js",
            {"Origin": "https://a.shop.io", "User-Agent": "UA/1", "X-Forwarded-For": "9.9.9.9, 10.0.0.1"},
            b'{"event_id": "e0"}',
        ),
        ("js", {"Origin": "https://evil.io", "X-Real-IP": "8.8.8.8"}, b'[{"event_id": "e1"}, {"event_id": 7}]'),
        (
            "js",
            {"Origin": "https://a.shop.io"},
            b'{"template": {"t": 1}, "events": [{"event_id": "e2"}, {"event_id": "e3"}]}',
        ),
        ("js", {"Origin": "https://a.shop.io"}, b"{bad"),
        ("js", {}, b"[" * 70 + b"]" * 70),
        ("js", {}, b"x" * 2000),
        ("js", {"Origin": "https://a.shop.io"}, b"[]"),
        ("nope", {"Origin": "https://a.shop.io"}, b"{}"),
        ("s2s", {}, b"{}"),
        ("js-idle", {"Origin": "https://a.shop.io"}, b"{}"),
    ]

    def serve(query: str) -> tuple[list[tuple[int, Any, str | None]], list[dict[str, Any]], CollectorApp]:
        work = tmp_path / query.replace("&", "_").replace("{}", "")
        app = make_app(
            work,
            api_keys=[
                {"id": "t", "client_secret": "js", "server_secret": "s2s", "origins": ["*.shop.io"]},
                {"id": "idle", "client_secret": "js-idle", "server_secret": "s-idle"},
            ],
            destinations={"dw": {"type": "duckdb", "only_tokens": ["t"]}},
            server={"max_event_size": 1024},
        )

        async def scenario(client: httpx.AsyncClient) -> list[tuple[int, Any, str | None]]:
            answers = []
            for secret, headers, body in cases:
                response = await client.post(f"/api/v1/event?{query.format(secret)}", content=body, headers=headers)
                answers.append(
                    (response.status_code, response.json(), response.headers.get("access-control-allow-origin"))
                )
            return answers

        answers = run(app, scenario)
        events = incoming_events(work)
        for event in events:
            assert event.pop("_timestamp")
        return answers, events, app

    fast_answers, fast_events, fast = serve("token={}")
    assert len(built) == 2  # only for the secrets of no client token ("nope", "s2s")
    general_answers, general_events, general = serve("x=1&token={}")
    assert len(built) == 2 + len(cases)
    assert fast_answers == general_answers
    assert [status for status, _, _ in fast_answers] == [200, 200, 200, 400, 400, 413, 200, 401, 401, 422]
    assert fast_events == general_events and len(fast_events) == 5
    assert fast.metrics.accepted == general.metrics.accepted == {"t": 5, "idle": 0}
    assert fast.metrics.rejected == general.metrics.rejected
    fast_latency, general_latency = fast.metrics.latency["/api/v1/event"], general.metrics.latency["/api/v1/event"]
    assert sum(fast_latency.counts) == sum(general_latency.counts) == len(cases)
