"""Retention on the store of `log.remote` (`eventspark.logs.remote_retention`): the shared archive
and this node's failed copies, on moto's S3 server and on `file://` stores in a temporary folder."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventspark.config.models import LogConfig, RemoteLogs
from eventspark.logs import remote_retention
from eventspark.logs.remote import remote_filesystem
from eventspark.logs.remote_retention import PENDING_FILE, remote_archive_retention
from eventspark.logs.retention import GIB, Retention, apply_retention
from tests.emulators.s3 import S3_KEY_ID, S3_REGION, S3_SECRET

pytestmark = pytest.mark.timeout(120)

DAY = 86400.0


def later() -> float:
    """ "now" for the policy: what the test just put is not "written in the last minute". Taken
    when the test runs, not when the module is imported: a suite of half an hour ran these tests
    20 minutes after their import, when an import-time "now" was older than what they put."""
    return time.time() + 600


INCOMING_LOG = "incoming/incoming.tok=web|n=node-a-2020-01-01T00-00-00.000.log"


def s3_remote(endpoint: str, bucket: str, **config: Any) -> RemoteLogs:
    options = {
        "key": S3_KEY_ID,
        "secret": S3_SECRET,
        "client_kwargs": {"endpoint_url": endpoint, "region_name": S3_REGION},
    }
    if config:
        options["config_kwargs"] = config
        options["retries"] = 1  # s3fs's own retries: a dead store answers in seconds
    return RemoteLogs(url=f"s3://{bucket}/events", storage_options=options)


def file_remote(tmp_path: Path) -> RemoteLogs:
    return RemoteLogs(url=f"file://{tmp_path / 'store'}")


def day(days_ago: int) -> str:
    return (datetime.fromtimestamp(later(), UTC).date() - timedelta(days=days_ago)).isoformat()


def put(remote: RemoteLogs, key: str, size: int) -> None:
    fs, root = remote_filesystem(remote)
    fs.makedirs(f"{root}/{key}".rpartition("/")[0], exist_ok=True)
    fs.pipe_file(f"{root}/{key}", b"x" * size)


def keys(remote: RemoteLogs) -> set[str]:
    fs, root = remote_filesystem(remote)
    fs.invalidate_cache()
    return {path[len(root) + 1 :] for path in fs.find(root)}


def plant_archive(remote: RemoteLogs) -> None:
    """Archives of 40, 31, 30 days ago and today (1,000 bytes each), a stray object and an old log."""
    for days_ago in (40, 31, 30, 0):
        for n in (1, 2):
            put(remote, f"archive/{day(days_ago)}/incoming.tok=web-{n}.log.gz", 1000)
    put(remote, "archive/notes.txt", 10)  # not a day folder: counted, never removed
    put(remote, INCOMING_LOG, 500)  # old, but incoming/ is never touched
    put(remote, f"{INCOMING_LOG}.status", 5)


def archive_days(remote: RemoteLogs) -> list[str]:
    return sorted({key.split("/")[1] for key in keys(remote) if key.startswith("archive/20")})


@pytest.mark.parametrize("store", ["s3", "file"])
def test_days_remove_whole_day_folders(store: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if store == "s3":
        remote = s3_remote(request.getfixturevalue("moto_s3"), request.getfixturevalue("s3_bucket"))
    else:
        remote = file_remote(tmp_path)
    plant_archive(remote)
    result = remote_archive_retention(remote, 30, None, later())
    assert archive_days(remote) == [day(30), day(0)]
    assert {r.path.split("/")[1] for r in result.removed} == {day(40), day(31)}
    assert result.removed_files == 4 and result.removed_bytes == 4000
    assert {INCOMING_LOG, f"{INCOMING_LOG}.status", "archive/notes.txt"} <= keys(remote)
    if store == "file":  # emptied folders go on a filesystem (an object store has none)
        assert sorted(os.listdir(tmp_path / "store" / "archive")) == [day(30), day(0), "notes.txt"]
    again = remote_archive_retention(remote, 30, None, later())  # another node, or the next run
    assert again.removed == [] and archive_days(remote) == [day(30), day(0)]


def test_cap_removes_the_oldest_objects_first(moto_s3: str, s3_bucket: str) -> None:
    remote = s3_remote(moto_s3, s3_bucket)
    plant_archive(remote)
    # 8,010 bytes in archive/; a cap of 3,500 bytes leaves the 3 newest archives (and the stray).
    result = remote_archive_retention(remote, None, 3500 / GIB, later())
    assert result.size_before == 8010 and result.size_after == 3010
    assert {r.reason for r in result.removed} == {f"over the cap of {3500 / GIB:g} GiB"}
    left = {key for key in keys(remote) if key.startswith("archive/")}
    assert left == {
        f"archive/{day(30)}/incoming.tok=web-2.log.gz",
        f"archive/{day(0)}/incoming.tok=web-1.log.gz",
        f"archive/{day(0)}/incoming.tok=web-2.log.gz",
        "archive/notes.txt",
    }
    assert INCOMING_LOG in keys(remote)


def test_recent_objects_stay_under_the_cap(moto_s3: str, s3_bucket: str) -> None:
    remote = s3_remote(moto_s3, s3_bucket)
    put(remote, f"archive/{day(0)}/incoming.tok=web-1.log.gz", 1000)
    result = remote_archive_retention(remote, None, 0.0, time.time())  # written this second
    assert result.removed == [] and result.kept == 1
    assert keys(remote) == {f"archive/{day(0)}/incoming.tok=web-1.log.gz"}


def test_objects_removed_meanwhile_by_another_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two nodes trim at once: what the other removed after this one listed is skipped."""
    remote = file_remote(tmp_path)
    plant_archive(remote)
    listing = remote_retention._list_archive

    def listed_then_removed(fs: Any, folder: str, now: float) -> Any:
        found = listing(fs, folder, now)
        fs.rm_file(f"{folder}/{day(40)}/incoming.tok=web-1.log.gz")  # the other node, first
        return found

    monkeypatch.setattr(remote_retention, "_list_archive", listed_then_removed)
    result = remote_archive_retention(remote, 30, None, later())
    assert result.removed_files == 4  # chosen from the listing; one was already gone
    assert archive_days(remote) == [day(30), day(0)]


