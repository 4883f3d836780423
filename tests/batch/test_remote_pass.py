"""Batch passes over rotated logs on object storage (`log.remote`): moto's S3 server, the shared
SparkSession, the machine's Postgres and Redis. Executors read the logs from S3 themselves."""

from __future__ import annotations

import gzip
import io
import tempfile
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from rich.console import Console

import eventspark.batch.splits as splits_module
import eventspark.logs.store as store_module
from eventspark.batch.job import JobResult
from eventspark.batch.load import Fault
from eventspark.batch.process import PassBusy, process_once, run_pass
from eventspark.batch.splits import plan_splits, read_remote_split, read_split
from eventspark.batch.uploader import Uploader
from eventspark.config import LoadedConfig
from eventspark.config.models import CoordinationConfig, RedisConfig, RemoteLogs
from eventspark.coordination import MemoryCoordination, build_coordination
from eventspark.logs.incoming import live_log_name, parse_log_name, rotated_log_name
from eventspark.logs.remote import remote_filesystem
from eventspark.logs.status import status_path
from eventspark.logs.store import LogFile, RemoteReader, RemoteStore, gzip_remote, log_store, remote_lock_name
from tests.batch.helpers import (
    duck_rows,
    duckdb_destination,
    event,
    failed_lines,
    make_config,
    pg_rows,
    postgres_destination,
    put_log,
)
from tests.emulators.s3 import S3_KEY_ID, S3_REGION, S3_SECRET
from tests.faults.test_batch_kill import (
    RUNNER_TIMEOUT,
    SMALL_SPLIT_BYTES,
    WARM_UP,
    assert_every_event_once,
    both_destinations,
    kill_group,
    log_events,
    split_markers,
    start_runner,
)

_clock = [datetime(2021, 3, 4, 5, 0, tzinfo=UTC)]


def remote_section(endpoint: str, bucket: str) -> dict[str, Any]:
    options = {
        "key": S3_KEY_ID,
        "secret": S3_SECRET,
        "client_kwargs": {"endpoint_url": endpoint, "region_name": S3_REGION},
    }
    return {"url": f"s3://{bucket}/events", "storage_options": options}


def remote_config(
    root: Path, remote: dict[str, Any], destinations: dict[str, Any], node: str = "node-a"
) -> LoadedConfig:
    log = {"path": str(root / "events"), "remote": remote}
    # One node per config here: the tests hand each pass its coordination (Redis where it matters).
    return make_config(root, destinations, log=log, server={"name": node}, coordination={"type": "inmemory"})


def remote_fs(loaded: LoadedConfig) -> tuple[Any, str]:
    """The store's filesystem, its cached listings dropped: executors wrote to it."""
    remote = loaded.config.log.remote
    assert remote is not None
    fs, root = remote_filesystem(remote)
    fs.invalidate_cache()
    return fs, root


