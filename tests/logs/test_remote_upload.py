"""Collector nodes upload their rotated logs to `log.remote` (eventspark.logs.upload): on moto's S3
server (tests/emulators/s3.py) and on file:// in tmp_path."""

from __future__ import annotations

import asyncio
import fcntl
import gzip
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from eventspark.collector.app import CollectorApp
from eventspark.config.models import Config, RemoteLogs
from eventspark.logs import upload
from eventspark.logs.incoming import LogName, live_log_name, parse_log_name, rotated_log_name, with_node
from eventspark.logs.remote import remote_filesystem
from eventspark.logs.replay import replay_log_name
from eventspark.logs.rotated import rotated_token
from eventspark.logs.upload import upload_log, upload_rotated
from tests.destinations.conftest import free_port
from tests.emulators.s3 import S3_KEY_ID, S3_SECRET, s3_client

AT = datetime(2026, 11, 22, 10, 0, 0, 123000, tzinfo=UTC)


def s3_remote(endpoint: str, bucket: str) -> dict[str, Any]:
    # One attempt per request: a store that is down fails fast (the upload's own retries remain).
    return {
        "url": f"s3://{bucket}/events",
        "storage_options": {
            "key": S3_KEY_ID,
            "secret": S3_SECRET,
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
            "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2},
        },
    }


def make_config(tmp_path: Path, remote: dict[str, Any] | None, **log: Any) -> Config:
    return Config.model_validate(
        {
            "server": {"name": "node-a"},
            "api_keys": [{"id": "web", "client_secret": "js", "server_secret": "s2s"}],
            "log": {"path": str(tmp_path / "events"), "remote": remote, **log},
            "destinations": {"dw": {"type": "duckdb"}},
        }
    )


def write_log(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / "events" / "incoming" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def remote_objects(endpoint: str, bucket: str) -> dict[str, bytes]:
    client = s3_client(endpoint)
    listed = client.list_objects_v2(Bucket=bucket).get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed}


# --- names ------------------------------------------------------------------------------------------


def test_two_nodes_rotating_one_token_in_one_millisecond_get_different_names() -> None:
    local = rotated_log_name("web", AT)
    names = {with_node(local, "node-a"), with_node(local, "node-b")}
    assert len(names) == 2
    for name, node in zip(sorted(names), ["node-a", "node-b"], strict=True):
        assert parse_log_name(name) == LogName("web", None, AT, node)
        assert rotated_token(name) == "web"
    # Workers and odd characters: the node is quoted like token ids and parses back.
    name = rotated_log_name("t|x", AT, worker=3, node="n/1|%")
    assert parse_log_name(name) == LogName("t|x", 3, AT, "n/1|%")
    assert (
        with_node(rotated_log_name("web", AT, worker=2), "a-b")
        == "incoming.tok=web|n=a-b|w=2-2026-11-22T10-00-00.123.log"
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("incoming.tok=web.log", LogName("web")),
        ("incoming.tok=web|w=2.log", LogName("web", 2)),
        ("incoming.tok=web-2026-11-22T10-00-00.123.log", LogName("web", None, AT)),
        ("incoming.tok=web|w=1-2026-11-22T10-00-00.123.log", LogName("web", 1, AT)),
        ("incoming.tok=a-b-2026-11-22T10-00-00.log", LogName("a-b", None, AT.replace(microsecond=0))),
        ("incoming.tok=x-2026-11-22T10-00-00.1234.log", LogName("x", None, AT.replace(microsecond=123400))),
        ("incoming.tok=t%7Cx-2026-11-22T10-00-00.123.log", LogName("t|x", None, AT)),
        ("incoming.tok=web-2026-11-22T10-00-00.123.log.status", None),
        ("replay.dst=dw-2026-11-22T10-00-00.123-0123abcd.log", None),
    ],
)
def test_names_without_a_node_parse_as_before(name: str, expected: LogName | None) -> None:
    assert parse_log_name(name) == expected


def test_only_rotated_logs_get_a_node() -> None:
    assert with_node(live_log_name("web"), "n") is None
    assert with_node("incoming.tok=web-2026-11-22T10-00-00.123.log.status", "n") is None
    named = "incoming.tok=web|n=a-2026-11-22T10-00-00.123.log"
    assert with_node(named, "b") == named  # never two nodes