def plant_failed(log_path: Path, name: str, age_days: float) -> Path:
    path = log_path / "failed" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'{"event": 1}\n')
    moment = time.time() - age_days * DAY
    os.utime(path, (moment, moment))
    return path


def test_failed_copy_goes_with_the_local_file(moto_s3: str, s3_bucket: str, tmp_path: Path) -> None:
    remote = s3_remote(moto_s3, s3_bucket)
    old = plant_failed(tmp_path, "failed.dst=pg.log", 100)
    young = plant_failed(tmp_path, "failed.dst=duck.log", 1)
    copies = {"failed/node-a/failed.dst=pg.log", "failed/node-a/failed.dst=duck.log", "failed/node-b/failed.dst=pg.log"}
    for key in copies:
        put(remote, key, 13)
    config = LogConfig(path=str(tmp_path), remote=remote, failed_retention_days=90)
    results = {r.directory: r for r in apply_retention(config, time.time(), node="node-a")}
    assert not old.exists() and young.exists()
    assert keys(remote) == copies - {"failed/node-a/failed.dst=pg.log"}  # node-b's copy is node-b's
    assert [r.path for r in results["remote_failed"].removed] == ["failed/node-a/failed.dst=pg.log"]
    assert "remote_archive" in results  # measured, even with no archive policy
    assert not (tmp_path / "state" / PENDING_FILE).exists()


