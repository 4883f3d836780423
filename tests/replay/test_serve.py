"""Failed events and their replay through a running `eventspark serve`, into the machine's Postgres.

One server for the module, four destinations on it, each in a schema of its own and connected as
a role of the module's own: batch keyed, batch unkeyed, stream keyed, stream unkeyed. The uploader
period is an hour, so every batch load here comes from `POST /api/v1/batch/run` (or a replay)
asking for a pass now. The failures are realistic ones: batch events whose `amount` does not fit
the column an earlier event created (fixed by widening the column), stream inserts refused because
INSERT was revoked from the role (fixed by granting it back).
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.collector.conftest import EVENTSPARK, Server, start_server
from tests.conftest import PG_DB, PG_HOST, PG_PORT, pg_conninfo

ADMIN = "admin-" + uuid.uuid4().hex
SECRETS = {"batch": "s2s-b-" + uuid.uuid4().hex, "stream": "s2s-s-" + uuid.uuid4().hex}
"""A token per mode: the batch destinations take one, the stream destinations the other."""
KEY = "eventn_ctx_event_id"
DESTS = {"bk": ("batch", True), "bu": ("batch", False), "sk": ("stream", True), "su": ("stream", False)}
"""Destination id → (mode, keyed on the event id)."""
GOOD = 4
BAD = 6


@pytest.fixture(scope="module")
def warehouse() -> Iterator[dict[str, Any]]:
    """A login role of the module's own and a schema name per destination; dropped afterwards."""
    tag = uuid.uuid4().hex[:10]
    role = f"h1_{tag}"
    schemas = {dest_id: f"r_{dest_id}_{tag}" for dest_id in DESTS}
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute(f'GRANT CREATE ON DATABASE "{PG_DB}" TO "{role}"')
    yield {"role": role, "schemas": schemas}
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        for schema in schemas.values():
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f'REVOKE ALL ON DATABASE "{PG_DB}" FROM "{role}"')
        conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def sql(statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        cursor = conn.execute(statement)
        return cursor.fetchall() if cursor.description else []


def config_of(warehouse: dict[str, Any], events_dir: Path) -> dict[str, Any]:
    destinations = {}
    for dest_id, (mode, keyed) in DESTS.items():
        ds = {"host": PG_HOST, "port": PG_PORT, "db": PG_DB, "schema": warehouse["schemas"][dest_id]}
        layout = {"table_name_template": "events", **({"primary_key_fields": [KEY]} if keyed else {})}
        destinations[dest_id] = {
            "type": "postgres",
            "mode": mode,
            "datasource": {**ds, "username": warehouse["role"]},
            "data_layout": layout,
            "only_tokens": [mode],
        }
    return {
        "server": {"admin_token": ADMIN, "name": "replay-node"},
        "api_keys": [{"id": mode, "server_secret": secret} for mode, secret in SECRETS.items()],
        "log": {"path": str(events_dir), "rotation_min": 60, "uploader_period_sec": 3600},
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        "stream": {"batch_wait_ms": 20, "retry_min_sec": 0.2, "retry_max_sec": 1.0, "poll_ms": 5},
        "destinations": destinations,
    }


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, warehouse: dict[str, Any]) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("replay")
    server = start_server(directory, config_of(warehouse, directory / "events"))
    server.config_path = directory / "eventspark.json"  # type: ignore[attr-defined]
    yield server
    server.stop()
    assert "Traceback" not in server.text(), server.text()[-3000:]


def send(
    server: Server, prefix: str, count: int, amount: Any, modes: tuple[str, ...] = ("batch", "stream")
) -> list[str]:
    ids = [f"{prefix}-{n}" for n in range(count)]
    for mode in modes:
        for event_id in ids:
            event = {"event_type": "purchase", "amount": amount, "eventn_ctx": {"event_id": event_id}}
            params = {"token": SECRETS[mode]}
            answer = httpx.post(f"{server.url}/api/v1/s2s/event", params=params, json=event, timeout=10)
            assert answer.status_code == 200, answer.text
    return ids


def admin(server: Server, method: str, path: str, **kwargs: Any) -> httpx.Response:
    if method == "POST":  # a loaded machine may need more than the default minute for a first pass
        kwargs.setdefault("params", {"wait": 500})
    return httpx.request(method, f"{server.url}{path}", headers={"X-Admin-Token": ADMIN}, timeout=600, **kwargs)


def stored_ids(warehouse: dict[str, Any], dest_id: str) -> list[str]:
    schema = warehouse["schemas"][dest_id]
    rows = sql(f'SELECT {KEY} FROM "{schema}".events ORDER BY 1')
    return [row[0] for row in rows]