def put_remote(loaded: LoadedConfig, lines: list[Any], token: str = "web", node: str | None = None) -> str:
    """A rotated log put straight into `incoming/` on the store (what a collector node uploads);
    returns its name. `node`: the name carries it (`|n=<node>`), as uploaded logs do."""
    _clock[0] += timedelta(seconds=1)
    name = rotated_log_name(token, _clock[0], node=node)
    fs, root = remote_fs(loaded)
    fs.makedirs(f"{root}/incoming", exist_ok=True)  # a no-op on S3; `file://` needs the folder
    data = b"".join((line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n" for line in lines)
    fs.pipe_file(f"{root}/incoming/{name}", data)
    return name


def incoming_names(loaded: LoadedConfig) -> list[str]:
    fs, root = remote_fs(loaded)
    if not fs.exists(f"{root}/incoming"):
        return []
    return sorted(path.rsplit("/", 1)[-1] for path in fs.ls(f"{root}/incoming", detail=False, refresh=True))


def remote_status(loaded: LoadedConfig, name: str) -> dict[str, Any] | None:
    fs, root = remote_fs(loaded)
    try:
        return orjson.loads(fs.cat_file(f"{root}/incoming/{name}.status"))
    except FileNotFoundError:
        return None


def archived(loaded: LoadedConfig) -> dict[str, bytes]:
    """Archive object name → its decompressed bytes."""
    fs, root = remote_fs(loaded)
    found = fs.find(f"{root}/archive")
    return {path.rsplit("/", 1)[-1]: gzip.decompress(fs.cat_file(path)) for path in found}


def run(spark: Any, loaded: LoadedConfig, fault: Fault | None = None, coordination: Any = None) -> JobResult:
    return run_pass(loaded, coordination or MemoryCoordination("test"), fault=fault, session=spark)


@pytest.fixture
def remote(moto_s3: str, s3_bucket: str) -> dict[str, Any]:
    return remote_section(moto_s3, s3_bucket)


@pytest.mark.spark
def test_remote_logs_load_once_and_go_to_the_remote_archive(
    spark: Any, tmp_path: Path, remote: dict[str, Any], pg_datasource: dict[str, Any]
) -> None:
    destinations = {"dd": duckdb_destination(template="t"), "pg": postgres_destination(pg_datasource, "t")}
    loaded = remote_config(tmp_path, remote, destinations)
    first = [event(str(i), n=i) for i in range(30)]
    second = [event(str(i), n=i) for i in range(30, 45)]
    names = [put_remote(loaded, first), put_remote(loaded, second)]

    result = run(spark, loaded)

    assert result.ok and result.pairs["pg", "t"].rows == 45 and result.pairs["dd", "t"].rows == 45
    assert pg_rows(pg_datasource["schema"], "SELECT count(*), count(DISTINCT n) FROM t") == [(45, 45)]
    assert duck_rows(tmp_path, "SELECT count(*), count(DISTINCT n) FROM t") == [(45, 45)]
    # Settled: gzipped into archive/<day>/ on the store, the logs and their statuses gone from incoming/.
    assert incoming_names(loaded) == []
    contents = archived(loaded)
    assert sorted(contents) == sorted(name + ".gz" for name in names)
    assert contents[names[0] + ".gz"].count(b"\n") == 30
    assert sorted(str(path).rsplit("/", 1)[-1] for path in result.archived) == sorted(contents)
    # Nothing of the pass stays on the store's staging, nothing read from the local incoming/.
    fs, root = remote_fs(loaded)
    assert not fs.exists(f"{root}/staging") or fs.find(f"{root}/staging") == []
    assert not list((tmp_path / "events" / "incoming").glob("*.log"))  # only the node's batch lock

    # Postgres' table exists now: the next log is written straight into it by the executors.
    put_remote(loaded, [event("45", n=45)])
    assert run(spark, loaded).ok
    assert pg_rows(pg_datasource["schema"], "SELECT count(*), count(DISTINCT n) FROM t") == [(46, 46)]
    assert duck_rows(tmp_path, "SELECT count(*) FROM t") == [(46,)]


@pytest.mark.spark
def test_process_and_the_uploader_upload_this_nodes_logs_then_load_them_from_the_store(
    spark: Any, tmp_path: Path, remote: dict[str, Any]
) -> None:
    loaded = remote_config(tmp_path, remote, {"dd": duckdb_destination(template="t")}, node="node-a")
    incoming = tmp_path / "events" / "incoming"
    incoming.mkdir(parents=True)
    (incoming / live_log_name("web")).write_bytes(b"".join(orjson.dumps(event(str(i), n=i)) + b"\n" for i in range(3)))

    assert process_once(loaded, Console(record=True, width=200), keep_session=True)  # rotates, uploads, loads

    assert duck_rows(tmp_path, "SELECT count(*) FROM t") == [(3,)]
    assert not list(incoming.glob("*.log")) and incoming_names(loaded) == []
    (name,) = archived(loaded)
    parsed = parse_log_name(name.removesuffix(".gz"))
    assert parsed is not None and parsed.node == "node-a"

    put_log(tmp_path, [event("3", n=3)])  # rotated by the collector of `serve`
    uploader = Uploader(loaded)
    try:
        result = uploader.run_once()
    finally:
        uploader.stop(stop_spark=False)
    assert result is not None and result.ok and result.pairs["dd", "t"].rows == 1
    assert duck_rows(tmp_path, "SELECT count(*), count(DISTINCT n) FROM t") == [(4, 4)]
    assert not list(incoming.glob("*.log")) and len(archived(loaded)) == 2


@pytest.mark.spark
def test_a_file_url_works_as_a_store(spark: Any, tmp_path: Path) -> None:
    # Any fsspec URL: here a folder of this machine (`file://`): folders made, files moved into place.
    store = {"url": (tmp_path / "store").as_uri()}
    template = "{{.event_type}}{{if .broken}}{{.broken.deeper.Format}}{{end}}"
    loaded = remote_config(tmp_path, store, {"dd": duckdb_destination(template=template)})
    bad = event("bad", event_type="t", broken={"deeper": 1})  # fails the template
    name = put_remote(loaded, [event("1", event_type="t"), bad])

    result = run(spark, loaded)

    assert result.ok and duck_rows(tmp_path, "SELECT eventn_ctx_event_id FROM t") == [("1",)]
    assert incoming_names(loaded) == [] and list(archived(loaded)) == [name + ".gz"]
    (failure,) = failed_lines(tmp_path, "dd")
    assert failure["event_id"] == "bad" and failure["error"]
    copy = tmp_path / "store" / "failed" / "node-a" / "failed.dst=dd.log"
    assert copy.read_bytes() == (tmp_path / "events" / "failed" / "failed.dst=dd.log").read_bytes()
    assert not [p for p in (tmp_path / "store").rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.spark
def test_a_failed_pair_keeps_its_log_with_the_status_beside_it(
    spark: Any, tmp_path: Path, remote: dict[str, Any], pg_datasource: dict[str, Any]
) -> None:
    down = remote_config(tmp_path, remote, {"pg": postgres_destination({**pg_datasource, "port": 1}, "t")})
    name = put_remote(down, [event("1", n=1), event("2", n=2)])

    result = run(spark, down)

    assert not result.ok
    assert incoming_names(down) == sorted([name, name + ".status"])
    status = remote_status(down, name)
    assert status is not None and status["pg"][""]["uploaded"] is False and status["pg"][""]["attempts"] == 1
    assert [getattr(item, "name", None) for item in result.kept] == [name]

    up = remote_config(tmp_path, remote, {"pg": postgres_destination(pg_datasource, "t")})
    assert run(spark, up).ok
    assert pg_rows(pg_datasource["schema"], "SELECT eventn_ctx_event_id FROM t ORDER BY 1") == [("1",), ("2",)]
    assert incoming_names(up) == [] and list(archived(up)) == [name + ".gz"]


@pytest.mark.spark
def test_a_failed_event_lands_in_failed_here_and_beside_the_logs(
    spark: Any, tmp_path: Path, remote: dict[str, Any], pg_datasource: dict[str, Any]
) -> None:
    loaded = remote_config(tmp_path, remote, {"pg": postgres_destination(pg_datasource, "t")}, node="node-a")
    put_remote(loaded, [event("0", n=0)])
    assert run(spark, loaded).ok  # t.n is a bigint now
    put_remote(loaded, [event("1", n=1), event("2", n="not a number"), event("3", n=3)])

    result = run(spark, loaded)

    assert result.ok and result.pairs["pg", "t"].failed == 1
    (misfit,) = failed_lines(tmp_path, "pg")
    assert misfit["event_id"] == "2" and "'n'" in misfit["error"]
    fs, root = remote_fs(loaded)
    copy = fs.cat_file(f"{root}/failed/node-a/failed.dst=pg.log")
    assert copy == (tmp_path / "events" / "failed" / "failed.dst=pg.log").read_bytes()
    assert pg_rows(pg_datasource["schema"], "SELECT eventn_ctx_event_id FROM t ORDER BY 1") == [("0",), ("1",), ("3",)]


@pytest.mark.spark
@pytest.mark.parametrize("point", ["staged", "committed"])
def test_a_crash_mid_pass_then_a_rerun_loads_every_event_once(
    spark: Any, tmp_path: Path, remote: dict[str, Any], pg_datasource: dict[str, Any], point: str
) -> None:
    template = "{{.event_type}}{{if .broken}}{{.broken.deeper.Format}}{{end}}"
    destinations = {"dd": duckdb_destination(template=template), "pg": postgres_destination(pg_datasource, template)}
    loaded = remote_config(tmp_path, remote, destinations)
    bad = event("bad", event_type="t", broken={"deeper": 1})  # fails the template of both
    name = put_remote(loaded, [*(event(str(i), event_type="t", n=i) for i in range(20)), bad])

    def crash(at: str) -> None:
        if at == point:
            raise SystemExit(f"crash at {at}")

    with pytest.raises(SystemExit):
        run(spark, loaded, fault=crash)
    assert incoming_names(loaded) == [name]  # no status yet: the rerun finds the markers

    result = run(spark, loaded)

    assert result.ok and incoming_names(loaded) == []
    assert duck_rows(tmp_path, "SELECT count(*), count(DISTINCT n) FROM t") == [(20, 20)]
    assert pg_rows(pg_datasource["schema"], "SELECT count(*), count(DISTINCT n) FROM t") == [(20, 20)]
    assert [f["event_id"] for f in failed_lines(tmp_path, "dd") + failed_lines(tmp_path, "pg")] == ["bad", "bad"]


@pytest.mark.spark
@pytest.mark.parametrize("point", ["pair committed", "committed"])
def test_a_misfit_of_a_pair_committed_before_a_crash_reaches_failed_once(
    spark: Any, tmp_path: Path, remote: dict[str, Any], pg_datasource: dict[str, Any], point: str
) -> None:
    loaded = remote_config(tmp_path, remote, {"pg": postgres_destination(pg_datasource, "t")})
    put_remote(loaded, [event("0", n=0)])
    assert run(spark, loaded).ok  # t.n is a bigint now
    name = put_remote(loaded, [event("1", n=1), event("2", n="not a number"), event("3", n=3)])

    def crash(at: str) -> None:
        if at == point:
            raise SystemExit(f"crash at {at}")

    with pytest.raises(SystemExit):
        run(spark, loaded, fault=crash)
    # Committed, no status on the store: only the spool parked on this node knows the misfit.
    assert incoming_names(loaded) == [name]
    assert any((tmp_path / "events" / "failed" / "pending").iterdir())

    assert run(spark, loaded).ok

    rows = pg_rows(pg_datasource["schema"], "SELECT eventn_ctx_event_id FROM t ORDER BY 1")
    assert rows == [("0",), ("1",), ("3",)]
    (misfit,) = failed_lines(tmp_path, "pg")
    assert misfit["event_id"] == "2" and "'n'" in misfit["error"]
    assert incoming_names(loaded) == [] and not any((tmp_path / "events" / "failed" / "pending").iterdir())


@pytest.mark.spark
@pytest.mark.slow
def test_an_executor_killed_after_its_split_commit_then_a_rerun_loads_every_event_once(
    spark: Any, tmp_path: Path, remote: dict[str, Any], pg_datasource: dict[str, Any], monkeypatch: Any
) -> None:
    """The pass runs in a process of its own (tests/faults/batch_runner.py, `local[1]`): the
    executor reading the logs from S3 commits its first Postgres split directly, then SIGKILLs
    itself; the pass fails (local Spark does not retry a lost task). The rerun skips the committed
    split (its marker) and loads every event once, the failed ones once in failed/."""
    monkeypatch.setattr(splits_module, "SPLIT_BYTES", SMALL_SPLIT_BYTES)
    loaded = remote_config(tmp_path, remote, both_destinations(pg_datasource))
    schema = pg_datasource["schema"]
    put_remote(loaded, [event(f"warm-{i}", event_type="t", n=i) for i in range(WARM_UP)])
    assert run(spark, loaded).ok  # table t exists: the next pass writes it directly
    warm = set(split_markers(schema))  # its rows were committed per task (`batch.commits`)
    names = [put_remote(loaded, log_events(part)) for part in (0, 1)]

    process, _signals = start_runner(tmp_path, "executor:kill-after-commit:1", SMALL_SPLIT_BYTES)
    try:
        process.wait(RUNNER_TIMEOUT)
    finally:
        kill_group(process)
        process.wait()
    output = (tmp_path / "runner.log").read_text()
    assert process.returncode == 1, output[-3000:]  # the pass failed: its Spark job lost a task
    assert incoming_names(loaded) == sorted(names)  # no status written
    markers = [marker for marker in split_markers(schema) if marker not in warm]
    assert markers and all(marker.split("@")[0] in names for marker in markers)

    result = run(spark, loaded)

    assert result.ok and incoming_names(loaded) == []
    assert_every_event_once(tmp_path, schema, Counter(f"warm-{i}" for i in range(WARM_UP)))
    # Kept after the archive under log.remote (`RemoteStore.archive_is_final`): a log put again
    # after its archive is found by them.
    assert set(markers) <= set(split_markers(schema))


@pytest.mark.spark
def test_logs_of_one_token_from_two_nodes_both_load(
    spark: Any, tmp_path: Path, remote: dict[str, Any], pg_datasource: dict[str, Any]
) -> None:
    loaded = remote_config(tmp_path, remote, {"pg": postgres_destination(pg_datasource, "t")})
    # The same rotation time on two nodes: the names differ by the node only.
    _clock[0] += timedelta(seconds=1)
    at = _clock[0]
    names = []
    for node, ids in (("nodea", range(0, 5)), ("nodeb", range(5, 12))):
        _clock[0] = at - timedelta(seconds=1)
        names.append(put_remote(loaded, [event(str(i), n=i) for i in ids], node=node))
    assert names[0] != names[1]

    result = run(spark, loaded)

    assert result.ok and not result.held
    assert pg_rows(pg_datasource["schema"], "SELECT count(*), count(DISTINCT n) FROM t") == [(12, 12)]
    assert sorted(archived(loaded)) == sorted(name + ".gz" for name in names)


@pytest.mark.spark
def test_a_pass_held_by_another_node_is_skipped_and_reads_nothing(
    spark: Any, tmp_path: Path, remote: dict[str, Any], pg_datasource: dict[str, Any]
) -> None:
    prefix = f"es-test-{uuid.uuid4().hex[:8]}:"
    coordination = {"redis": {"host": "127.0.0.1", "port": 6379}, "key_prefix": prefix}
    loaded = make_config(
        tmp_path,
        {"pg": postgres_destination(pg_datasource, "t")},
        log={"path": str(tmp_path / "events"), "remote": remote},
        server={"name": "node-a"},
        coordination=coordination,
    )
    name = put_remote(loaded, [event("1", n=1)])
    section = CoordinationConfig(redis=RedisConfig(host="127.0.0.1", port=6379), key_prefix=prefix)
    other = build_coordination(section, "node-b")
    mine = build_coordination(section, "node-a")
    assert loaded.config.log.remote is not None
    try:
        with other.lock(remote_lock_name(loaded.config.log.remote), timeout=5):
            with pytest.raises(PassBusy, match="node-b"):
                run(spark, loaded, coordination=mine)
            assert incoming_names(loaded) == [name]  # no status: not read
            tables = pg_rows(pg_datasource["schema"], "SELECT count(*) FROM pg_tables WHERE tablename = 't'")
            assert tables == [(0,)]
        assert run(spark, loaded, coordination=mine).ok  # released: this node's turn
        assert pg_rows(pg_datasource["schema"], "SELECT count(*) FROM t") == [(1,)]
    finally:
        other.close()
        mine.close()


@pytest.mark.spark
def test_a_stray_object_in_incoming_is_ignored_not_deleted(
    spark: Any, tmp_path: Path, remote: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    loaded = remote_config(tmp_path, remote, {"dd": duckdb_destination(template="t")})
    fs, root = remote_fs(loaded)
    for stray in ("notes.txt", "incoming.tok=web-garbage.log", "incoming.tok=web.log"):
        fs.pipe_file(f"{root}/incoming/{stray}", orjson.dumps(event("stray", n=0)) + b"\n")
    name = put_remote(loaded, [event("1", n=1)])
    empty = put_remote(loaded, [])  # a rotated log without a line: deleted, as under log.path

    result = run(spark, loaded)

    assert result.ok and duck_rows(tmp_path, "SELECT eventn_ctx_event_id FROM t") == [("1",)]
    assert [item.name for item in result.deleted_empty] == [empty]
    assert incoming_names(loaded) == sorted(["incoming.tok=web-garbage.log", "incoming.tok=web.log", "notes.txt"])
    assert list(archived(loaded)) == [name + ".gz"]
    assert "notes.txt in incoming/ is not a rotated log: ignored" in caplog.text


@pytest.mark.parametrize("split_bytes", [64, 1000, 4096, 1 << 20])
def test_remote_and_local_reads_yield_the_same_lines_for_the_same_splits(
    tmp_path: Path, moto_s3: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch, split_bytes: int
) -> None:
    # Lines of every length around the boundaries, blank lines, CRLF, and no newline at the end.
    lines = [b'{"i": %d, "pad": "%s"}' % (i, b"x" * (i * 7 % 300)) for i in range(3000)]
    data = b"\n".join(lines[:1000]) + b"\n\n\r\n" + b"\r\n".join(lines[1000:2000]) + b"\n" + b"\n".join(lines[2000:])
    local = tmp_path / "incoming.tok=web-2021-03-04T05-00-00.000.log"
    local.write_bytes(data)
    section = remote_section(moto_s3, s3_bucket)
    reader = RemoteReader(section["url"], section["storage_options"])
    fs = reader.filesystem()
    location = f"{s3_bucket}/events/incoming/{local.name}"
    fs.pipe_file(location, data)
    monkeypatch.setattr(splits_module, "SPLIT_BYTES", split_bytes)

    local_splits = plan_splits([local])
    remote_splits = plan_splits([LogFile(local.name, len(data), location)])

    assert [(s.start, s.end) for s in local_splits] == [(s.start, s.end) for s in remote_splits]
    for here, there in zip(local_splits, remote_splits, strict=True):
        assert list(read_split(here)) == list(read_remote_split(there, reader)), here.key
    assert sum(len(list(read_split(s))) for s in local_splits) == 3000


def test_an_unreadable_status_stops_the_pass_instead_of_reading_as_empty(tmp_path: Path) -> None:
    # A status read as empty would process its log again for every destination: only a missing
    # status is empty (as under log.path), any other error is the pass's.
    store = {"url": (tmp_path / "store").as_uri()}
    loaded = remote_config(tmp_path, store, {"dd": duckdb_destination()})
    name = put_remote(loaded, [event("1", event_type="t")])
    missing = put_remote(loaded, [event("2", event_type="t")])
    (tmp_path / "store" / "incoming" / f"{name}.status").mkdir()  # unreadable as a file
    store_of = log_store(loaded.config)
    logs = store_of.rotated()

    with pytest.raises(IsADirectoryError):
        store_of.read_statuses(logs)
    (tmp_path / "store" / "incoming" / f"{name}.status").rmdir()
    assert store_of.read_statuses(logs) == {name: {}, missing: {}}


def test_archived_logs_leave_the_store_in_bulk_even_when_a_status_is_missing(tmp_path: Path) -> None:
    # Logs first, then statuses (a log without its status would be read again as new); a
    # filesystem that stops a bulk delete at a missing object goes on one by one.
    store = {"url": (tmp_path / "store").as_uri()}
    loaded = remote_config(tmp_path, store, {"dd": duckdb_destination()})
    names = [put_remote(loaded, [event(str(n), event_type="t")]) for n in range(3)]
    incoming = tmp_path / "store" / "incoming"
    for name in names[1:]:
        (incoming / f"{name}.status").write_bytes(b"{}")
    store_of = log_store(loaded.config)

    archived_now = store_of.archive(store_of.rotated())

    assert sorted(path.rsplit("/", 1)[-1] for path in archived_now) == sorted(f"{name}.gz" for name in names)
    assert sorted(p.name for p in incoming.iterdir()) == []
    assert set(archived(loaded)) == {f"{name}.gz" for name in names}


def test_the_stores_secrets_stay_out_of_reprs(tmp_path: Path) -> None:
    # Review: the reader travels in every job plan; a repr in a log line or a traceback showed them.
    options = {"key": "AKIDEXAMPLE", "secret": "wJalrXUtnFEMI"}
    reader = RemoteReader("s3://bucket/events", options)
    remote = {"url": "s3://bucket/events", "storage_options": options}
    config = make_config(tmp_path, {}, log={"remote": remote}, coordination={"type": "inmemory"})
    for shown in (repr(reader), repr(config.config.log), str(config.config.log)):
        assert "AKIDEXAMPLE" not in shown and "wJalrXUtnFEMI" not in shown


@pytest.mark.parametrize("node", ["..", "../other", "a/b", "."])
def test_a_node_name_cannot_lead_failed_copies_out_of_failed(tmp_path: Path, node: str) -> None:
    # Review: `server.name` (or the host name) went into the copies' keys as it was.
    loaded = remote_config(tmp_path, {"url": (tmp_path / "store").as_uri()}, {"dd": duckdb_destination()}, node=node)
    failed = tmp_path / "events" / "failed"
    failed.mkdir(parents=True)
    (failed / "failed.dst=dd.log").write_bytes(b'{"n":1}\n')

    log_store(loaded.config).publish_failed(failed)

    (copy,) = [path for path in (tmp_path / "store").rglob("*") if path.is_file()]
    assert copy.parent.parent == tmp_path / "store" / "failed" and copy.parent.name not in (".", "..")


class _BrokenSource(io.RawIOBase):
    """A log whose read fails after its first 64 KiB (the store went away mid-archive)."""

    def __init__(self) -> None:
        self.left = 64 * 1024

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.left <= 0:
            raise OSError("connection reset")
        size = min(len(buffer), self.left)
        buffer[:size] = b"x" * size
        self.left -= size
        return size


@pytest.mark.parametrize("store", ["s3", "file"])
def test_an_archive_cut_short_leaves_no_object_under_its_name(
    tmp_path: Path, store: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review: closing the object on the way out of the error put the truncated gzip (whose trailer
    # igzip wrote anyway, so it read as whole) under the archive's name.
    remote = request.getfixturevalue("remote") if store == "s3" else {"url": (tmp_path / "store").as_uri()}
    loaded = remote_config(tmp_path, remote, {"dd": duckdb_destination()})
    reader = log_store(loaded.config).reader
    assert reader is not None
    monkeypatch.setattr(RemoteReader, "open", lambda self, location: io.BufferedReader(_BrokenSource()))
    fs, root = remote_fs(loaded)

    with pytest.raises(OSError, match="connection reset"):
        gzip_remote(reader, f"{root}/incoming/x.log", f"{root}/archive/2026-11-25/x.log.gz")

    fs.invalidate_cache()
    assert not fs.exists(f"{root}/archive/2026-11-25/x.log.gz")


@pytest.mark.spark
def test_executors_leave_no_spool_folders_in_their_temp_dir(
    spark: Any, tmp_path: Path, remote: dict[str, Any], pg_datasource: dict[str, Any]
) -> None:
    # Review: every job left `<tmp>/<job id>/failed/` on each executor (and, after a failed task,
    # its spools of failed events: event data in a shared temp dir).
    loaded = remote_config(tmp_path, remote, {"pg": postgres_destination(pg_datasource, "t")})
    put_remote(loaded, [event("0", n=0)])
    assert run(spark, loaded).ok
    temp = Path(tempfile.gettempdir())
    before = set(temp.iterdir())
    put_remote(loaded, [event("1", n=1), event("2", n="not a number")])

    result = run(spark, loaded)

    assert result.ok and result.pairs["pg", "t"].failed == 1
    left = [path for path in set(temp.iterdir()) - before if (path / "failed").is_dir() or "eventspark-" in path.name]
    assert left == []


class _ClusterContext:
    """The shared local session's context, saying it runs on a cluster master: `LocalStore.archive`
    then sends the gzip to the executors (which here are the local session's)."""

    master = "spark://cluster:7077"

    def __init__(self, context: Any) -> None:
        self.context = context
        self.defaultParallelism = context.defaultParallelism
        self.slices: list[int] = []

    def parallelize(self, items: list[Any], slices: int) -> Any:
        self.slices.append(slices)
        return self.context.parallelize(items, slices)


@pytest.mark.spark
def test_on_a_cluster_master_the_executors_archive_the_local_logs(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "EXECUTOR_ARCHIVE_BYTES", 1)
    loaded = make_config(tmp_path, {"dd": duckdb_destination()})
    logs = [put_log(tmp_path, [event(str(n), event_type="t")] * (n + 1)) for n in range(5)]
    contents = {log.name: log.read_bytes() for log in logs}
    for log in logs[:2]:
        status_path(log).write_bytes(b"{}")
    store_of = log_store(loaded.config)
    context = _ClusterContext(spark.sparkContext)

    done = store_of.archive(store_of.rotated(), SimpleNamespace(sparkContext=context))

    assert context.slices == [min(5, spark.sparkContext.defaultParallelism)]  # a task per core, not per log
    assert {Path(path).name: gzip.decompress(Path(path).read_bytes()) for path in done} == {
        f"{name}.gz": data for name, data in contents.items()
    }
    assert list((tmp_path / "events" / "incoming").iterdir()) == []


def test_a_stray_object_with_glob_characters_is_ignored_and_deletes_nothing(
    tmp_path: Path, remote: dict[str, Any]
) -> None:
    # Review: fsspec expands `*`, `?` and `[` in the paths given to `rm` and to a `cat` of several:
    # archiving a stray `incoming.tok=*|n=…` deleted every log of that second, loaded or not.
    loaded = remote_config(tmp_path, remote, {"dd": duckdb_destination()})
    name = put_remote(loaded, [event("1")], node="node-b")
    stray = name.replace("tok=web|n=node-b", "tok=*|n=*")
    fs, root = remote_fs(loaded)
    fs.pipe_file(f"{root}/incoming/{stray}", orjson.dumps(event("2")) + b"\n")
    store = log_store(loaded.config)

    assert [logfile.name for logfile in store.rotated()] == [name]
    store.archive([logfile for logfile in store.rotated() if logfile.name != name])
    assert sorted(incoming_names(loaded)) == sorted([name, stray])


def test_a_claim_key_holding_a_glob_character_is_not_removed_as_a_pattern(
    tmp_path: Path, remote: dict[str, Any]
) -> None:
    # Review: claims are listed then removed in bulk, and s3fs's `rm` expands `*`, `?` and `[`:
    # a stray key `…/node-b@*` removed the claim of a group this pass keeps.
    store = RemoteStore(RemoteLogs.model_validate(remote), tmp_path / "events", "node-a")
    claims = store.park_claims()
    pair = claims._pair("incoming.tok=web|n=node-a-2026-01-01T00-00-00.000.log", "pg", "t")
    store.fs.pipe({f"{pair}/{key}": b"" for key in ("node-b@*", "node-b@kept", "node-c@other")})
    kept = SimpleNamespace(group_id="kept")

    claims.supersede([("incoming.tok=web|n=node-a-2026-01-01T00-00-00.000.log", "pg", "t")], keep=[kept])
    claims.refresh()
    assert sorted(key.rpartition("/")[2] for key in claims._listing()) == ["node-b@*", "node-b@kept"]
