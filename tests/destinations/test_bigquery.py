"""The adapter contract on bqemulator (staging on its fake GCS, and on local files), plus what is
BigQuery-specific: config and credentials, types read back, the commit's transaction, exactly-once
across crashes between stage and commit, and `eventspark process` of the fixture log."""

from __future__ import annotations

import json
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
from eventspark.destinations.bigquery.client import GCS_STAGE_FOLDER, BigQueryClient, key_of
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


def test_a_commit_whose_move_fails_leaves_nothing(adapter: BigQueryWarehouse, bq_dataset: str) -> None:
    """A failing cast in the move (the script's first statement: the marker insert never runs)
    leaves no rows, no markers and no staging tables. The second statement failing is
    `test_a_failing_marker_insert_leaves_no_rows`."""
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
    with pytest.raises(TransientError, match="bigquery: reading dataset"):
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
    names = {job: adapter.stage_table_name(job) for job in (old, recent)}
    client = bigquery_emulator.bigquery()
    try:
        for job in (old, recent):
            client.query(f"CREATE TABLE `{bq_dataset}`.`{names[job]}` (n INT64)").result()
    finally:
        client.close()
    chunks = {job: AdapterContract().stage(adapter, job, {"n": INT}, [[1]]) for job in (old, recent)}
    adapter.drop_stale_stages(time.time() - 3600)
    client = bigquery_emulator.bigquery()
    try:
        left = {t.table_id for t in client.list_tables(bq_dataset)}
    finally:
        client.close()
    assert left == {LOADS_TABLE, names[recent]}
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
    from tests.batch.helpers import FIXTURE_LOG, MONTHLY, make_config, put_log, run_cli

    dest = {
        "type": "bigquery",
        "google": bigquery_emulator.google_block(bq_dataset),
        "data_layout": {"table_name_template": MONTHLY},
    }
    make_config(tmp_path, {"bq": dest})
    log = put_log(tmp_path, FIXTURE_LOG)
    done = run_cli(tmp_path, "process")

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


# --- review fixes: quoting, connecting, keys ------------------------------------------------------


def test_dialect_quotes_and_literals_escape_with_backslashes(bigquery_emulator: BigQueryEmulator) -> None:
    """The contract's hostile table name cannot be a BigQuery table name, so the escaping is
    checked here: quote and literal text, and a literal read back unchanged by the emulator."""
    assert DIALECT.quote("a`b") == "`a\\`b`"
    assert DIALECT.quote("x\\`; DROP TABLE t; --") == "`x\\\\\\`; DROP TABLE t; --`"
    assert DIALECT.quote('co"l x') == '`co"l x`'
    assert DIALECT.literal("it's") == "'it\\'s'"
    assert DIALECT.literal("a\\'; DROP TABLE t; --") == "'a\\\\\\'; DROP TABLE t; --'"
    for bad in ("", "nul\x00", "line\nbreak"):
        with pytest.raises(ValueError):
            DIALECT.quote(bad)
    text = "a\\'; DROP TABLE t; -- ` \" ünï"
    assert _query(bigquery_emulator, f"SELECT {DIALECT.literal(text)}") == [(text,)]


def test_connecting_to_an_existing_dataset_only_reads_it(
    bigquery_emulator: BigQueryEmulator, bq_recorder: Any, bq_dataset: str, tmp_path: Path
) -> None:
    """A Data Editor of an existing dataset may not create datasets: connecting gets the dataset
    and creates it only when it is missing."""
    block = bigquery_emulator.google_block(bq_dataset, gcs=False, endpoint=bq_recorder.endpoint)
    first = build("bq", _destination(block | {"bq_location": "EU"}), tmp_path)
    first.read_tables()
    first.close()
    created = bq_recorder.bodies("POST", "/datasets")
    assert [(b["datasetReference"]["datasetId"], b.get("location")) for b in created] == [(bq_dataset, "EU")]
    bq_recorder.requests.clear()
    second = build("bq", _destination(block), tmp_path)
    second.read_tables()
    second.close()
    assert not [r for r in bq_recorder.requests if r[0] == "POST" and r[1].split("?")[0].endswith("/datasets")]
    assert [r for r in bq_recorder.requests if r[0] == "GET" and r[1].split("?")[0].endswith(f"/datasets/{bq_dataset}")]