def test_remote_url_needs_a_protocol() -> None:
    with pytest.raises(ValueError, match="protocol"):
        RemoteLogs(url="bucket/prefix")
    assert RemoteLogs(url="s3://bucket/prefix/").url == "s3://bucket/prefix"
    with pytest.raises(ValueError, match="glob"):  # every key under it would be a pattern to fsspec
        RemoteLogs(url="s3://bucket/events[1]")


def test_a_url_with_credentials_is_shown_without_them(tmp_path: Path) -> None:
    # Review: the URL went as written into lock keys, errors, status output and logs.
    from eventspark.batch.process import PassBusy, remote_pass_lock
    from eventspark.commands.status import read_store
    from eventspark.coordination import MemoryCoordination
    from eventspark.logs.store import RemoteReader, remote_lock_name

    remote = RemoteLogs(url="sftp://user:s3cr3t@files.example:2222/events")
    assert remote.shown_url == "sftp://files.example:2222/events"
    assert remote_lock_name(remote) == "batch-pass:sftp://files.example:2222/events"
    assert RemoteLogs(url="s3://bucket/a@b").shown_url == "s3://bucket/a@b"  # an `@` in the path stays
    coordination = MemoryCoordination("node-a")
    with (
        coordination.lock(remote_lock_name(remote)),
        pytest.raises(PassBusy) as busy,
        remote_pass_lock(coordination, remote),
    ):
        pass
    dead = {"url": "sftp://user:s3cr3t@127.0.0.1:1/events", "storage_options": {"timeout": 1}}
    backlog = read_store(make_config(tmp_path, dead), timeout=10).to_json()
    shown = [str(busy.value), repr(remote), str(remote), repr(RemoteReader(remote.url)), orjson.dumps(backlog).decode()]
    assert backlog["url"] == "sftp://127.0.0.1:1/events" and backlog["error"]
    for text in shown:
        assert "s3cr3t" not in text and "user" not in text, text


# --- uploads ----------------------------------------------------------------------------------------


def test_upload_to_s3_verifies_and_removes_the_local_logs(tmp_path: Path, moto_s3: str, s3_bucket: str) -> None:
    config = make_config(tmp_path, s3_remote(moto_s3, s3_bucket))
    rotated = write_log(tmp_path, rotated_log_name("web", AT), b'{"n":1}\n{"n":2}\n')
    replay = write_log(tmp_path, replay_log_name("dw", AT, "0123abcd"), b'{"n":3}\n')
    live = write_log(tmp_path, live_log_name("web"), b'{"n":4}\n')
    stray = write_log(tmp_path, "notes.txt", b"not a log")

    uploaded = upload_rotated(config)

    remote_name = "incoming.tok=web|n=node-a-2026-11-22T10-00-00.123.log"
    assert sorted(uploaded) == sorted([remote_name, replay.name])
    assert remote_objects(moto_s3, s3_bucket) == {
        f"events/incoming/{remote_name}": b'{"n":1}\n{"n":2}\n',
        f"events/incoming/{replay.name}": b'{"n":3}\n',
    }
    assert not rotated.exists() and not replay.exists()
    assert live.exists() and stray.exists()  # live logs and strays are never uploaded
    assert upload_rotated(config) == []


def test_upload_to_a_local_folder_goes_through_a_temporary_name(tmp_path: Path) -> None:
    remote_dir = tmp_path / "remote"
    config = make_config(tmp_path, {"url": remote_dir.as_uri()})
    rotated = write_log(tmp_path, rotated_log_name("web", AT, worker=1), b'{"n":1}\n')

    [name] = upload_rotated(config)

    assert (remote_dir / "incoming" / name).read_bytes() == b'{"n":1}\n'
    assert parse_log_name(name) == LogName("web", 1, AT, "node-a")
    assert not rotated.exists()
    assert list((remote_dir / "incoming" / ".tmp").iterdir()) == []  # moved, not left behind


