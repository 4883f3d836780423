"""The adapter contract on bqemulator (staging on its fake GCS, and on local files), plus what is
BigQuery-specific: config and credentials, types read back, the commit's transaction, exactly-once
across crashes between stage and commit, and `eventspark process` of the fixture log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventspark.destinations.base import (
    LOADS_TABLE,
    STAGE_PREFIX,
    Load,
    TerminalError,
    TransientError,
    new_job_id,
)
from eventspark.destinations.bigquery.client import GCS_STAGE_FOLDER, key_of
from eventspark.destinations.bigquery.configuration import BigQueryDestination
from eventspark.destinations.bigquery.dialect import DIALECT, field_type, sql_type
from eventspark.destinations.bigquery.load import BigQueryWarehouse, build, settings_of
from eventspark.steps.diff import TablePatch
from eventspark.steps.typing import DataType
from tests.destinations.contract import AdapterContract
from tests.emulators.bigquery import BigQueryEmulator

B, INT, F, T, S = DataType.BOOL, DataType.INT64, DataType.FLOAT64, DataType.TIMESTAMP, DataType.STRING


def _destination(block: dict[str, Any], **extra: Any) -> BigQueryDestination:
    return BigQueryDestination.model_validate({"type": "bigquery", "google": block, **extra})


def _query(emulator: BigQueryEmulator, sql: str) -> list[tuple[Any, ...]]:
    # The shared contract reads values back with CAST(... AS VARCHAR): GoogleSQL says STRING.
    client = emulator.bigquery()
    try:
        job = client.query(sql.replace(" AS VARCHAR)", " AS STRING)"), job_retry=None)
        return [tuple(row.values()) for row in job.result(timeout=60)]
    finally:
        client.close()


class _Contract(AdapterContract):
    gcs: bool

    @pytest.fixture
    def adapter(
        self, bigquery_emulator: BigQueryEmulator, bq_dataset: str, tmp_path: Path
    ) -> Iterator[BigQueryWarehouse]:
        dest = _destination(bigquery_emulator.google_block(bq_dataset, gcs=self.gcs))
        adapter = build("bq", dest, tmp_path)
        self.emulator = bigquery_emulator
        yield adapter
        adapter.close()

    def query(self, adapter: Any, sql: str) -> list[tuple[Any, ...]]:
        return _query(self.emulator, sql)

    def test_quotes_untrusted_names(self, adapter: Any) -> None:
        """BigQuery refuses quotes and semicolons in table names (bqemulator anything but
        [A-Za-z0-9_-]); column names take more (not backticks
        in bqemulator, which cannot parse an escaped one), and the dialect quotes them."""
        name = "we-ird"
        target = self.create(adapter, name, {'co"l x': S})
        chunk = self.stage(adapter, "jq", {'co"l x': S}, [["v"]])
        adapter.commit(Load("d", target, [chunk], ["l1"]))
        assert self.query(adapter, f"SELECT * FROM {self.name(adapter, name)}") == [("v",)]


class TestBigQueryAdapterOnGcs(_Contract):
    gcs = True

    def test_chunks_are_objects_removed_after_the_commit(self, adapter: BigQueryWarehouse) -> None:
        target = self.create(adapter, "g", {"n": INT})
        chunk = self.stage(adapter, "jobg", {"n": INT}, [[1], [2]])
        assert chunk.ref.startswith(f"gs://{self.emulator.bucket}/{GCS_STAGE_FOLDER}/jobg/bq/")
        assert self._objects() != []
        adapter.commit(Load("d", target, [chunk], ["l1"]))
        assert self._objects() == []
        assert adapter.read_tables().keys() == {"g"}
        assert self.query(adapter, f"SELECT n FROM {self.name(adapter, 'g')} ORDER BY n") == [(1,), (2,)]

    def _objects(self) -> list[str]:
        storage = self.emulator.storage()
        try:
            return [b.name for b in storage.list_blobs(self.emulator.bucket, prefix=f"{GCS_STAGE_FOLDER}/jobg/")]
        finally:
            storage.close()


class TestBigQueryAdapterOnLocalFiles(_Contract):
    gcs = False

    def test_chunks_are_files_removed_after_the_commit(self, adapter: BigQueryWarehouse, tmp_path: Path) -> None:
        target = self.create(adapter, "l", {"n": INT, "s": S})
        one = self.stage(adapter, "jobl", {"n": INT}, [[1]])
        two = self.stage(adapter, "jobl", {"n": INT}, [[2]])
        three = self.stage(adapter, "jobl", {"s": S}, [["x"]])
        assert Path(one.ref).parent == tmp_path / "staging" / "jobl" / "bq"
        adapter.commit(Load("d", target, [one, two, three], ["l1"]))
        assert not [p for p in (tmp_path / "staging").rglob("*") if p.is_file()]
        rows = self.query(adapter, f"SELECT n, s FROM {self.name(adapter, 'l')} ORDER BY n NULLS LAST")
        assert rows == [(1, None), (2, None), (None, "x")]


# --- BigQuery specifics ------------------------------------------------------------------------


@pytest.fixture
def adapter(bigquery_emulator: BigQueryEmulator, bq_dataset: str, tmp_path: Path) -> Iterator[BigQueryWarehouse]:
    adapter = build("bq", _destination(bigquery_emulator.google_block(bq_dataset)), tmp_path)
    yield adapter
    adapter.close()


def test_config_is_eventnatives_google_block_plus_endpoints() -> None:
    key = {"type": "service_account", "project_id": "from-key", "private_key": "SECRET-KEY", "client_email": "x@y"}
    dest = _destination({"gcs_bucket": "b", "bq_dataset": "ds", "key_file": key})
    settings = settings_of(dest)
    assert (settings.project, settings.dataset, settings.bucket) == ("from-key", "ds", "b")
    assert settings.key_info == key and settings.key_path == ""
    assert "SECRET" not in repr(settings) and "SECRET" not in repr(dest)
    # EventNative also takes the key as JSON text, or a path; the dataset defaults to `default`.
    assert key_of(json.dumps(key)) == ("", key)
    assert key_of("/keys/sa.json") == ("/keys/sa.json", None)
    assert settings_of(_destination({"bq_project": "p"})).dataset == "default"


def test_credentials_by_config() -> None:
    from google.auth.credentials import AnonymousCredentials

    emulated = settings_of(_destination({"bq_project": "p", "bq_endpoint": "http://127.0.0.1:1"}))
    assert isinstance(emulated.credentials(emulated.bq_endpoint), AnonymousCredentials)
    assert settings_of(_destination({"bq_project": "p"})).credentials("") is None  # the library's default
    broken = settings_of(_destination({"bq_project": "p", "key_file": {"private_key": "SECRET-KEY"}}))
    with pytest.raises(TerminalError, match="service account key") as raised:
        broken.credentials("")
    assert "SECRET" not in str(raised.value)


def test_types_read_back_in_every_spelling() -> None:
    for spelling, data_type in {
        "INTEGER": INT,
        "INT64": INT,
        "FLOAT": F,
        "FLOAT64": F,
        "NUMERIC": F,
        "BIGNUMERIC": F,
        "NUMERIC(10, 2)": F,
        "BOOLEAN": B,
        "BOOL": B,
        "STRING": S,
        "STRING(10)": S,
        "TIMESTAMP": T,
        "DATETIME": T,
    }.items():
        assert DIALECT.data_type_of(spelling) is data_type, spelling
    for spelling in ("DATE", "JSON", "BYTES", "RECORD", "GEOGRAPHY", "ARRAY<STRING>"):
        assert DIALECT.data_type_of(spelling) is None, spelling
    assert [sql_type(t) for t in ("INTEGER", "FLOAT", "BOOLEAN", "NUMERIC(10,2)")] == [
        "INT64",
        "FLOAT64",
        "BOOL",
        "NUMERIC(10,2)",
    ]
    assert [field_type(t) for t in ("INT64", "FLOAT64", "BOOL", "NUMERIC(10,2)", "STRING")] == [
        "INTEGER",
        "FLOAT",
        "BOOLEAN",
        "NUMERIC",
        "STRING",
    ]


def test_new_columns_reach_both_the_api_schema_and_the_data(
    adapter: BigQueryWarehouse, bigquery_emulator: BigQueryEmulator, bq_dataset: str
) -> None:
    adapter.patch(TablePatch("t", create=True, add_columns={"a": "INTEGER"}, primary_keys=("a",)))
    adapter.patch(TablePatch("t", add_columns={"b": "STRING", "c": "TIMESTAMP"}))
    adapter.patch(TablePatch("t", add_columns={"b": "STRING"}))  # another node added it first
    found = adapter.read_table("t")
    assert found is not None and found.columns == {"a": "INTEGER", "b": "STRING", "c": "TIMESTAMP"}
    assert found.primary_keys == ("a",)
    adapter.insert(found, [{"a": 1, "b": "x", "c": "2026-11-01T10:00:00Z"}])
    assert _query(bigquery_emulator, f"SELECT a, b FROM `{bq_dataset}`.t") == [(1, "x")]


def test_commit_is_one_transaction_with_its_markers(adapter: BigQueryWarehouse, bq_dataset: str) -> None:
    """The pair's rows and markers are one script: a failing cast leaves neither, and the
    staging tables are dropped either way."""
    target = AdapterContract().create(adapter, "f", {"n": INT})
    stage = AdapterContract().stage
    good = stage(adapter, "job1", {"n": INT}, [[1]])
    bad = stage(adapter, "job1", {"n": S}, [["nope"]])
    with pytest.raises(TerminalError, match="loading table 'f'"):
        adapter.commit(Load("d", target, [good, bad], ["l1"]))
    assert adapter.loaded_files("d", ["l1"]) == set()
    assert [t for t in adapter._read(None)] == ["f"]
    names = {t.table_id for t in adapter._connection().client.list_tables(bq_dataset)}  # type: ignore[attr-defined]
    assert names == {"f", LOADS_TABLE}


def test_unreachable_endpoint_is_transient(bq_dataset: str, tmp_path: Path) -> None:
    from tests.destinations.conftest import free_port

    block = {"bq_project": "test-proj", "bq_dataset": bq_dataset, "bq_endpoint": f"http://127.0.0.1:{free_port()}"}
    adapter = build("bq", _destination(block), tmp_path)
    with pytest.raises(TransientError, match="bigquery: creating dataset"):
        adapter.read_tables()


def test_read_tables_reads_every_table_with_its_key(adapter: BigQueryWarehouse) -> None:
    for i in range(12):
        keys = ("id",) if i % 2 else None
        adapter.patch(
            TablePatch(f"t{i}", create=True, add_columns={"id": "STRING", f"c{i}": "INTEGER"}, primary_keys=keys)
        )
    tables = adapter.read_tables()
    assert sorted(tables) == sorted(f"t{i}" for i in range(12))
    for i in range(12):
        assert tables[f"t{i}"].columns == {"id": "STRING", f"c{i}": "INTEGER"}
        assert tables[f"t{i}"].primary_keys == (("id",) if i % 2 else ())


def test_stale_staging_tables_and_objects_of_a_killed_commit_are_dropped(
    adapter: BigQueryWarehouse, bigquery_emulator: BigQueryEmulator, bq_dataset: str
) -> None:
    """A commit killed after its load job leaves a staging table (and the staged objects): a
    later pass drops those of jobs older than its limit, and keeps the others."""
    old, recent = new_job_id(time.time() - 7200), new_job_id(time.time())
    adapter.read_tables()  # creates the dataset
    client = bigquery_emulator.bigquery()
    try:
        for job in (old, recent):
            client.query(f"CREATE TABLE `{bq_dataset}`.`{STAGE_PREFIX}{job}_x` (n INT64)").result()
    finally:
        client.close()
    chunks = {job: AdapterContract().stage(adapter, job, {"n": INT}, [[1]]) for job in (old, recent)}
    adapter.drop_stale_stages(time.time() - 3600)
    client = bigquery_emulator.bigquery()
    try:
        left = {t.table_id for t in client.list_tables(bq_dataset)}
    finally:
        client.close()
    assert left == {LOADS_TABLE, f"{STAGE_PREFIX}{recent}_x"}
    storage = bigquery_emulator.storage()
    try:
        objects = {f"gs://{bigquery_emulator.bucket}/{b.name}" for b in storage.list_blobs(bigquery_emulator.bucket)}
    finally:
        storage.close()
    assert chunks[recent].ref in objects and chunks[old].ref not in objects
    adapter.drop_stages(recent)
    storage = bigquery_emulator.storage()
    try:
        assert chunks[recent].ref.split("/", 3)[3] not in {b.name for b in storage.list_blobs(bigquery_emulator.bucket)}
    finally:
        storage.close()


@pytest.mark.parametrize("keyed", [True, False], ids=["merge", "insert_rows_json"])
def test_stream_insert_keeps_every_type_and_hostile_text(
    adapter: BigQueryWarehouse, bigquery_emulator: BigQueryEmulator, bq_dataset: str, keyed: bool
) -> None:
    columns = {"id": S, "b": B, "n": INT, "f": F, "t": T, "s": S}
    target = AdapterContract().create(adapter, "h", columns, keys=("id",) if keyed else ())
    text = "line\nbreak 'quote' \"dq\" `bt` \\ ünï 😀 %s"
    rows = [
        {
            "eventn_ctx_event_id": "e1",
            "id": "a",
            "b": True,
            "n": 2**53 + 1,
            "f": 0.1,
            "t": "2026-11-01T10:00:00.5+02:00",
            "s": text,
        },
        {"eventn_ctx_event_id": "e2", "id": "b", "b": None, "n": None, "f": None, "t": None, "s": None},
    ]
    adapter.insert(target, [{k: v for k, v in row.items() if k in columns} for row in rows])
    got = _query(bigquery_emulator, f"SELECT id, b, n, f, CAST(t AS STRING), s FROM `{bq_dataset}`.h ORDER BY id")
    assert got[1] == ("b", None, None, None, None, None)
    assert got[0][:4] == ("a", True, 2**53 + 1, 0.1) and got[0][5] == text
    assert got[0][4].startswith("2026-11-01 08:00:00.5")


# --- exactly once: interrupted between stage and commit -----------------------------------------


def _batch(spark: Any, loaded: Any, fault: Any = None) -> Any:
    from eventspark.batch.process import run_pass
    from eventspark.coordination import MemoryCoordination

    return run_pass(loaded, MemoryCoordination("test"), fault=fault, session=spark)


def _config(root: Path, emulator: BigQueryEmulator, dataset: str, template: str, gcs: bool = True, **layout: Any):
    from tests.batch.helpers import make_config

    block = emulator.google_block(dataset, gcs=gcs)
    dest = {"type": "bigquery", "google": block, "data_layout": {"table_name_template": template, **layout}}
    return make_config(root, {"bq_pass": dest})  # staged objects: .../<job>/bq_pass/...


@pytest.mark.spark
@pytest.mark.parametrize("gcs", [True, False], ids=["gcs", "local"])
def test_crash_after_the_stage_or_the_commit_then_rerun_loads_every_event_once(
    spark: Any, tmp_path: Path, bigquery_emulator: BigQueryEmulator, bq_dataset: str, gcs: bool
) -> None:
    from tests.batch.helpers import event, put_log

    loaded = _config(tmp_path, bigquery_emulator, bq_dataset, "t", gcs=gcs)
    put_log(tmp_path, [event(str(i), n=i) for i in range(3)])

    def crash_when_staged(at: str) -> None:  # files staged, nothing loaded yet
        if at == "staged":
            raise SystemExit("crash between stage and commit")

    with pytest.raises(SystemExit):
        _batch(spark, loaded, fault=crash_when_staged)
    assert _batch(spark, loaded).ok

    log = put_log(tmp_path, [event(str(i), n=i) for i in range(3, 5)])

    def crash_when_committed(at: str) -> None:  # rows and markers in, status file not written
        if at == "committed":
            raise SystemExit("crash after the commit, before the status file")

    with pytest.raises(SystemExit):
        _batch(spark, loaded, fault=crash_when_committed)
    assert log.exists()
    assert _batch(spark, loaded).ok and not log.exists()

    ids = _query(bigquery_emulator, f"SELECT eventn_ctx_event_id FROM `{bq_dataset}`.t ORDER BY 1")
    assert ids == [(str(i),) for i in range(5)]
    # Nothing of the crashed passes is left: staged files, objects, staging tables.
    assert not [p for p in (tmp_path / "events" / "staging").rglob("*") if p.is_file()]
    storage = bigquery_emulator.storage()
    try:
        # (the bucket is the session's: other tests' dest_id is `bq`)
        objects = [b.name for b in storage.list_blobs(bigquery_emulator.bucket, prefix=f"{GCS_STAGE_FOLDER}/")]
        assert [name for name in objects if name.split("/")[2] == "bq_pass"] == []
    finally:
        storage.close()
    client = bigquery_emulator.bigquery()
    try:
        assert not [t.table_id for t in client.list_tables(bq_dataset) if t.table_id.startswith(STAGE_PREFIX)]
    finally:
        client.close()


@pytest.mark.spark
def test_batch_upserts_with_merge(spark: Any, tmp_path: Path, bigquery_emulator: BigQueryEmulator, bq_dataset: str):
    from tests.batch.helpers import event, put_log

    loaded = _config(tmp_path, bigquery_emulator, bq_dataset, "t", primary_key_fields=["eventn_ctx_event_id"])
    put_log(tmp_path, [event("a", n=1), event("b", n=1), event("a", n=2)])
    assert _batch(spark, loaded).ok
    put_log(tmp_path, [event("b", n=3), event("c", n=1)])
    assert _batch(spark, loaded).ok
    rows = _query(bigquery_emulator, f"SELECT eventn_ctx_event_id, n FROM `{bq_dataset}`.t ORDER BY 1")
    assert rows == [("a", 2), ("b", 3), ("c", 1)]


# --- end to end: `eventspark process` of EventNative's fixture log --------------------------------


@pytest.mark.spark
@pytest.mark.slow
def test_process_command_loads_the_fixture_log(
    tmp_path: Path, bigquery_emulator: BigQueryEmulator, bq_dataset: str
) -> None:
    from tests.batch.helpers import FIXTURE_LOG, MONTHLY, make_config, put_log

    dest = {
        "type": "bigquery",
        "google": bigquery_emulator.google_block(bq_dataset),
        "data_layout": {"table_name_template": MONTHLY},
    }
    make_config(tmp_path, {"bq": dest})
    log = put_log(tmp_path, FIXTURE_LOG)
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP")
    }
    cli = Path(sys.executable).with_name("eventspark")

    done = subprocess.run(
        [str(cli), "process", "-c", str(tmp_path / "eventspark.yaml")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "user_2020_08" in done.stdout and "1 log(s) archived" in done.stdout
    assert not log.exists()
    counts = {"notification_2020_08": 1, "null_2020_08": 1, "skipped_2020_08": 1, "user_2020_07": 1, "user_2020_08": 3}
    for table, count in counts.items():
        assert _query(bigquery_emulator, f"SELECT count(*) FROM `{bq_dataset}`.`{table}`") == [(count,)]
    client = bigquery_emulator.bigquery()
    try:
        schema = {f.name: f.field_type for f in client.get_table(f"{bq_dataset}.user_2020_08").schema}
    finally:
        client.close()
    # Mixed values of one column are promoted within the batch: "k" and 50.0 → STRING.
    assert schema["_timestamp"] == "TIMESTAMP" and schema["key10_sib1_1"] == "STRING"
    assert schema["_geo_data_zip"] == "INTEGER"
    values = _query(bigquery_emulator, f"SELECT key10_sib1_1 FROM `{bq_dataset}`.user_2020_08 ORDER BY 1 NULLS FIRST")
    assert values == [(None,), ("50.0",), ("k",)]
    # The event without _timestamp fails the template: one line in failed/.
    failed = tmp_path / "events" / "failed" / "failed.dst=bq.log"
    (failure,) = [json.loads(line) for line in failed.read_text().splitlines()]
    assert failure["event"] == {"_geo_data": {}, "event_type": "views", "key1000": "super value"}
    assert "Format" in failure["error"]