def test_credentials_of_the_environment_win_over_anonymous_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    emulated = settings_of(_destination({"bq_project": "p", "bq_endpoint": "http://127.0.0.1:1"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/keys/sa.json")
    assert emulated.credentials(emulated.bq_endpoint) is None  # the library's default: that file


def test_primary_key_is_noted_after_the_users_description(
    adapter: BigQueryWarehouse, bigquery_emulator: BigQueryEmulator, bq_dataset: str
) -> None:
    """No PRIMARY KEY constraint (BigQuery's optimiser trusts it, and tables may hold duplicates):
    the key is a line appended to the table's description, whose text is kept."""
    adapter.patch(TablePatch("k", create=True, add_columns={"id": "STRING", "n": "INTEGER"}))
    client = bigquery_emulator.bigquery()
    try:
        table = client.get_table(f"{bq_dataset}.k")
        table.description = "Orders, by the shop team."
        client.update_table(table, ["description"])
        adapter.patch(TablePatch("k", primary_keys=("id",)))
        adapter.patch(TablePatch("k", primary_keys=("id", "n")))
        table = client.get_table(f"{bq_dataset}.k")
    finally:
        client.close()
    assert table.description == 'Orders, by the shop team.\n\neventspark primary key: ["id", "n"]'
    assert table.table_constraints is None or table.table_constraints.primary_key is None
    found = adapter.read_table("k")
    assert found is not None and found.primary_keys == ("id", "n")


# --- review fixes: the commit -----------------------------------------------------------------------


def _markers(bigquery_emulator: BigQueryEmulator, dataset: str) -> list[tuple[Any, ...]]:
    return _query(bigquery_emulator, f"SELECT file, table_name FROM `{dataset}`.{LOADS_TABLE} ORDER BY 1")


def test_a_commit_rerun_reattaches_to_the_job_that_committed_it(
    adapter: BigQueryWarehouse, bigquery_emulator: BigQueryEmulator, bq_dataset: str
) -> None:
    """The commit's query job has an id derived from the destination, table and files: a rerun of
    a pair whose job already ran (say the first pass lost the answer, and read the markers before
    the job finished) finds that job and waits for it instead of loading the rows again."""
    contract = AdapterContract()
    target = contract.create(adapter, "r", {"n": INT})
    adapter.commit(Load("d", target, [contract.stage(adapter, "jobr1", {"n": INT}, [[1]])], ["l1", "l2"]))
    adapter.commit(Load("d", target, [contract.stage(adapter, "jobr2", {"n": INT}, [[1]])], ["l2", "l1"]))
    assert _query(bigquery_emulator, f"SELECT n FROM `{bq_dataset}`.r") == [(1,)]
    assert _markers(bigquery_emulator, bq_dataset) == [("l1", "r"), ("l2", "r")]
    # Markers deleted by hand (a deliberate reload): the finished job no longer counts.
    _query(bigquery_emulator, f"DELETE FROM `{bq_dataset}`.{LOADS_TABLE} WHERE TRUE")
    adapter.commit(Load("d", target, [contract.stage(adapter, "jobr3", {"n": INT}, [[2]])], ["l1", "l2"]))
    assert _query(bigquery_emulator, f"SELECT n FROM `{bq_dataset}`.r ORDER BY n") == [(1,), (2,)]


def test_a_failed_commit_job_does_not_block_the_rerun(
    adapter: BigQueryWarehouse, bigquery_emulator: BigQueryEmulator, bq_dataset: str
) -> None:
    contract = AdapterContract()
    target = contract.create(adapter, "x", {"n": INT})
    with pytest.raises(TerminalError):
        adapter.commit(Load("d", target, [contract.stage(adapter, "jobx1", {"n": S}, [["nope"]])], ["l1"]))
    adapter.commit(Load("d", target, [contract.stage(adapter, "jobx2", {"n": INT}, [[3]])], ["l1"]))
    assert _query(bigquery_emulator, f"SELECT n FROM `{bq_dataset}`.x") == [(3,)]
    assert _markers(bigquery_emulator, bq_dataset) == [("l1", "x")]


def test_a_failing_marker_insert_leaves_no_rows(
    adapter: BigQueryWarehouse, bigquery_emulator: BigQueryEmulator, bq_dataset: str
) -> None:
    """The markers are the script's second statement: when it fails, the first (the rows) is not
    kept either. Made to fail by a marker table whose `file` column cannot take the file names."""
    contract = AdapterContract()
    target = contract.create(adapter, "m", {"n": INT})
    _query(bigquery_emulator, f"DROP TABLE `{bq_dataset}`.{LOADS_TABLE}")
    columns = "dest_id STRING, file INT64, table_name STRING, loaded_at TIMESTAMP"
    _query(bigquery_emulator, f"CREATE TABLE `{bq_dataset}`.{LOADS_TABLE} ({columns})")
    with pytest.raises(TerminalError, match="loading table 'm'"):
        adapter.commit(Load("d", target, [contract.stage(adapter, "jobm", {"n": INT}, [[1]])], ["l1"]))
    assert _query(bigquery_emulator, f"SELECT n FROM `{bq_dataset}`.m") == []
    assert not [t for t in _tables(bigquery_emulator, bq_dataset) if t.startswith(STAGE_PREFIX)]


def test_a_script_failing_at_run_time_in_its_second_statement_keeps_nothing(
    adapter: BigQueryWarehouse, bigquery_emulator: BigQueryEmulator, bq_dataset: str
) -> None:
    """The second statement fails on a value only the first one wrote, so no check of the script
    before running it can see the failure: the first statement's row is rolled back."""
    contract = AdapterContract()
    contract.create(adapter, "a", {"n": INT})
    contract.create(adapter, "b", {"n": INT})
    a, b = adapter.name("a"), adapter.name("b")
    client = adapter._connection()
    assert isinstance(client, BigQueryClient)
    with pytest.raises(TerminalError, match="bigquery: testing: 400"), client.transaction("testing"):
        client.execute(f"INSERT INTO {a} (n) VALUES (5)", "testing")
        client.execute(
            f"INSERT INTO {b} (n) SELECT CAST(CONCAT(CAST(n AS STRING), 'x') AS INT64) FROM {a} WHERE n = 5",
            "testing",
        )
    assert _query(bigquery_emulator, f"SELECT n FROM `{bq_dataset}`.a") == []


def _tables(bigquery_emulator: BigQueryEmulator, dataset: str) -> set[str]:
    client = bigquery_emulator.bigquery()
    try:
        return {t.table_id for t in client.list_tables(dataset)}
    finally:
        client.close()


def test_staging_tables_are_named_after_their_destination(
    bigquery_emulator: BigQueryEmulator, bq_dataset: str, tmp_path: Path
) -> None:
    """Two destinations sharing a dataset each drop only their own staging tables."""
    block = bigquery_emulator.google_block(bq_dataset, gcs=False)
    mine, theirs = build("bq", _destination(block), tmp_path), build("bq2", _destination(block), tmp_path)
    job = new_job_id(time.time() - 7200)
    try:
        mine.read_tables()
        kept = mine.stage_table_name(job)
        for name in (kept, theirs.stage_table_name(job)):
            _query(bigquery_emulator, f"CREATE TABLE `{bq_dataset}`.`{name}` (n INT64)")
        theirs.drop_stages(job)
        assert _tables(bigquery_emulator, bq_dataset) == {LOADS_TABLE, kept}
        mine.drop_stale_stages(time.time() - 3600)
        assert _tables(bigquery_emulator, bq_dataset) == {LOADS_TABLE}
    finally:
        mine.close()
        theirs.close()


# --- review fixes: stream -------------------------------------------------------------------------


def _recorded_adapter(bigquery_emulator: BigQueryEmulator, recorder: Any, dataset: str, tmp_path: Path):
    block = bigquery_emulator.google_block(dataset, gcs=False, endpoint=recorder.endpoint)
    return build("bq", _destination(block), tmp_path)


def test_streamed_rows_carry_their_event_id_as_insert_id(
    bigquery_emulator: BigQueryEmulator, bq_recorder: Any, bq_dataset: str, tmp_path: Path
) -> None:
    """What is sent (the emulator does not de-duplicate by insert id, so de-duplication itself is
    not shown here): each row's `insertId` is its eventn_ctx_event_id."""
    adapter = _recorded_adapter(bigquery_emulator, bq_recorder, bq_dataset, tmp_path)
    try:
        target = AdapterContract().create(adapter, "s", {"eventn_ctx_event_id": S, "n": INT})
        adapter.insert(target, [{"eventn_ctx_event_id": "e1", "n": 1}, {"eventn_ctx_event_id": "e2", "n": 2}])
    finally:
        adapter.close()
    (body,) = bq_recorder.bodies("POST", "/insertAll")
    assert [(r["insertId"], r["json"]["n"]) for r in body["rows"]] == [("e1", 1), ("e2", 2)]


def _insert_errors(*rows: tuple[int, str, str]) -> tuple[int, bytes]:
    errors = [
        {"index": i, "errors": [{"reason": reason, "location": "", "message": message}]} for i, reason, message in rows
    ]
    return 200, json.dumps({"kind": "bigquery#tableDataInsertAllResponse", "insertErrors": errors}).encode()


def test_streaming_refusals_are_classified_by_reason(
    bigquery_emulator: BigQueryEmulator, bq_recorder: Any, bq_dataset: str, tmp_path: Path
) -> None:
    """BigQuery's answers the emulator never gives, sent by the proxy: rows stopped because of
    another row, or a just-added column the streaming backend does not know yet, are transient;
    a row invalid for another reason is terminal, and names its row."""
    adapter = _recorded_adapter(bigquery_emulator, bq_recorder, bq_dataset, tmp_path)
    answers: list[tuple[int, bytes]] = []
    bq_recorder.answer = lambda method, path, body: answers.pop(0) if "/insertAll" in path and answers else None
    try:
        contract = AdapterContract()
        target = contract.create(adapter, "q", {"eventn_ctx_event_id": S, "n": INT})
        adapter.patch(TablePatch("q", add_columns={"c": "STRING"}))
        target = adapter.read_table("q")
        assert target is not None
        rows = [{"eventn_ctx_event_id": "e1", "n": 1, "c": "x"}, {"eventn_ctx_event_id": "e2", "n": 2}]
        cases: list[tuple[tuple[int, bytes], type[Exception], str]] = [
            (_insert_errors((0, "stopped", ""), (1, "backendError", "")), TransientError, "retry"),
            (_insert_errors((0, "invalid", "no such field: c."), (1, "stopped", "")), TransientError, "c"),
            (_insert_errors((0, "invalid", "no such field: zz."), (1, "stopped", "")), TerminalError, "row 0"),
            (
                _insert_errors((1, "invalid", "Cannot convert value to integer."), (0, "stopped", "")),
                TerminalError,
                "row 1",
            ),
            (
                (
                    404,
                    json.dumps(
                        {
                            "error": {
                                "code": 404,
                                "message": "Not found: Table test-proj:x.q",
                                "errors": [{"reason": "notFound", "message": "Not found: Table test-proj:x.q"}],
                            }
                        }
                    ).encode(),
                ),
                TransientError,
                "not found",
            ),
        ]
        for answer, kind, text in cases:
            answers.append(answer)
            with pytest.raises(kind, match=text):
                adapter.insert(target, rows)
        adapter.insert(target, rows)  # answered by the emulator
    finally:
        adapter.close()
    got = _query(bigquery_emulator, f"SELECT eventn_ctx_event_id, c FROM `{bq_dataset}`.q ORDER BY 1")
    assert got == [("e1", "x"), ("e2", None)]


def test_stream_delivery_fails_only_the_invalid_row(
    bigquery_emulator: BigQueryEmulator, bq_recorder: Any, bq_dataset: str, tmp_path: Path
) -> None:
    """A request with an invalid row: BigQuery stores none of its rows, marks the others
    `stopped`; the stream's delivery splits the batch until the invalid row is alone, so only it
    goes to failed/."""
    from eventspark.coordination import MemoryCoordination
    from eventspark.steps.chain import Row
    from eventspark.stream.delivery import TableDelivery

    def answer(method: str, path: str, body: bytes) -> tuple[int, bytes] | None:
        if "/insertAll" not in path:
            return None
        rows = json.loads(body)["rows"]
        bad = [i for i, r in enumerate(rows) if r["json"].get("s") == "poison"]
        if not bad:
            return None
        return _insert_errors(
            *((i, "invalid" if i in bad else "stopped", "bad" if i in bad else "") for i in range(len(rows)))
        )

    bq_recorder.answer = answer
    adapter = _recorded_adapter(bigquery_emulator, bq_recorder, bq_dataset, tmp_path)
    try:
        delivery = TableDelivery("bq", adapter, MemoryCoordination("test"))
        rows = [Row("d", {"eventn_ctx_event_id": f"e{i}", "s": "poison" if i == 2 else "ok"}, {}) for i in range(5)]
        errors = delivery.deliver("d", rows)
    finally:
        adapter.close()
    assert [e is not None for e in errors] == [False, False, True, False, False]
    got = _query(bigquery_emulator, f"SELECT eventn_ctx_event_id FROM `{bq_dataset}`.d ORDER BY 1")
    assert got == [("e0",), ("e1",), ("e3",), ("e4",)]


def test_stream_merge_parses_json_columns_and_keeps_big_integers(
    adapter: BigQueryWarehouse, bigquery_emulator: BigQueryEmulator, bq_dataset: str
) -> None:
    adapter.patch(
        TablePatch("j", create=True, add_columns={"id": "STRING", "n": "INTEGER", "doc": "JSON"}, primary_keys=("id",))
    )
    target = adapter.read_table("j")
    assert target is not None
    adapter.insert(target, [{"id": "a", "n": 2**63 - 1, "doc": '{"k": [1, "x"]}'}])
    adapter.insert(target, [{"id": "a", "n": -(2**53) - 1, "doc": '{"k": 2}'}, {"id": "b", "n": 1, "doc": None}])
    got = _query(bigquery_emulator, f"SELECT id, n, TO_JSON_STRING(doc) FROM `{bq_dataset}`.j ORDER BY id")
    assert got == [("a", -(2**53) - 1, '{"k":2}'), ("b", 1, None)]


def _error(code: int, reason: str, message: str) -> bytes:
    return json.dumps(
        {"error": {"code": code, "message": message, "errors": [{"reason": reason, "message": message}]}}
    ).encode()


def _commit_job_of(method: str, path: str, body: bytes) -> str | None:
    if method == "POST" and path.split("?")[0].endswith("/jobs") and b"eventspark_commit_" in body:
        return str(json.loads(body)["jobReference"]["jobId"])
    return None


def test_a_commit_whose_answer_is_lost_commits_once(
    bigquery_emulator: BigQueryEmulator, bq_recorder: Any, bq_dataset: str, tmp_path: Path
) -> None:
    """The commit job reaches the server, but its answer is lost (the proxy turns it into a 503);
    the client library sends the request again, which BigQuery refuses with 409 as a duplicate
    job id (the proxy answers that: the emulator would run the job a second time). The commit
    finds its job, waits for it and succeeds: rows and markers once."""
    submitted: list[str] = []

    def answer(method: str, path: str, body: bytes) -> tuple[int, bytes] | None:
        job_id = _commit_job_of(method, path, body)
        if job_id is not None and job_id in submitted:
            return 409, _error(409, "duplicate", f"Already Exists: Job test-proj:US.{job_id}")
        return None

    def rewrite(method: str, path: str, body: bytes, status: int, payload: bytes) -> tuple[int, bytes] | None:
        job_id = _commit_job_of(method, path, body)
        if job_id is not None and status == 200 and job_id not in submitted:
            submitted.append(job_id)
            return 503, _error(503, "backendError", "the answer was lost")
        return None

    bq_recorder.answer, bq_recorder.rewrite = answer, rewrite
    adapter = _recorded_adapter(bigquery_emulator, bq_recorder, bq_dataset, tmp_path)
    try:
        contract = AdapterContract()
        target = contract.create(adapter, "lost", {"n": INT})
        adapter.commit(Load("d", target, [contract.stage(adapter, "jobl", {"n": INT}, [[1], [2]])], ["l1"]))
    finally:
        adapter.close()
    assert len(submitted) == 1
    assert len([r for r in bq_recorder.requests if _commit_job_of(*r) == submitted[0]]) == 2
    assert _query(bigquery_emulator, f"SELECT n FROM `{bq_dataset}`.lost ORDER BY n") == [(1,), (2,)]
    assert _markers(bigquery_emulator, bq_dataset) == [("l1", "lost")]


def test_a_commit_that_cannot_read_its_result_waits_for_its_job(
    bigquery_emulator: BigQueryEmulator, bq_recorder: Any, bq_dataset: str, tmp_path: Path
) -> None:
    """Reading the commit job's result fails (the proxy answers the first read with an error):
    the commit asks for the job itself, finds it done without error, and reports the pair
    committed rather than failed."""
    failed: list[str] = []

    def answer(method: str, path: str, body: bytes) -> tuple[int, bytes] | None:
        if method == "GET" and "/queries/eventspark_commit_" in path and not failed:
            failed.append(path)
            return 400, _error(400, "invalid", "the result could not be read")
        return None

    bq_recorder.answer = answer
    adapter = _recorded_adapter(bigquery_emulator, bq_recorder, bq_dataset, tmp_path)
    try:
        contract = AdapterContract()
        target = contract.create(adapter, "w", {"n": INT})
        adapter.commit(Load("d", target, [contract.stage(adapter, "jobw", {"n": INT}, [[1]])], ["l1"]))
    finally:
        adapter.close()
    assert failed
    assert _query(bigquery_emulator, f"SELECT n FROM `{bq_dataset}`.w") == [(1,)]


# --- error classification, on the exceptions google-api-core raises ---------------------------------


def test_query_refusals_that_go_away_are_transient() -> None:
    """Real-BigQuery-only refusals (not observed here: the emulator has no streaming buffer and no
    DML queue), classified by their documented messages on api-core's own exception objects."""
    from google.api_core import exceptions as api_errors

    from eventspark.destinations.bigquery.client import job_error, translated_errors

    def kind(exc: Exception) -> type[Exception]:
        with pytest.raises((TransientError, TerminalError)) as raised, translated_errors("testing"):
            raise exc
        return type(raised.value)

    buffer = (
        "UPDATE or DELETE statement over table p.d.t would affect rows in the streaming buffer, which is not supported"
    )
    dml = (
        "Resources exceeded during query execution: Too many DML statements outstanding against table p:d.t, "
        "limit is 20."
    )
    serialize = "Could not serialize access to table p:d.t due to concurrent update"
    for message, reason in [(buffer, "invalidQuery"), (dml, "resourcesExceeded"), (serialize, "invalidQuery")]:
        assert kind(api_errors.BadRequest(message, errors=[{"reason": reason, "message": message}])) is TransientError
        assert isinstance(job_error({"reason": reason, "message": message}, "testing"), TransientError)
    assert (
        kind(api_errors.Forbidden("Exceeded rate limits", errors=[{"reason": "rateLimitExceeded"}])) is TransientError
    )
    assert kind(api_errors.InternalServerError("oops")) is TransientError
    bad = "Unrecognized name: nope at [1:8]"
    assert kind(api_errors.BadRequest(bad, errors=[{"reason": "invalidQuery", "message": bad}])) is TerminalError
    assert kind(api_errors.Forbidden("Access Denied", errors=[{"reason": "accessDenied"}])) is TerminalError
    assert isinstance(job_error({"reason": "invalidQuery", "message": bad}, "testing"), TerminalError)


def test_streaming_row_refusals_by_reason() -> None:
    from eventspark.destinations.bigquery.client import insert_errors_failure

    def rows(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
        return [{"index": i, "errors": [{"reason": r, "message": m}]} for i, (r, m) in enumerate(pairs)]

    never = lambda fields: False  # noqa: E731
    always = lambda fields: True  # noqa: E731
    for reason in ("stopped", "backendError", "internalError", "timeout"):
        assert isinstance(insert_errors_failure(rows((reason, "")), 1, "t", never), TransientError)
    mixed = insert_errors_failure(rows(("stopped", ""), ("invalid", "Cannot convert value to integer.")), 2, "t", never)
    assert isinstance(mixed, TerminalError) and "1 of 2 rows invalid: row 1: Cannot convert" in str(mixed)
    lag = rows(("invalid", "no such field: new_col."), ("stopped", ""))
    assert isinstance(insert_errors_failure(lag, 2, "t", always), TransientError)
    assert isinstance(insert_errors_failure(lag, 2, "t", never), TerminalError)
    seen: list[frozenset[str]] = []
    insert_errors_failure(lag, 2, "t", lambda fields: seen.append(fields) or True)
    assert seen == [frozenset({"new_col"})]
    both = rows(("invalid", "no such field: new_col."), ("invalid", "Cannot convert value to integer."))
    assert isinstance(insert_errors_failure(both, 2, "t", always), TerminalError)


def test_alter_fallback_only_after_the_emulators_refusal() -> None:
    from google.api_core import exceptions as api_errors

    from eventspark.destinations.bigquery.load import one_alter_only

    refusal = api_errors.BadRequest("Only one ALTER command per statement is supported")
    other = api_errors.Forbidden("Exceeded rate limits: too many table update operations for this table")
    assert one_alter_only(_terminal(refusal)) and not one_alter_only(_terminal(other))


def _terminal(exc: Exception) -> TerminalError:
    error = TerminalError(f"bigquery: testing: {exc}")
    error.__cause__ = exc
    return error


# --- exactly once: a pass killed between the load job and the transaction -------------------------


@pytest.mark.spark
def test_a_pass_killed_after_the_load_job_then_rerun_loads_every_event_once(
    spark: Any, tmp_path: Path, bigquery_emulator: BigQueryEmulator, bq_dataset: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit's load job has filled the staging table, then the pass dies before the
    transaction (SystemExit from a wrapper around the client's `load`: batch/ has no fault point
    inside a commit). Nothing reached the table or the markers; the rerun loads every event once
    and no staging table, staged file or object is left."""
    from tests.batch.helpers import event, put_log

    loaded = _config(tmp_path, bigquery_emulator, bq_dataset, "t", gcs=True)
    log = put_log(tmp_path, [event(str(i), n=i) for i in range(4)])
    real_load = BigQueryClient.load
    seen: list[set[str]] = []

    def load_then_die(self: BigQueryClient, name: str, refs: Any, doing: str) -> None:
        real_load(self, name, refs, doing)
        seen.append(_tables(bigquery_emulator, bq_dataset))
        raise SystemExit("killed after the load job")

    monkeypatch.setattr(BigQueryClient, "load", load_then_die)
    with pytest.raises(SystemExit):
        _batch(spark, loaded)
    monkeypatch.undo()
    assert [t for t in seen[0] if t.startswith(STAGE_PREFIX)], "the load job had filled a staging table"
    assert _query(bigquery_emulator, f"SELECT count(*) FROM `{bq_dataset}`.t") == [(0,)]
    assert _markers(bigquery_emulator, bq_dataset) == []
    assert log.exists()

    assert _batch(spark, loaded).ok and not log.exists()
    ids = _query(bigquery_emulator, f"SELECT eventn_ctx_event_id FROM `{bq_dataset}`.t ORDER BY 1")
    assert ids == [(str(i),) for i in range(4)]
    assert not [t for t in _tables(bigquery_emulator, bq_dataset) if t.startswith(STAGE_PREFIX)]
    assert not [p for p in (tmp_path / "events" / "staging").rglob("*") if p.is_file()]
    storage = bigquery_emulator.storage()
    try:
        objects = [b.name for b in storage.list_blobs(bigquery_emulator.bucket, prefix=f"{GCS_STAGE_FOLDER}/")]
    finally:
        storage.close()
    assert [name for name in objects if name.split("/")[2] == "bq_pass"] == []


def test_a_commit_whose_job_cannot_be_reached_keeps_its_stage_and_the_rerun_finds_the_job(
    bigquery_emulator: BigQueryEmulator,
    bq_recorder: Any,
    bq_dataset: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The commit job runs on the server, then every request about it fails (503) until the
    commit gives up: OutcomeUnknown (transient), staging table kept (the job could still need
    it). Once the API answers again, the rerun of the pair finds the job done and its markers in,
    and loads nothing again."""
    from google.cloud.bigquery.retry import DEFAULT_RETRY

    from eventspark.destinations.bigquery import client as bq_client
    from eventspark.destinations.bigquery.client import OutcomeUnknown

    monkeypatch.setattr(bq_client, "RETRY", DEFAULT_RETRY.with_deadline(0.5))
    monkeypatch.setattr(bq_client, "SETTLE_SECONDS", 0.5)
    lost: list[str] = []

    def about_the_job(method: str, path: str, body: bytes) -> bool:
        route = path.split("?")[0]
        return bool(lost) and (
            _commit_job_of(method, path, body) == lost[0] or route.endswith((f"/jobs/{lost[0]}", f"/queries/{lost[0]}"))
        )

    def answer(method: str, path: str, body: bytes) -> tuple[int, bytes] | None:
        return (503, _error(503, "backendError", "unreachable")) if about_the_job(method, path, body) else None

    def rewrite(method: str, path: str, body: bytes, status: int, payload: bytes) -> tuple[int, bytes] | None:
        job_id = _commit_job_of(method, path, body)
        if job_id is not None and not lost:
            lost.append(job_id)
            return 503, _error(503, "backendError", "unreachable")
        return None

    bq_recorder.answer, bq_recorder.rewrite = answer, rewrite
    adapter = _recorded_adapter(bigquery_emulator, bq_recorder, bq_dataset, tmp_path)
    contract = AdapterContract()
    try:
        target = contract.create(adapter, "u", {"n": INT})
        with pytest.raises(OutcomeUnknown, match="may still commit"):
            adapter.commit(Load("d", target, [contract.stage(adapter, "jobu1", {"n": INT}, [[1]])], ["l1"]))
        assert [t for t in _tables(bigquery_emulator, bq_dataset) if t.startswith(STAGE_PREFIX)]
        assert _query(bigquery_emulator, f"SELECT n FROM `{bq_dataset}`.u") == [(1,)]  # it did commit
        bq_recorder.answer = bq_recorder.rewrite = None  # the API answers again
        adapter.commit(Load("d", target, [contract.stage(adapter, "jobu2", {"n": INT}, [[1]])], ["l1"]))
        assert _query(bigquery_emulator, f"SELECT n FROM `{bq_dataset}`.u") == [(1,)]
        adapter.drop_stages("jobu1")
        assert not [t for t in _tables(bigquery_emulator, bq_dataset) if t.startswith(STAGE_PREFIX)]
    finally:
        adapter.close()


def test_stream_merges_into_one_table_run_one_at_a_time(
    bigquery_emulator: BigQueryEmulator, bq_recorder: Any, bq_dataset: str, tmp_path: Path
) -> None:
    """Keyed stream inserts of several workers (adapters) of this process into one table: the
    proxy sees at most one MERGE job in flight (BigQuery queues few mutating DML per table)."""
    import threading

    flight = {"now": 0, "most": 0}
    guard = threading.Lock()

    def is_merge(method: str, path: str, body: bytes) -> bool:
        return method == "POST" and path.split("?")[0].endswith("/jobs") and b"MERGE" in body

    def answer(method: str, path: str, body: bytes) -> tuple[int, bytes] | None:
        if is_merge(method, path, body):
            with guard:
                flight["now"] += 1
                flight["most"] = max(flight["most"], flight["now"])
            time.sleep(0.2)
        return None

    def rewrite(method: str, path: str, body: bytes, status: int, payload: bytes) -> tuple[int, bytes] | None:
        if is_merge(method, path, body):
            with guard:
                flight["now"] -= 1
        return None

    adapters = [_recorded_adapter(bigquery_emulator, bq_recorder, bq_dataset, tmp_path) for _ in range(3)]
    try:
        target = AdapterContract().create(adapters[0], "dml", {"id": S, "n": INT}, keys=("id",))
        bq_recorder.answer, bq_recorder.rewrite = answer, rewrite
        errors: list[BaseException] = []

        def work(k: int) -> None:
            try:
                for i in range(2):
                    adapters[k].insert(target, [{"id": f"{k}-{i}", "n": i}])
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        for adapter in adapters:
            adapter.close()
    assert errors == []
    assert flight["most"] == 1
    assert _query(bigquery_emulator, f"SELECT count(*) FROM `{bq_dataset}`.dml") == [(6,)]