def test_store_down_keeps_the_copy_to_remove_for_the_next_run(moto_s3: str, s3_bucket: str, tmp_path: Path) -> None:
    from tests.destinations.conftest import free_port

    dead = s3_remote(f"http://127.0.0.1:{free_port()}", s3_bucket, connect_timeout=1, retries={"max_attempts": 1})
    live = s3_remote(moto_s3, s3_bucket)
    put(live, "failed/node-a/failed.dst=pg.log", 13)
    old = plant_failed(tmp_path, "failed.dst=pg.log", 100)
    started = time.monotonic()
    results = apply_retention(LogConfig(path=str(tmp_path), remote=dead, failed_retention_days=90), node="node-a")
    assert time.monotonic() - started < 60
    assert not old.exists()  # the local policy ran
    assert [r.directory for r in results] == ["archive", "failed"]
    pending = orjson.loads((tmp_path / "state" / PENDING_FILE).read_bytes())
    assert pending == {"failed": ["failed.dst=pg.log"]}
    assert keys(live) == {"failed/node-a/failed.dst=pg.log"}
    apply_retention(LogConfig(path=str(tmp_path), remote=live, failed_retention_days=90), node="node-a")
    assert keys(live) == set()
    assert not (tmp_path / "state" / PENDING_FILE).exists()


def test_pending_names_are_parsed_strictly(tmp_path: Path) -> None:
    remote = file_remote(tmp_path)
    put(remote, "failed/node-a/failed.dst=pg.log", 13)
    put(remote, "incoming/x.log", 13)
    state = tmp_path / "events" / "state"
    state.mkdir(parents=True)
    names = ["../../incoming/x.log", "x.log", "failed.dst=pg.log", 3]
    (state / PENDING_FILE).write_bytes(orjson.dumps({"failed": names}))
    apply_retention(LogConfig(path=str(tmp_path / "events"), remote=remote), node="node-a")
    assert keys(remote) == {"incoming/x.log"}


def test_the_retention_thread_removes_its_nodes_copies(tmp_path: Path) -> None:
    """`Retention` (as `eventspark serve` builds it, with the node's name) runs the store's part."""
    remote = file_remote(tmp_path)
    put(remote, f"archive/{day(40)}/incoming.tok=web-1.log.gz", 100)
    archived = tmp_path / "store" / "archive" / day(40) / "incoming.tok=web-1.log.gz"
    os.utime(archived, (time.time() - 40 * DAY, time.time() - 40 * DAY))  # not "written in the last minute"
    put(remote, "failed/node%2Fa/failed.dst=pg.log", 13)  # the node's name percent-encoded, as published
    plant_failed(tmp_path / "events", "failed.dst=pg.log", 100)
    config = LogConfig(
        path=str(tmp_path / "events"), remote=remote, failed_retention_days=90, archive_retention_days=30
    )
    results = Retention(config, period=3600, node="node/a").run_once()
    assert {r.directory: r.removed_files for r in results}["remote_archive"] == 1
    assert keys(remote) == set()
    usage = orjson.loads((tmp_path / "events" / "state" / "retention.json").read_bytes())
    assert usage["remote_archive"]["removed_files"] == 1 and usage["remote_failed"]["removed_files"] == 1


def test_a_copy_holding_a_glob_character_is_not_removed_as_a_pattern(
    moto_s3: str, s3_bucket: str, tmp_path: Path
) -> None:
    # Review: s3fs's `rm` expands `*`, `?` and `[` in the paths it is given, so removing the copy
    # of `failed.dst=a*.log` removed every `failed.dst=a….log` copy of the node too.
    remote = s3_remote(moto_s3, s3_bucket)
    for key in ("failed/node-a/failed.dst=a*.log", "failed/node-a/failed.dst=ab.log"):
        put(remote, key, 13)
    plant_failed(tmp_path / "events", "failed.dst=a*.log", 100)
    plant_failed(tmp_path / "events", "failed.dst=ab.log", 1)
    apply_retention(LogConfig(path=str(tmp_path / "events"), remote=remote, failed_retention_days=90), node="node-a")
    assert keys(remote) == {"failed/node-a/failed.dst=a*.log", "failed/node-a/failed.dst=ab.log"}  # skipped, logged