def wait_for(check: Any, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def table_exists(warehouse: dict[str, Any], dest_id: str) -> bool:
    schema = warehouse["schemas"][dest_id]
    return bool(
        sql(f"SELECT 1 FROM information_schema.tables WHERE table_schema = '{schema}' AND table_name = 'events'")
    )


def cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    config = str(server.config_path)  # type: ignore[attr-defined]
    return subprocess.run(
        [str(EVENTSPARK), *args, "-c", config], capture_output=True, text=True, timeout=600, check=False
    )


# --- the scenario, in order: the tests share the server and its warehouse -------------------------


def test_batch_run_loads_fresh_events_without_waiting_for_the_period(node: Server, warehouse: dict[str, Any]) -> None:
    good = send(node, "good", GOOD, 1)
    answer = admin(node, "POST", "/api/v1/batch/run")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "ok", body
    loaded = {(p["destination_id"], p["table"]): p["rows"] for p in body["pairs"]}
    assert loaded == {("bk", "events"): GOOD, ("bu", "events"): GOOD}
    assert stored_ids(warehouse, "bk") == stored_ids(warehouse, "bu") == sorted(good)
    wait_for(lambda: table_exists(warehouse, "sk") and table_exists(warehouse, "su"))
    wait_for(lambda: len(stored_ids(warehouse, "sk")) == len(stored_ids(warehouse, "su")) == GOOD)
    state = admin(node, "GET", "/api/v1/batch/run", params={"request_id": body["request_id"]})
    assert state.status_code == 200 and state.json()["status"] == "ok"
    assert admin(node, "GET", "/api/v1/batch/run", params={"request_id": "0" * 32}).status_code == 404
    assert admin(node, "GET", "/api/v1/batch/run", params={"request_id": "../x"}).status_code == 400


def test_failures_are_listed(node: Server, warehouse: dict[str, Any]) -> None:
    role = warehouse["role"]
    for dest_id in ("sk", "su"):
        sql(f'REVOKE INSERT ON "{warehouse["schemas"][dest_id]}".events FROM "{role}"')
    send(node, "bad", BAD, "not a number", ("batch",))  # does not fit the bigint column
    send(node, "bad", BAD, 2, ("stream",))  # fits, but INSERT is revoked
    answer = admin(node, "POST", "/api/v1/batch/run")
    assert answer.status_code == 200, answer.text
    failed_dir = node.events_dir / "failed"
    wait_for(lambda: all(_lines(failed_dir / f"failed.dst={d}.log") == BAD for d in DESTS))
    listing = admin(node, "GET", "/api/v1/fallback").json()["files"]
    assert sorted((f["file_name"], f["destination_id"], f["events"], f["replayed"]) for f in listing) == [
        (f"failed.dst={d}.log", d, BAD, False) for d in sorted(DESTS)
    ]
    assert all(f["tables_statuses"] == {} for f in listing)
    some = admin(node, "GET", "/api/v1/fallback", params={"destination_ids": "bk,su"}).json()["files"]
    assert sorted(f["destination_id"] for f in some) == ["bk", "su"]
    assert admin(node, "GET", "/api/v1/fallback", params={"token": "wrong"}).status_code == 401


def _lines(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.exists() else 0


def test_failed_command_groups_reasons(node: Server) -> None:
    result = cli(node, "failed")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"failed.dst=bk.log  destination=bk  events={BAD}  bytes=" in result.stdout
    assert f"{4 * BAD} failed event(s) in 4 file(s)" in result.stdout
    # The six refusals of a destination are one reason with a count, not six lines.
    assert any(line.startswith(f"  {BAD} × ") and "permission denied" in line for line in lines), result.stdout
    assert any(line.startswith(f"  {BAD} × ") and "does not fit" in line for line in lines), result.stdout
    only = cli(node, "failed", "--destination", "su")
    assert "failed.dst=su.log" in only.stdout and "failed.dst=bk.log" not in only.stdout


def test_dry_run_changes_nothing(node: Server) -> None:
    before = sorted(p.name for p in (node.events_dir / "failed").iterdir())
    result = cli(node, "replay", "failed.dst=bk.log", "failed.dst=su.log", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"would replay {BAD} event(s) of failed/failed.dst=bk.log into bk (batch)" in result.stdout
    assert f"would replay {BAD} event(s) of failed/failed.dst=su.log into su (stream)" in result.stdout
    assert sorted(p.name for p in (node.events_dir / "failed").iterdir()) == before
    assert not list(node.incoming.glob("replay.dst=*"))


def test_bad_file_names(node: Server) -> None:
    for name, status in [
        ("../incoming/.server.lock", 400),
        ("/etc/passwd", 400),
        ("failed/../../etc/passwd", 400),
        ("archive/../failed/failed.dst=bk.log", 400),
        ("pending/x/manifest.json", 400),
        ("failed.dst=bk.log\x00", 400),
        ("a\\b", 400),
        ("", 400),
        ("x" * 600, 400),
        ("failed.dst=nothing.log", 404),
        ("archive/2020-01-01/incoming.tok=web-2020-01-01T00-00-00.000.log.gz", 404),
    ]:
        answer = admin(node, "POST", "/api/v1/replay", json={"file_name": name})
        assert answer.status_code == status, (name, answer.text)
        assert set(answer.json()) == {"message", "error"}
    bad_bodies = [b"[1]", b"{", b'{"file_name": 3}', b'{"file_name": "failed.dst=bk.log", "file_format": "csv"}']
    for body in bad_bodies:
        assert admin(node, "POST", "/api/v1/replay", content=body).status_code == 400, body
    answer = admin(node, "POST", "/api/v1/replay", json={"file_name": "failed.dst=bk.log", "destination_id": "nope"})
    assert answer.status_code == 400 and "Unknown destination" in answer.text


def test_replay_after_the_fix_restores_every_failed_event_once(node: Server, warehouse: dict[str, Any]) -> None:
    for dest_id in ("bk", "bu"):
        schema = warehouse["schemas"][dest_id]
        sql(f'ALTER TABLE "{schema}".events ALTER COLUMN amount TYPE text USING amount::text')
    for dest_id in ("sk", "su"):
        sql(f'GRANT INSERT ON "{warehouse["schemas"][dest_id]}".events TO "{warehouse["role"]}"')
    bad = {f"bad-{n}" for n in range(BAD)}
    good = {f"good-{n}" for n in range(GOOD)}
    for dest_id, (mode, _keyed) in DESTS.items():
        answer = admin(node, "POST", "/api/v1/replay", json={"file_name": f"failed.dst={dest_id}.log"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["status"] == "ok" and body["events"] == BAD and body["unreadable"] == 0
        assert body["destinations"][dest_id]["events"] == BAD
        if mode == "batch":
            assert body["pass"]["status"] == "ok", body
            assert {(p["destination_id"], p["table"], p["rows"]) for p in body["pass"]["pairs"]} == {
                (dest_id, "events", BAD)
            }
    for dest_id in DESTS:
        wait_for(lambda d=dest_id: len(stored_ids(warehouse, d)) == GOOD + BAD)
        assert stored_ids(warehouse, dest_id) == sorted(good | bad)
    listing = admin(node, "GET", "/api/v1/fallback").json()["files"]
    assert all(f["replayed"] for f in listing), listing  # nothing failed remains
    statuses = {f["destination_id"]: f["tables_statuses"] for f in listing}
    assert statuses["bk"] == statuses["bu"] == {"events": {"uploaded": True, "error": ""}}
    assert not (node.events_dir / "failed" / "failed.dst=bk.log").exists()


def test_a_second_replay_duplicates_nothing(node: Server, warehouse: dict[str, Any]) -> None:
    again = admin(node, "POST", "/api/v1/replay", json={"file_name": "failed.dst=bk.log"})
    assert again.status_code == 409, again.text
    listing = admin(node, "GET", "/api/v1/fallback").json()["files"]
    moved = {f["destination_id"]: f["file_name"] for f in listing}
    for dest_id in DESTS:
        answer = admin(node, "POST", "/api/v1/replay", json={"file_name": moved[dest_id]})
        assert answer.status_code == 409 and "Already replayed" in answer.text, answer.text
    # Forced, into the keyed destinations: the upsert keeps one row per event.
    for dest_id in ("bk", "sk"):
        answer = admin(node, "POST", "/api/v1/replay", json={"file_name": moved[dest_id], "force": True})
        assert answer.status_code == 200, answer.text
    wait_for(lambda: _stream_idle(node, "sk"))
    for dest_id in DESTS:
        ids = stored_ids(warehouse, dest_id)
        assert len(ids) == len(set(ids)) == GOOD + BAD, (dest_id, ids)
    assert not (node.events_dir / "failed" / "failed.dst=sk.log").exists()


def _stream_idle(server: Server, dest_id: str) -> bool:
    from eventspark.stream.queue import queue_dir
    from tests.stream.warehouses import queued_bytes

    return queued_bytes(queue_dir(server.events_dir, dest_id)) == 0


def test_archived_log_replay_into_a_keyed_destination(node: Server, warehouse: dict[str, Any]) -> None:
    archived = sorted((node.events_dir / "archive").glob("*/incoming.tok=batch*.log.gz"))
    assert archived, "the first pass archived its log"
    name = "archive/" + "/".join(archived[0].parts[-2:])
    answer = admin(node, "POST", "/api/v1/replay", json={"file_name": name, "destination_id": "bk"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["events"] == GOOD
    assert answer.json()["pass"]["status"] == "ok"
    ids = stored_ids(warehouse, "bk")
    assert len(ids) == len(set(ids)) == GOOD + BAD
    again = admin(node, "POST", "/api/v1/replay", json={"file_name": name, "destination_id": "bk"})
    assert again.status_code == 409, again.text


def test_process_while_serving_loads_through_the_node(node: Server, warehouse: dict[str, Any]) -> None:
    fresh = send(node, "fresh", 2, 7, ("batch",))
    result = cli(node, "process")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "a node serves this directory" in result.stdout
    assert "nothing to load" not in result.stdout
    assert "bk" in result.stdout and "OK" in result.stdout
    assert set(fresh) <= set(stored_ids(warehouse, "bk"))
    assert set(fresh) <= set(stored_ids(warehouse, "bu"))