def test_a_down_store_keeps_the_log_until_the_next_call(tmp_path: Path, moto_s3: str, s3_bucket: str) -> None:
    down = make_config(tmp_path, s3_remote(f"http://127.0.0.1:{free_port()}", s3_bucket))
    logs = [write_log(tmp_path, rotated_log_name("web", AT, worker=n), b'{"n":%d}\n' % n) for n in range(3)]

    started = time.monotonic()
    assert upload_rotated(down) == []
    assert time.monotonic() - started < 30  # two logs fail, the third is not tried: bounded
    assert all(path.exists() for path in logs)

    up = make_config(tmp_path, s3_remote(moto_s3, s3_bucket))
    assert len(upload_rotated(up)) == 3
    assert upload_rotated(up) == []
    objects = remote_objects(moto_s3, s3_bucket)
    assert sorted(objects.values()) == [b'{"n":0}\n', b'{"n":1}\n', b'{"n":2}\n']  # each once
    assert not any(path.exists() for path in logs)


def test_a_big_log_goes_up_in_parts_byte_identical(tmp_path: Path, moto_s3: str, s3_bucket: str) -> None:
    line = orjson.dumps({"event": "x" * 200}) + b"\n"
    data = line * (12 * 2**20 // len(line) + 1)  # 12 MiB: three parts of 5 MiB at most
    path = write_log(tmp_path, rotated_log_name("web", AT), data)
    remote = RemoteLogs.model_validate(s3_remote(moto_s3, s3_bucket))
    fs, root = remote_filesystem(remote)

    name = upload_log(fs, root, path, "node-a", part_size=5 * 2**20)

    head = s3_client(moto_s3).head_object(Bucket=s3_bucket, Key=f"events/incoming/{name}")
    assert head["ETag"].strip('"').endswith("-3")  # multipart, the ETag verified as computed locally
    assert remote_objects(moto_s3, s3_bucket)[f"events/incoming/{name}"] == data
    assert not path.exists()

    # The same log again (a crash before its removal) with another part size: the ETag says
    # nothing then, the object is read back, found identical, and not uploaded twice.
    write_log(tmp_path, path.name, data)
    assert upload_log(fs, root, path, "node-a", part_size=6 * 2**20) == name
    assert len(remote_objects(moto_s3, s3_bucket)) == 1
    assert not path.exists()


def test_a_crash_before_the_local_removal_uploads_nothing_twice(tmp_path: Path, moto_s3: str, s3_bucket: str) -> None:
    config = make_config(tmp_path, s3_remote(moto_s3, s3_bucket))
    path = write_log(tmp_path, rotated_log_name("web", AT), b'{"n":1}\n')
    [name] = upload_rotated(config)
    write_log(tmp_path, path.name, b'{"n":1}\n')  # as if the process died before removing it

    assert upload_rotated(config) == [name]
    assert len(remote_objects(moto_s3, s3_bucket)) == 1
    assert not path.exists()


def test_a_name_taken_with_other_content_moves_a_millisecond_on(tmp_path: Path, moto_s3: str, s3_bucket: str) -> None:
    config = make_config(tmp_path, s3_remote(moto_s3, s3_bucket))
    taken = "incoming.tok=web|n=node-a-2026-11-22T10-00-00.123.log"
    s3_client(moto_s3).put_object(Bucket=s3_bucket, Key=f"events/incoming/{taken}", Body=b'{"other":1}\n')
    write_log(tmp_path, rotated_log_name("web", AT), b'{"n":1}\n')

    assert upload_rotated(config) == ["incoming.tok=web|n=node-a-2026-11-22T10-00-00.124.log"]
    assert remote_objects(moto_s3, s3_bucket)[f"events/incoming/{taken}"] == b'{"other":1}\n'


def test_a_log_with_a_local_status_keeps_its_name(tmp_path: Path, moto_s3: str, s3_bucket: str) -> None:
    config = make_config(tmp_path, s3_remote(moto_s3, s3_bucket))
    path = write_log(tmp_path, rotated_log_name("web", AT), b'{"n":1}\n')
    body = b'{"dw":{"events":{"uploaded":true,"error":""}}}'
    status = write_log(tmp_path, path.name + ".status", body)

    assert upload_rotated(config) == [path.name]  # its load markers name it so
    assert remote_objects(moto_s3, s3_bucket) == {
        f"events/incoming/{path.name}": b'{"n":1}\n',
        f"events/incoming/{path.name}.status": body,
    }
    assert not path.exists() and not status.exists()


def test_a_crash_before_the_local_removal_keeps_the_newer_remote_status(
    tmp_path: Path, moto_s3: str, s3_bucket: str
) -> None:
    # Review: the local status went up again over the one a pass had written since, which made
    # that pass's destinations load the log a second time.
    config = make_config(tmp_path, s3_remote(moto_s3, s3_bucket))
    path = write_log(tmp_path, rotated_log_name("web", AT), b'{"n":1}\n')
    old = b'{"dw":{"events":{"uploaded":false,"error":"down"}}}'
    write_log(tmp_path, path.name + ".status", old)
    assert upload_rotated(config) == [path.name]
    newer = b'{"dw":{"events":{"uploaded":true,"error":""}}}'  # a pass on another node loaded it since
    s3_client(moto_s3).put_object(Bucket=s3_bucket, Key=f"events/incoming/{path.name}.status", Body=newer)
    write_log(tmp_path, path.name, b'{"n":1}\n')  # as if the process died before removing them
    status = write_log(tmp_path, path.name + ".status", old)

    assert upload_rotated(config) == [path.name]
    assert remote_objects(moto_s3, s3_bucket)[f"events/incoming/{path.name}.status"] == newer
    assert not path.exists() and not status.exists()


class Crash(BaseException):
    """The process dying at a given point (not an error the upload's retries catch)."""


def test_a_log_archived_while_its_node_was_down_does_not_go_up_again(
    tmp_path: Path, moto_s3: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review: a node dying between the verified upload and the local removal, then a pass on
    # another node loading and archiving the log (its status removed), made the next call put the
    # log up again under its name: a pass would read it once more, as new.
    config = make_config(tmp_path, s3_remote(moto_s3, s3_bucket))
    path = write_log(tmp_path, rotated_log_name("web", AT), b'{"n":1}\n')
    real_unlink = os.unlink

    def dying_unlink(target: Any, *args: Any, **kwargs: Any) -> None:
        if Path(target) == path:
            raise Crash
        real_unlink(target, *args, **kwargs)

    monkeypatch.setattr(upload.os, "unlink", dying_unlink)
    with pytest.raises(Crash):
        upload_rotated(config)
    monkeypatch.undo()
    client = s3_client(moto_s3)
    (key,) = remote_objects(moto_s3, s3_bucket)
    name = key.rsplit("/", 1)[-1]
    archive = gzip.compress(b'{"n":1}\n')
    client.put_object(Bucket=s3_bucket, Key=f"events/archive/2026-11-23/{name}.gz", Body=archive)  # the pass
    client.delete_object(Bucket=s3_bucket, Key=key)

    assert upload_rotated(config) == []
    assert list(remote_objects(moto_s3, s3_bucket)) == [f"events/archive/2026-11-23/{name}.gz"]
    assert not path.exists() and os.listdir(path.parent) == [upload.LOCK_FILE]


def test_a_log_whose_upload_died_midway_goes_up_on_the_next_call(
    tmp_path: Path, moto_s3: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(tmp_path, s3_remote(moto_s3, s3_bucket))
    path = write_log(tmp_path, rotated_log_name("web", AT), b'{"n":1}\n')

    def dying_put(*args: Any, **kwargs: Any) -> None:
        raise Crash

    monkeypatch.setattr(upload, "_put", dying_put)
    with pytest.raises(Crash):
        upload_rotated(config)
    monkeypatch.undo()

    (name,) = upload_rotated(config)
    assert remote_objects(moto_s3, s3_bucket) == {f"events/incoming/{name}": b'{"n":1}\n'}
    assert not path.exists() and os.listdir(path.parent) == [upload.LOCK_FILE]


TAKEN = "incoming.tok=web|n=node-a-2026-11-22T10-00-00.123.log"


def name_taken(tmp_path: Path, moto_s3: str, s3_bucket: str) -> tuple[Any, Any, str, Path]:
    """A rotated log whose remote name another node's log (other content) holds already: the
    config, an S3 client, that name, and the local log."""
    config = make_config(tmp_path, s3_remote(moto_s3, s3_bucket))
    client = s3_client(moto_s3)
    client.put_object(Bucket=s3_bucket, Key=f"events/incoming/{TAKEN}", Body=b'{"other":1}\n')
    path = write_log(tmp_path, rotated_log_name("web", AT), b'{"n":1}\n')
    return config, client, TAKEN, path


def test_a_log_that_moved_to_a_later_name_is_not_taken_for_the_archived_one(
    tmp_path: Path, moto_s3: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review: two nodes sharing a server.name. This node's log finds its name taken by the other
    # node's log (other content) and goes for a millisecond later, where every put fails. A pass
    # then archives the other node's log; the next call looked for the log under its first name,
    # found that one archived and removed the local log, which was never uploaded.
    config, client, taken, path = name_taken(tmp_path, moto_s3, s3_bucket)
    monkeypatch.setattr(upload, "BACKOFF_SEC", 0.01)

    def failing_put(*args: Any, **kwargs: Any) -> None:
        raise OSError("store down")

    monkeypatch.setattr(upload, "_put", failing_put)
    assert upload_rotated(config) == []
    monkeypatch.undo()
    assert path.exists()
    other = gzip.compress(b'{"other":1}\n')
    client.put_object(Bucket=s3_bucket, Key=f"events/archive/2026-11-22/{taken}.gz", Body=other)
    client.delete_object(Bucket=s3_bucket, Key=f"events/incoming/{taken}")  # the pass archived the other log

    moved = "incoming.tok=web|n=node-a-2026-11-22T10-00-00.124.log"
    assert upload_rotated(config) == [moved]
    assert remote_objects(moto_s3, s3_bucket)[f"events/incoming/{moved}"] == b'{"n":1}\n'
    assert not path.exists() and os.listdir(path.parent) == [upload.LOCK_FILE]


def test_a_log_archived_under_its_later_name_is_found_there(
    tmp_path: Path, moto_s3: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The journal names the object the log went up as (a millisecond on), and only that one.
    config, client, _taken, path = name_taken(tmp_path, moto_s3, s3_bucket)
    real_unlink = os.unlink

    def dying_unlink(target: Any, *args: Any, **kwargs: Any) -> None:
        if Path(target) == path:
            raise Crash
        real_unlink(target, *args, **kwargs)

    monkeypatch.setattr(upload.os, "unlink", dying_unlink)
    with pytest.raises(Crash):
        upload_rotated(config)
    monkeypatch.undo()
    moved = "incoming.tok=web|n=node-a-2026-11-22T10-00-00.124.log"
    assert (path.parent / f".{path.name}.uploading").read_text() == moved + "\n"
    client.put_object(Bucket=s3_bucket, Key=f"events/archive/2026-11-22/{moved}.gz", Body=gzip.compress(b'{"n":1}\n'))
    client.delete_object(Bucket=s3_bucket, Key=f"events/incoming/{moved}")  # a pass loaded it

    assert upload_rotated(config) == []
    assert f"events/incoming/{moved}" not in remote_objects(moto_s3, s3_bucket)
    assert not path.exists() and os.listdir(path.parent) == [upload.LOCK_FILE]


def test_a_journal_without_a_name_removes_the_log_only_when_the_archive_holds_its_bytes(
    tmp_path: Path, moto_s3: str, s3_bucket: str
) -> None:
    # A journal left by an older version (empty): the name it went up under is unknown, so an
    # archive under the log's own name is taken for it only when it holds the same bytes.
    config = make_config(tmp_path, s3_remote(moto_s3, s3_bucket))
    client = s3_client(moto_s3)
    name = "incoming.tok=web|n=node-a-2026-11-22T10-00-00.123.log"
    path = write_log(tmp_path, rotated_log_name("web", AT), b'{"n":1}\n')
    write_log(tmp_path, f".{path.name}.uploading", b"")
    other = gzip.compress(b'{"other":1}\n')
    client.put_object(Bucket=s3_bucket, Key=f"events/archive/2026-11-22/{name}.gz", Body=other)

    assert upload_rotated(config) == [name]  # another log's archive: this one goes up
    assert remote_objects(moto_s3, s3_bucket)[f"events/incoming/{name}"] == b'{"n":1}\n'
    assert not path.exists()


def test_another_uploading_process_is_waited_for_then_given_up_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(tmp_path, {"url": (tmp_path / "remote").as_uri()})
    path = write_log(tmp_path, rotated_log_name("web", AT), b'{"n":1}\n')
    monkeypatch.setattr(upload, "LOCK_WAIT_SEC", 0.3)
    fd = os.open(path.parent / upload.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert upload_rotated(config) == []
        assert path.exists()
    finally:
        os.close(fd)
    assert len(upload_rotated(config)) == 1


def test_without_log_remote_nothing_is_uploaded(tmp_path: Path) -> None:
    path = write_log(tmp_path, rotated_log_name("web", AT), b'{"n":1}\n')
    assert upload_rotated(make_config(tmp_path, None)) == []
    assert path.exists()


# --- the collector ----------------------------------------------------------------------------------


def test_the_collector_uploads_what_it_rotates(tmp_path: Path, moto_s3: str, s3_bucket: str) -> None:
    app = CollectorApp(make_config(tmp_path, s3_remote(moto_s3, s3_bucket), rotation_min=0.002))
    incoming = tmp_path / "events" / "incoming"

    async def main() -> dict[str, bytes]:
        app.open()
        app.start_rotation()
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://collector") as client:
                for n in range(3):
                    response = await client.post("/api/v1/s2s/event?token=s2s", json={"n": n})
                    assert response.status_code == 200
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # rotation, then the upload in its thread
                objects = await asyncio.to_thread(remote_objects, moto_s3, s3_bucket)
                # A rotation may fall between two posts: wait for every event, in one log or more.
                uploaded = sum(len(body.splitlines()) for body in objects.values())
                if uploaded >= 3 and not [p for p in incoming.glob("*.log") if parse_log_name(p.name).rotated_at]:
                    return objects
                await asyncio.sleep(0.1)
            pytest.fail("no upload within 20 s")
        finally:
            app.close()

    objects = asyncio.run(main())
    events = [orjson.loads(line) for body in objects.values() for line in body.splitlines()]
    assert sorted(e["n"] for e in events) == [0, 1, 2]
    assert all(parse_log_name(key.rsplit("/", 1)[1]).node == "node-a" for key in objects)
    assert [p.name for p in incoming.glob("*.log")] == []


@pytest.mark.parametrize("hidden", ["s3fs", "fsspec"])
def test_check_names_the_extra_when_the_store_package_is_missing(tmp_path: Path, hidden: str) -> None:
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / f"{hidden}.py").write_text(f'raise ModuleNotFoundError("{hidden} hidden", name="{hidden}")\n')
    config = tmp_path / "config.yaml"
    config.write_text(
        "api_keys: [{id: web, client_secret: js}]\n"
        f"log: {{path: {tmp_path / 'events'}, remote: {{url: 's3://bucket/events'}}}}\n"
        "destinations: {dw: {type: duckdb}}\n"
        "coordination: {type: inmemory}\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocked), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", "from eventspark.cli import app; app()", "check", "-c", str(config)],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert b"eventspark[remote-s3]" in result.stderr
    assert hidden.encode() in result.stderr


def test_serve_with_workers_uploads_at_shutdown(tmp_path: Path, moto_s3: str, s3_bucket: str) -> None:
    from tests.collector.conftest import start_server

    config = {
        "server": {"name": "node-b", "workers": 2},
        "api_keys": [{"id": "web", "client_secret": "js", "server_secret": "s2s"}],
        "log": {"remote": s3_remote(moto_s3, s3_bucket), "rotation_min": 60, "uploader_period_sec": 3600},
        "coordination": {"type": "inmemory"},  # one node
        "destinations": {"dw": {"type": "duckdb"}},
    }
    server = start_server(tmp_path, config)
    try:
        for n in range(20):
            response = httpx.post(f"{server.url}/api/v1/s2s/event?token=s2s", json={"n": n}, timeout=10)
            assert response.status_code == 200
    finally:
        assert server.stop() == 0, server.text()

    objects = remote_objects(moto_s3, s3_bucket)
    events = [orjson.loads(line) for body in objects.values() for line in body.splitlines()]
    assert sorted(e["n"] for e in events) == list(range(20))  # each once
    assert {parse_log_name(key.rsplit("/", 1)[1]).node for key in objects} == {"node-b"}
    assert [p.name for p in server.incoming.glob("*.log")] == []


def test_remote_names_have_no_glob_characters() -> None:
    # fsspec reads `*`, `?` and `[` in paths as globs: a pass ignores names holding them.
    local = rotated_log_name("we*b[1]?", AT)
    remote = with_node(local, "node*[a]")
    assert remote is not None and not any(char in remote for char in "*?[")
    assert parse_log_name(remote) == LogName("we*b[1]?", None, AT, "node*[a]")
    assert rotated_log_name("we*b[1]?", AT, node="node*[a]") == remote
