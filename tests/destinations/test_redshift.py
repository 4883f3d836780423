"""Redshift: the adapter contract on the machine's PostgreSQL 15 (Redshift speaks its protocol; no
emulator runs Redshift), without and with S3 staging on moto, plus what is Redshift-specific:
the COPY statement (as text: PostgreSQL cannot read from S3), literals both servers read alike,
exactly-once across a crash between COPY and marker, and end-to-end loads of EventNative's
fixture log.

`MotoRedshift` is the one stand-in: it replaces only `_run_copy`, the server-side run of the
`COPY ... FROM 's3://...' MANIFEST` that the real `_copy_from_s3` builds, by reading the
manifest and its objects from moto and COPYing their rows FROM STDIN into the same staging
table. Uploads, manifests, the commit's SQL, markers and deletions all run for real against
moto and PostgreSQL.
"""

from __future__ import annotations

import contextlib
import gzip
import re
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from eventspark.destinations.base import ORDER_COLUMN, Load, TerminalError, TransientError, new_job_id
from eventspark.destinations.redshift import s3
from eventspark.destinations.redshift.client import RedshiftClient, stage_column, translated_errors
from eventspark.destinations.redshift.configuration import RedshiftDestination
from eventspark.destinations.redshift.dialect import DIALECT
from eventspark.destinations.redshift.load import RedshiftWarehouse
from eventspark.steps.diff import Table, TablePatch
from eventspark.steps.typing import DataType
from tests.conftest import pg_conninfo
from tests.destinations.contract import AdapterContract
from tests.destinations.proxy import TcpProxy
from tests.emulators.s3 import S3_KEY_ID, S3_REGION, S3_SECRET, s3_client

B, INT, F, T, S = DataType.BOOL, DataType.INT64, DataType.FLOAT64, DataType.TIMESTAMP, DataType.STRING
FOLDER = "stage/es"


class MotoRedshift(RedshiftWarehouse):
    """The Redshift adapter with the server-side COPY from S3 played by the test (see the module
    docstring); `copies` keeps the COPY statements Redshift would have run."""

    def __init__(self, dest_id: str, dest: RedshiftDestination) -> None:
        super().__init__(dest_id, dest)
        self.copies: list[str] = []

    def _run_copy(self, client: RedshiftClient, statement: str, staging: str, manifest_key: str, doing: str) -> None:
        assert self.s3 is not None
        self.copies.append(statement)  # built by the real `_copy_from_s3`
        storage = self.s3.client()
        entries = orjson.loads(storage.get_object(Bucket=self.s3.bucket, Key=manifest_key)["Body"].read())["entries"]
        rows: list[dict[str, Any]] = []
        for entry in entries:
            bucket, _, key = entry["url"].removeprefix("s3://").partition("/")
            try:
                body = storage.get_object(Bucket=bucket, Key=key)["Body"].read()
            except storage.exceptions.NoSuchKey:
                raise TerminalError(f"redshift: {doing}: mandatory manifest entry {entry['url']} not found") from None
            rows += [orjson.loads(line) for line in gzip.decompress(body).splitlines()]
        columns = list(dict.fromkeys(c for row in rows for c in row))
        if not columns:
            return
        names = ", ".join(DIALECT.quote(c) for c in columns)
        statement = f"COPY {staging} ({names}) FROM STDIN".encode()
        with translated_errors(doing), client.conn.cursor() as cur, cur.copy(statement) as copy:
            for row in rows:
                copy.write_row([row.get(c) for c in columns])


def destination(datasource: dict[str, Any], s3_block: dict[str, Any] | None = None) -> RedshiftDestination:
    config: dict[str, Any] = {"type": "redshift", "datasource": datasource}
    if s3_block is not None:
        config["s3"] = s3_block
    return RedshiftDestination.model_validate(config)


def s3_block(endpoint: str, bucket: str) -> dict[str, Any]:
    return {
        "access_key_id": S3_KEY_ID,
        "secret_access_key": S3_SECRET,
        "bucket": bucket,
        "region": S3_REGION,
        "endpoint": endpoint,
        "folder": FOLDER,
    }


def keys_in(endpoint: str, bucket: str) -> list[str]:
    return s3.list_keys(s3_client(endpoint), bucket, "")


def pg(sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_conninfo()) as conn:
        return conn.execute(sql.encode(), params or None).fetchall()


class TestRedshiftAdapter(AdapterContract):
    """Without `s3`: staging tables filled with INSERTs by the executors."""

    @pytest.fixture
    def adapter(self, pg_datasource: dict[str, Any]) -> Iterator[RedshiftWarehouse]:
        adapter = RedshiftWarehouse("rs", destination(pg_datasource))
        yield adapter
        adapter.close()

    def query(self, adapter: Any, sql: str) -> list[tuple[Any, ...]]:
        return pg(sql)

    def test_types_read_back_as_created(self, adapter: RedshiftWarehouse) -> None:
        table = self.create(adapter, "k", {"a": S, "b": INT, "c": F, "d": T, "e": B}, keys=("a",))
        assert table.columns == {
            "a": "character varying(65535)",
            "b": "bigint",
            "c": "numeric(38,18)",
            "d": "timestamp without time zone",
            "e": "boolean",
        }
        assert [adapter.data_type_of(t) for t in table.columns.values()] == [S, INT, F, T, B]

    def test_primary_key_gets_eventnative_constraint_name_and_can_change(
        self, adapter: RedshiftWarehouse, pg_schema: str
    ) -> None:
        self.create(adapter, "k", {"a": S, "b": S}, keys=("a",))
        names = "SELECT conname FROM pg_constraint WHERE conname LIKE %s"
        assert pg(names, f"{pg_schema}%") == [(f"{pg_schema}_k_pk",)]
        adapter.patch(TablePatch("k", primary_keys=("a", "b")))
        found = adapter.read_table("k")
        assert found is not None and found.primary_keys == ("a", "b")

    def test_a_column_another_node_added_is_not_added_again(self, adapter: RedshiftWarehouse) -> None:
        self.create(adapter, "d", {"a": S})
        adapter.patch(TablePatch("d", add_columns={"b": "bigint"}))
        # A node that read the table before `b` existed patches it again, with a new column too.
        adapter.patch(TablePatch("d", add_columns={"b": "bigint", "c": "boolean"}))
        found = adapter.read_table("d")
        assert found is not None and list(found.columns) == ["a", "b", "c"]

    def test_duplicate_column_error_is_not_swallowed(self, adapter: RedshiftWarehouse, pg_schema: str) -> None:
        """It has aborted the patch's transaction (see test_a_column_added_under_the_patch_fails_it_whole)."""
        self.create(adapter, "d", {"a": S})
        client = adapter._connection()
        with pytest.raises(TerminalError) as caught:
            client.execute(f'ALTER TABLE "{pg_schema}"."d" ADD COLUMN "a" bigint', "adding")
        assert not adapter._is_duplicate_column(caught.value)

    def test_stage_tables_hold_text_in_hashed_columns_and_are_hidden(
        self, adapter: RedshiftWarehouse, pg_schema: str
    ) -> None:
        chunk = self.stage(adapter, "jobt", {"n": INT, "ok": B, "x": F, ORDER_COLUMN: INT}, [[1, True, 1e-07, 3]])
        columns = pg(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = %s ORDER BY ordinal_position",
            pg_schema,
            chunk.ref,
        )
        assert columns == [
            (stage_column("n"), "character varying"),
            (stage_column("ok"), "character varying"),
            (stage_column("x"), "character varying"),
            (ORDER_COLUMN, "bigint"),
        ]
        assert pg(f'SELECT * FROM "{pg_schema}"."{chunk.ref}"') == [("1", "true", "0.0000001", 3)]
        assert adapter.read_tables() == {}

    def test_stream_values_keep_quotes_backslashes_and_offsets(self, adapter: RedshiftWarehouse) -> None:
        target = self.create(adapter, "v", {"id": S, "s": S, "t": T, "f": F, "b": B}, keys=("id",))
        hostile = "'); DROP TABLE x; -- \\ \\' %s %% ünï 😀"
        adapter.insert(
            target, [{"id": "a\\b", "s": hostile, "t": "2020-08-02T18:23:56.5+02:00", "f": 1e-07, "b": True}]
        )
        adapter.insert(target, [{"id": "a\\b", "s": hostile + "!", "t": None, "f": 2.5, "b": False}])
        rows = pg(f"SELECT id, s, CAST(t AS VARCHAR), CAST(f AS VARCHAR), b FROM {self.name(adapter, 'v')}")
        assert rows == [("a\\b", hostile + "!", None, "2.500000000000000000", False)]

    def test_markers_of_names_with_backslashes(self, adapter: RedshiftWarehouse) -> None:
        target = self.create(adapter, "m\\n", {"n": INT})
        chunk = self.stage(adapter, "jobm", {"n": INT}, [[1]])
        adapter.commit(Load("d\\x", target, [chunk], ["log\\1"]))
        assert adapter.loaded_files("d\\x", ["log\\1", "log\\2"]) == {("log\\1", "m\\n")}
        ((loaded_at,),) = pg(f"SELECT loaded_at FROM {self.name(adapter, '_eventspark_loads')}")
        assert abs(time.time() - loaded_at.replace(tzinfo=__import__("datetime").UTC).timestamp()) < 120

    def test_unreachable_server_is_transient(self, pg_datasource: dict[str, Any]) -> None:
        adapter = RedshiftWarehouse("rs", destination({**pg_datasource, "port": 1}))
        with pytest.raises(TransientError, match="redshift: connecting"):
            adapter.read_tables()


class TestRedshiftS3Adapter(AdapterContract):
    """With `s3` on moto: executors upload gzip JSON, the commit COPYs one manifest per pair."""

    @pytest.fixture
    def adapter(self, pg_datasource: dict[str, Any], moto_s3: str, s3_bucket: str) -> Iterator[MotoRedshift]:
        adapter = MotoRedshift("rs", destination(pg_datasource, s3_block(moto_s3, s3_bucket)))
        yield adapter
        adapter.close()

    def query(self, adapter: Any, sql: str) -> list[tuple[Any, ...]]:
        return pg(sql)

    def test_chunks_are_gzip_json_under_the_job_folder_and_go_after_the_commit(
        self, adapter: MotoRedshift, moto_s3: str, s3_bucket: str
    ) -> None:
        target = self.create(adapter, "o", {"n": INT, "ok": B})
        one = self.stage(adapter, "jobo", {"n": INT, "ok": B}, [[1, True], [None, False]])
        two = self.stage(adapter, "jobo", {"n": INT}, [[2]])
        assert one.ref.startswith(f"{FOLDER}/jobo/rs/") and one.ref.endswith(".json.gz")
        body = s3_client(moto_s3).get_object(Bucket=s3_bucket, Key=one.ref)["Body"].read()
        lines = [orjson.loads(line) for line in gzip.decompress(body).splitlines()]
        assert lines == [{stage_column("n"): "1", stage_column("ok"): "true"}, {stage_column("ok"): "false"}]

        adapter.commit(Load("d", target, [one, two], ["l1"]))

        assert len(adapter.copies) == 1, "one COPY per pair"
        assert sorted(pg(f"SELECT n, ok FROM {self.name(adapter, 'o')}"), key=str) == sorted(
            [(1, True), (None, False), (2, None)], key=str
        )
        assert keys_in(moto_s3, s3_bucket) == [], "chunks and manifest are deleted after the commit"
        assert adapter.read_tables().keys() == {"o"}, "the temporary staging table is gone"

    def test_the_manifest_lists_exactly_the_pairs_objects(
        self, adapter: MotoRedshift, moto_s3: str, s3_bucket: str
    ) -> None:
        target = self.create(adapter, "m", {"n": INT})
        mine = [self.stage(adapter, "jobm", {"n": INT}, [[i]]) for i in range(3)]
        other = self.stage(adapter, "jobm", {"n": INT}, [[99]])  # another pair of the same job
        seen: list[bytes] = []
        real_copy = adapter._copy_from_s3

        def spy(client: RedshiftClient, staging: str, key: str, doing: str) -> None:
            seen.append(s3_client(moto_s3).get_object(Bucket=s3_bucket, Key=key)["Body"].read())
            real_copy(client, staging, key, doing)

        adapter._copy_from_s3 = spy  # type: ignore[method-assign]
        adapter.commit(Load("d", target, mine, ["l1"]))
        (manifest,) = seen
        urls = [e["url"] for e in orjson.loads(manifest)["entries"]]
        assert urls == [f"s3://{s3_bucket}/{c.ref}" for c in mine]
        assert all(e["mandatory"] for e in orjson.loads(manifest)["entries"])
        assert keys_in(moto_s3, s3_bucket) == [other.ref]
        assert pg(f"SELECT n FROM {self.name(adapter, 'm')} ORDER BY n") == [(0,), (1,), (2,)]

    def test_a_crash_after_the_copy_before_the_marker_then_a_rerun_loads_once(
        self, adapter: MotoRedshift, moto_s3: str, s3_bucket: str
    ) -> None:
        target = self.create(adapter, "c", {"id": S, "v": INT}, keys=("id",))
        columns = {"id": S, "v": INT, ORDER_COLUMN: INT}
        chunk = self.stage(adapter, "jobc", columns, [["a", 1, 1], ["b", 2, 2], ["a", 3, 3]])
        marker = adapter._marker_insert

        def crash(load: Load) -> str:
            raise TransientError("redshift: the connection dropped after the COPY")

        adapter._marker_insert = crash  # type: ignore[method-assign]
        with pytest.raises(TransientError):
            adapter.commit(Load("d", target, [chunk], ["l1"], ordered=True))
        assert pg(f"SELECT count(*) FROM {self.name(adapter, 'c')}") == [(0,)]
        assert adapter.loaded_files("d", ["l1"]) == set()
        assert chunk.ref in keys_in(moto_s3, s3_bucket), "the staged objects stay for the rerun"

        adapter._marker_insert = marker  # type: ignore[method-assign]
        adapter.commit(Load("d", target, [chunk], ["l1"], ordered=True))
        rows = pg(f"SELECT id, v FROM {self.name(adapter, 'c')} ORDER BY id")
        assert rows == [("a", 3), ("b", 2)]
        assert adapter.loaded_files("d", ["l1"]) == {("l1", "c")}
        assert keys_in(moto_s3, s3_bucket) == []

    def test_objects_left_by_a_crash_after_the_commit_are_dropped_as_stale(
        self, adapter: MotoRedshift, moto_s3: str, s3_bucket: str
    ) -> None:
        target = self.create(adapter, "z", {"n": INT})
        old_job = new_job_id(time.time() - 7200)
        chunk = self.stage(adapter, old_job, {"n": INT}, [[1]])
        adapter._discard_objects = lambda load: None  # type: ignore[method-assign]  # killed right after COMMIT
        adapter.commit(Load("d", target, [chunk], ["l1"]))
        assert len(keys_in(moto_s3, s3_bucket)) == 2  # the chunk and its manifest
        recent = self.stage(adapter, new_job_id(time.time()), {"n": INT}, [[2]])
        adapter.drop_stale_stages(time.time() - 3600)
        assert keys_in(moto_s3, s3_bucket) == [recent.ref]
        assert adapter.loaded_files("d", ["l1"]) == {("l1", "z")}, "a rerun skips the committed pair"


def test_copy_statement_text() -> None:
    credentials = s3.Credentials("AKIDEXAMPLE", "se'cret", "tok")
    statement = s3.copy_statement('"_es_stage_copy_x"', "s3://bucket/f/j/d/manifest-1.json", credentials, "eu-west-1")
    assert statement == (
        """COPY "_es_stage_copy_x" FROM 's3://bucket/f/j/d/manifest-1.json' ACCESS_KEY_ID 'AKIDEXAMPLE' """
        "SECRET_ACCESS_KEY 'se''cret' SESSION_TOKEN 'tok' REGION 'eu-west-1' "
        "FORMAT AS JSON 'auto' GZIP MANIFEST TIMEFORMAT 'auto' COMPUPDATE OFF STATUPDATE OFF"
    )
    no_region = s3.copy_statement('"s"', "s3://b/m.json", s3.Credentials("k", "s"), "")
    assert no_region == (
        """COPY "s" FROM 's3://b/m.json' ACCESS_KEY_ID 'k' SECRET_ACCESS_KEY 's' """
        "FORMAT AS JSON 'auto' GZIP MANIFEST TIMEFORMAT 'auto' COMPUPDATE OFF STATUPDATE OFF"
    )
    with pytest.raises(TerminalError, match="backslash"):
        s3.copy_statement('"s"', "s3://b/m\\.json", s3.Credentials("k", "s"), "")


def test_settings_keep_secrets_out_of_reprs_and_fall_back_to_the_aws_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = s3.S3Settings.of(
        destination({"db": "x"}, {"bucket": "b", "access_key_id": "AKID1", "secret_access_key": "SEKRET"}).s3  # type: ignore[arg-type]
    )
    assert "SEKRET" not in repr(settings) and "AKID1" not in repr(settings)
    assert "SEKRET" not in repr(settings.credentials())
    assert "SEKRET" not in repr(s3.S3StageTarget(settings, "job", "rs"))
    with_password = RedshiftWarehouse("rs", destination({"db": "x", "password": "PASSW0RD"}))
    from eventspark.destinations.redshift.client import RedshiftStageTarget

    assert "PASSW0RD" not in repr(RedshiftStageTarget(with_password.conninfo, "s", "job"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENVSECRET")
    chain = s3.S3Settings.of(destination({"db": "x"}, {"bucket": "b"}).s3).credentials()  # type: ignore[arg-type]
    assert (chain.access_key_id, chain.secret_access_key) == ("ENVKEY", "ENVSECRET")


@pytest.mark.parametrize("conforming", ["on", "off"])
def test_literals_read_the_same_whether_backslashes_escape_or_not(conforming: str) -> None:
    """Redshift reads `\\` in a literal as an escape, PostgreSQL (by default) does not: with
    standard_conforming_strings off, PostgreSQL reads literals as Redshift does."""
    texts = ["plain", "it's", "back\\slash", "\\", "\\'", "end\\", "a\\\\b", "%s ünï 😀"]
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        conn.execute(f"SET standard_conforming_strings = {conforming}".encode())
        conn.execute(b"SET escape_string_warning = off")
        for text in texts:
            assert conn.execute(f"SELECT {DIALECT.literal(text)}".encode()).fetchone() == (text,)


def test_config_takes_eventnatives_block_and_the_default_port() -> None:
    from eventspark.destinations.redshift.client import conninfo_of

    dest = destination(
        {"host": "cluster.example", "db": "dev", "schema": "events", "username": "u", "password": "p"},
        {"bucket": "my-bucket", "folder": "/es/", "region": "us-east-2", "endpoint": "", "access_key_id": "k"},
    )
    assert "port=5439" in conninfo_of(dest)
    adapter = RedshiftWarehouse("rs", dest)
    assert adapter.capabilities.stage == "files" and adapter.s3 is not None
    assert adapter.s3.prefix("job", "rs") == "es/job/rs/"
    assert RedshiftWarehouse("rs", destination({"db": "dev"})).capabilities.stage == "table"


# --- end to end -----------------------------------------------------------------------------------

FIXTURE_TABLES = {
    "notification_2020_08": 1,
    "null_2020_08": 1,
    "skipped_2020_08": 1,
    "user_2020_07": 1,
    "user_2020_08": 3,
}


def redshift_config(datasource: dict[str, Any], s3: dict[str, Any] | None = None, **layout: Any) -> dict[str, Any]:
    from tests.batch.helpers import MONTHLY

    config = {"type": "redshift", "datasource": datasource, "data_layout": {"table_name_template": MONTHLY, **layout}}
    return config if s3 is None else {**config, "s3": s3}


def assert_fixture_log_loaded(root: Path, schema: str, dest_id: str) -> None:
    """What tests/batch/test_pipeline.py asserts of the fixture log in Postgres, with Redshift's types."""
    from tests.batch.helpers import failed_lines, pg_rows

    for table, count in FIXTURE_TABLES.items():
        assert pg_rows(schema, f'SELECT count(*) FROM "{table}"') == [(count,)], table
    types = pg_rows(
        schema,
        "SELECT column_name, data_type, character_maximum_length FROM information_schema.columns "
        f"WHERE table_schema = '{schema}' AND table_name = 'user_2020_08'",
    )
    found = {name: (data_type, length) for name, data_type, length in types}
    assert found["key10_sib1_1"] == ("character varying", 65535), "50.0 and 'k' in one load: promoted to text"
    assert found["_geo_data_zip"] == ("bigint", None)
    assert found["_timestamp"] == ("timestamp without time zone", None)
    values = pg_rows(schema, 'SELECT key10_sib1_1 FROM "user_2020_08" ORDER BY 1 NULLS FIRST')
    assert values == [(None,), ("50.0",), ("k",)]
    (failure,) = failed_lines(root, dest_id)
    assert failure["event"] == {"_geo_data": {}, "event_type": "views", "key1000": "super value"}
    assert "Format" in failure["error"]
    tables = {r[0] for r in pg_rows(schema, f"SELECT tablename FROM pg_tables WHERE schemaname = '{schema}'")}
    assert tables == {*FIXTURE_TABLES, "_eventspark_loads"}, "no staging table left"


@pytest.mark.spark
@pytest.mark.slow
def test_process_command_loads_the_fixture_log(tmp_path: Path, pg_datasource: dict[str, Any]) -> None:
    """`eventspark process` in its own process (its own Spark), with a YAML config and no `s3`."""
    from tests.batch.helpers import FIXTURE_LOG, make_config, put_log, run_cli

    make_config(tmp_path, {"rs": redshift_config(pg_datasource)})
    log = put_log(tmp_path, FIXTURE_LOG)
    done = run_cli(tmp_path, "process")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "user_2020_08" in done.stdout and "1 log(s) archived" in done.stdout, done.stdout
    assert not log.exists()
    assert_fixture_log_loaded(tmp_path, pg_datasource["schema"], "rs")


@pytest.fixture
def moto_redshift(monkeypatch: pytest.MonkeyPatch) -> list[MotoRedshift]:
    """Every redshift destination the pipeline builds is a MotoRedshift; the list holds them."""
    import eventspark.destinations.redshift.load as load_module

    built: list[MotoRedshift] = []

    def build(dest_id: str, dest: RedshiftDestination, events_dir: Path) -> MotoRedshift:
        built.append(MotoRedshift(dest_id, dest))
        return built[-1]

    monkeypatch.setattr(load_module, "build", build)
    return built


@pytest.mark.spark
def test_batch_through_s3_loads_the_fixture_log(
    spark: Any, tmp_path: Path, pg_datasource: dict[str, Any], moto_s3: str, s3_bucket: str, moto_redshift: list[Any]
) -> None:
    from eventspark.batch.process import run_pass
    from eventspark.coordination import MemoryCoordination
    from tests.batch.helpers import FIXTURE_LOG, make_config, put_log

    loaded = make_config(tmp_path, {"rs": redshift_config(pg_datasource, s3_block(moto_s3, s3_bucket))})
    put_log(tmp_path, FIXTURE_LOG)
    result = run_pass(loaded, MemoryCoordination("t"), session=spark)
    assert result.ok, {k: p.error for k, p in result.pairs.items() if p.error}
    assert_fixture_log_loaded(tmp_path, pg_datasource["schema"], "rs")
    copies = [c for adapter in moto_redshift for c in adapter.copies]
    assert len(copies) == len(FIXTURE_TABLES), "one COPY per pair"
    assert all(f"FROM 's3://{s3_bucket}/{FOLDER}/" in c and "MANIFEST" in c for c in copies)
    assert keys_in(moto_s3, s3_bucket) == [], "every staged object and manifest deleted"


@pytest.mark.spark
@pytest.mark.parametrize("point", ["staged", "pair committed", "committed"])
def test_batch_through_s3_crash_and_rerun_leave_each_event_once(
    spark: Any,
    tmp_path: Path,
    pg_datasource: dict[str, Any],
    moto_s3: str,
    s3_bucket: str,
    moto_redshift: list[Any],
    point: str,
) -> None:
    from eventspark.batch.process import run_pass
    from eventspark.coordination import MemoryCoordination
    from tests.batch.helpers import event, make_config, pg_rows, put_log

    config = redshift_config(pg_datasource, s3_block(moto_s3, s3_bucket), table_name_template="t")
    config["data_layout"]["primary_key_fields"] = ["eventn_ctx_event_id"]
    loaded = make_config(tmp_path, {"rs": config})
    log = put_log(tmp_path, [event(str(i % 15), n=i) for i in range(20)])  # ids 0-4 twice: the later wins

    def crash(at: str) -> None:
        if at == point:
            raise SystemExit(f"crash at {at}")

    with pytest.raises(SystemExit):
        run_pass(loaded, MemoryCoordination("t"), fault=crash, session=spark)
    assert log.exists()
    before = len(moto_redshift)
    result = run_pass(loaded, MemoryCoordination("t"), session=spark)

    assert result.ok and not log.exists()
    rows = pg_rows(pg_datasource["schema"], "SELECT eventn_ctx_event_id, n FROM t ORDER BY n")
    assert rows == [(str(i % 15), i) for i in range(5, 20)]
    copies = [c for adapter in moto_redshift[before:] for c in adapter.copies]
    if point == "staged":  # killed before its commit: the rerun stages and COPYs again
        assert len(copies) == 1
        job = re.compile(rf"s3://{s3_bucket}/{FOLDER}/([^/]+)/").search(copies[0])
        assert job is not None
        assert not [k for k in keys_in(moto_s3, s3_bucket) if k.split("/")[2] == job[1]]
    else:  # killed after the commit: the markers say so, nothing is loaded twice
        assert copies == []
    # Whatever the killed job left is removed as stale (a pass does it after 24 h).
    cleaner = moto_redshift[-1]
    cleaner.drop_stale_stages(time.time() + 1)
    cleaner.close()
    assert keys_in(moto_s3, s3_bucket) == []


@pytest.mark.spark
@pytest.mark.parametrize("point", ["staged", "committed"])
def test_batch_through_staging_tables_crash_and_rerun_leave_each_event_once(
    spark: Any, tmp_path: Path, pg_datasource: dict[str, Any], point: str
) -> None:
    from eventspark.batch.process import run_pass
    from eventspark.coordination import MemoryCoordination
    from tests.batch.helpers import event, make_config, pg_rows, put_log

    config = redshift_config(pg_datasource, table_name_template="t")
    config["data_layout"]["primary_key_fields"] = ["eventn_ctx_event_id"]
    loaded = make_config(tmp_path, {"rs": config})
    log = put_log(tmp_path, [event(str(i % 15), n=i) for i in range(20)])

    def crash(at: str) -> None:
        if at == point:
            raise SystemExit(f"crash at {at}")

    with pytest.raises(SystemExit):
        run_pass(loaded, MemoryCoordination("t"), fault=crash, session=spark)
    assert log.exists()
    assert run_pass(loaded, MemoryCoordination("t"), session=spark).ok and not log.exists()

    schema = pg_datasource["schema"]
    assert pg_rows(schema, "SELECT eventn_ctx_event_id, n FROM t ORDER BY n") == [
        (str(i % 15), i) for i in range(5, 20)
    ]
    cleaner = RedshiftWarehouse("rs", destination(pg_datasource))
    cleaner.drop_stale_stages(time.time() + 1)  # what a killed job left, as a pass does after a day
    cleaner.close()
    tables = pg_rows(schema, f"SELECT tablename FROM pg_tables WHERE schemaname = '{schema}' ORDER BY 1")
    assert tables == [("_eventspark_loads",), ("t",)]


def test_upserts_on_a_two_column_key_in_batch_and_stream(pg_datasource: dict[str, Any]) -> None:
    adapter = RedshiftWarehouse("rs", destination(pg_datasource))
    try:
        contract = TestRedshiftAdapter()
        target = contract.create(adapter, "k2", {"a": S, "b": INT, "v": S}, keys=("a", "b"))
        columns = {"a": S, "b": INT, "v": S, ORDER_COLUMN: INT}
        chunk = contract.stage(adapter, "jobk", columns, [["x", 1, "old", 1], ["x", 2, "keep", 2], ["x", 1, "new", 3]])
        adapter.commit(Load("d", target, [chunk], ["l1"], ordered=True))
        adapter.insert(target, [{"a": "x", "b": 2, "v": "streamed"}, {"a": "y", "b": 1, "v": "added"}])
        rows = pg(f"SELECT a, b, v FROM {contract.name(adapter, 'k2')} ORDER BY a, b")
        assert rows == [("x", 1, "new"), ("x", 2, "streamed"), ("y", 1, "added")]
    finally:
        adapter.close()


def test_nodes_connecting_at_once_all_prepare_the_schema(pg_datasource: dict[str, Any]) -> None:
    """No advisory lock on Redshift: the loser of a race on CREATE ... IF NOT EXISTS prepares again.
    (PostgreSQL's race, a unique violation; what Redshift raises there is not known here.)"""
    from concurrent.futures import ThreadPoolExecutor

    adapters = [RedshiftWarehouse(f"rs{i}", destination(pg_datasource)) for i in range(6)]
    try:
        with ThreadPoolExecutor(len(adapters)) as pool:
            assert list(pool.map(lambda a: a.read_tables(), adapters)) == [{}] * len(adapters)
    finally:
        for adapter in adapters:
            adapter.close()


def test_an_unreachable_s3_endpoint_is_transient(pg_datasource: dict[str, Any]) -> None:
    block = {**s3_block("http://127.0.0.1:1", "some-bucket")}
    adapter = RedshiftWarehouse("rs", destination(pg_datasource, block))
    writer = adapter.stage_target("jobu").open()
    with pytest.raises(TransientError, match="staging 1 rows"):
        writer.write({"n": INT}, [[1]])


# --- what the review of the package found (each test failed before its fix) ------------------------


class StatementRecorder(TcpProxy):
    """A TcpProxy to PostgreSQL that records every statement a client sends: the text of each
    simple Query ('Q') and of each Parse ('P') message of the extended protocol, per connection,
    in order. Needs `sslmode=disable` (an encrypted stream cannot be read)."""

    def __init__(self) -> None:
        from tests.conftest import PG_HOST, PG_PORT

        super().__init__(PG_HOST, PG_PORT)
        self.connections: list[list[str]] = []

    @property
    def statements(self) -> list[str]:
        return [s for connection in list(self.connections) for s in connection]

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:  # type: ignore[override]
        if source.getpeername()[1] == self.target[1]:  # server to client: passed on as it is
            TcpProxy._pump(source, sink)
            return
        seen: list[str] = []
        self.connections.append(seen)
        buffer = bytearray()
        started = False
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
                buffer += data
                started = self._parse(buffer, started, seen)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    @staticmethod
    def _parse(buffer: bytearray, started: bool, seen: list[str]) -> bool:
        """Takes the complete messages off `buffer`; True once the startup message went by."""
        while True:
            if not started:  # untyped: SSLRequest, GSSENCRequest, then the StartupMessage
                if len(buffer) < 8:
                    return started
                length, code = struct.unpack("!ii", buffer[:8])
                if len(buffer) < length:
                    return started
                del buffer[:length]
                started = code == 196608
                continue
            if len(buffer) < 5:
                return started
            kind, length = buffer[:1], struct.unpack("!i", buffer[1:5])[0]
            if len(buffer) < 1 + length:
                return started
            body = bytes(buffer[5 : 1 + length])
            del buffer[: 1 + length]
            if kind == b"Q":
                seen.append(body.rstrip(b"\0").decode())
            elif kind == b"P":
                seen.append(body.split(b"\0")[1].decode())


@pytest.fixture
def recorder() -> Iterator[StatementRecorder]:
    with StatementRecorder() as proxy:
        yield proxy


NOT_ON_REDSHIFT = {
    "a savepoint": re.compile(r"\b(SAVEPOINT|RELEASE)\b", re.I),
    "DEALLOCATE": re.compile(r"\bDEALLOCATE\b", re.I),
    "ON CONFLICT": re.compile(r"\bON CONFLICT\b", re.I),
    "a text to boolean cast": re.compile(r"\bAS boolean\)", re.I),
    "LEFT() (leader node: PostgreSQL 8.0)": re.compile(r"\bLEFT\(", re.I),
    "owner-only information_schema views": re.compile(r"table_constraints|key_column_usage", re.I),
    "unnest/array_agg/ORDINALITY (leader node)": re.compile(r"\bunnest\(|\barray_agg\(|\bORDINALITY\b", re.I),
}


def test_every_statement_sent_is_one_redshift_has(recorder: StatementRecorder, pg_datasource: dict[str, Any]) -> None:
    """Records what psycopg puts on the wire (through `StatementRecorder`) during a batch load with
    a schema change, upserts, more than five commits of the same statements and stream inserts:
    no savepoint, DEALLOCATE, ON CONFLICT, text-to-boolean cast, LEFT() or owner-only catalog view;
    and every transaction that writes a target locks it first."""
    datasource = {**pg_datasource, "port": recorder.port, "parameters": {"sslmode": "disable"}}
    adapter = RedshiftWarehouse("rs", destination(datasource))
    contract = TestRedshiftAdapter()
    try:
        target = contract.create(adapter, "t", {"id": S, "n": INT, "ok": B}, keys=("id",))
        columns = {"id": S, "n": INT, "ok": B, ORDER_COLUMN: INT}
        for round_ in range(7):  # the same statements again and again: psycopg would prepare them
            chunk = contract.stage(adapter, f"job{round_}", columns, [[str(round_ % 3), round_, True, round_]])
            adapter.commit(Load("d", target, [chunk], [f"log{round_}"], ordered=True))
            adapter.insert(target, [{"id": "s", "n": round_, "ok": False}])
            assert adapter.read_table("t") == target
        adapter.patch(TablePatch("t", add_columns={"x": "bigint", "y": "boolean"}))  # ALTER after preparing
        target = adapter.read_table("t")
        assert target is not None and list(target.columns) == ["id", "n", "ok", "x", "y"]
        chunk = contract.stage(adapter, "jobx", {**columns, "x": INT}, [["a", 9, False, 99, 7]])
        adapter.commit(Load("d", target, [chunk], ["logx"], ordered=True))
        adapter.insert(target, [{"id": "s", "n": 8, "ok": True, "x": 1, "y": True}])
        adapter.drop_stale_stages(time.time() + 1)
        rows = pg(f'SELECT id, n, ok, x, y FROM "{pg_datasource["schema"]}"."t" ORDER BY id')
        assert rows == [("0", 6, True, None, None), ("1", 4, True, None, None), ("2", 5, True, None, None),
                        ("a", 9, False, 7, None), ("s", 8, True, 1, True)]  # fmt: skip
    finally:
        adapter.close()

    sent = recorder.statements
    assert len(sent) > 100
    found = {what: [s for s in sent if pattern.search(s)] for what, pattern in NOT_ON_REDSHIFT.items()}
    assert {what: found[what][:2] for what in found if found[what]} == {}
    quoted = f'"{pg_datasource["schema"]}"."t"'
    assert sent.count(f"LOCK TABLE {quoted}") == 16, "8 commits and 8 stream inserts"
    assert any("pg_constraint" in s for s in sent) and any(s.startswith("ALTER TABLE") for s in sent)
    writes = 0
    for statements in recorder.connections:
        in_transaction = False
        locked = False
        for statement in statements:
            if statement == "BEGIN":
                in_transaction, locked = True, False
            elif statement in ("COMMIT", "ROLLBACK"):
                in_transaction = False
            elif statement.startswith((f"INSERT INTO {quoted}", f"DELETE FROM {quoted}")):
                assert in_transaction and locked, f"{statement[:60]} without LOCK first"
                writes += 1
            elif statement == f"LOCK TABLE {quoted}":
                locked = True
    assert writes >= 40


def test_a_serializable_isolation_violation_is_transient() -> None:
    """Redshift's error 1023 (SQLSTATE XX000, an InternalError) when concurrent transactions
    conflict: retried, not a reason to fail the events."""
    raise_1023 = (
        "DO $$ BEGIN RAISE EXCEPTION '1023' USING ERRCODE = 'XX000', DETAIL = "
        "'Serializable isolation violation on table - 100, transactions forming the cycle are: 1, 2'; END $$"
    )
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        with pytest.raises(TransientError, match="serializ"), translated_errors("loading"):
            conn.execute(raise_1023.replace("'1023'", "'1023: Serializable isolation violation on table'").encode())
        with pytest.raises(TransientError), translated_errors("loading"):
            conn.execute(raise_1023.encode())  # the code alone, the words in the detail
        with pytest.raises(TerminalError), translated_errors("loading"):
            conn.execute(b"DO $$ BEGIN RAISE EXCEPTION 'other' USING ERRCODE = 'XX000'; END $$")


def test_a_column_added_under_the_patch_fails_it_whole(pg_datasource: dict[str, Any]) -> None:
    """A column another node added after the catalog was read: the ALTER fails the patch's
    transaction, so the patch raises (before: the error was swallowed, COMMIT became a ROLLBACK and
    the patch's other columns vanished while it returned normally); the next one succeeds."""
    adapter = RedshiftWarehouse("rs", destination(pg_datasource))
    try:
        TestRedshiftAdapter().create(adapter, "d", {"a": S})
        with psycopg.connect(pg_conninfo(), autocommit=True) as conn:  # another node, meanwhile
            conn.execute(f'ALTER TABLE "{pg_datasource["schema"]}"."d" ADD COLUMN "c" bigint'.encode())
        real_catalog = adapter._catalog
        adapter._catalog = lambda client, name: ([], [])  # type: ignore[method-assign]  # read before `c` came
        with pytest.raises(TerminalError, match="already exists"):
            adapter.patch(TablePatch("d", add_columns={"b": "bigint", "c": "bigint"}))
        adapter._catalog = real_catalog  # type: ignore[method-assign]
        found = adapter.read_table("d")
        assert found is not None and list(found.columns) == ["a", "c"]
        adapter.patch(TablePatch("d", add_columns={"b": "bigint", "c": "bigint"}))
        found = adapter.read_table("d")
        assert found is not None and list(found.columns) == ["a", "c", "b"]
    finally:
        adapter.close()


BIG = "é" * 40_000 + "😀"  # 40,001 characters (PostgreSQL's varchar(65535) takes them), 80,004 bytes


@pytest.mark.parametrize("path", ["staging tables", "s3", "stream"])
def test_strings_are_cut_to_65535_bytes(path: str, pg_datasource: dict[str, Any], moto_s3: str, s3_bucket: str) -> None:
    """Redshift's varchar(65535) counts bytes (PostgreSQL's: characters): longer text is cut at a
    character boundary instead of failing the pair's COPY (or INSERT) every pass."""
    block = s3_block(moto_s3, s3_bucket) if path == "s3" else None
    adapter = MotoRedshift("rs", destination(pg_datasource, block))
    contract = TestRedshiftAdapter()
    try:
        target = contract.create(adapter, "s", {"id": S, "v": S})
        rows = [["big", BIG], ["small", "ü" * 10]]
        if path == "stream":
            adapter.insert(target, [dict(zip(("id", "v"), row, strict=True)) for row in rows])
        else:
            chunk = contract.stage(adapter, "jobs", {"id": S, "v": S}, rows)
            adapter.commit(Load("d", target, [chunk], ["l"]))
        stored = dict(pg(f"SELECT id, v FROM {contract.name(adapter, 's')}"))
        assert len(stored["big"].encode()) == 65_534  # 32,767 two-byte characters
        assert BIG.startswith(stored["big"]) and stored["small"] == "ü" * 10
    finally:
        adapter.close()


def test_an_upper_case_schema_is_lower_cased_as_redshift_does(pg_datasource: dict[str, Any]) -> None:
    """Redshift folds quoted names to lower case (unless enable_case_sensitive_identifier is on):
    the schema is used lower-cased, so that catalog lookups find what the server created."""
    upper = {**pg_datasource, "schema": pg_datasource["schema"].upper()}
    adapter = RedshiftWarehouse("rs", destination(upper))
    try:
        assert adapter.schema == pg_datasource["schema"]
        TestRedshiftAdapter().create(adapter, "t", {"a": S})
        assert pg("SELECT count(*) FROM pg_namespace WHERE nspname = %s", upper["schema"]) == [(0,)]
    finally:
        adapter.close()


def test_rows_with_null_keys_are_replaced_like_any_other(pg_datasource: dict[str, Any]) -> None:
    """Redshift does not enforce keys (a table keeps NULL in a key column; PostgreSQL's key is
    NOT NULL, so here the table has `primary_keys` in eventspark's view only): a NULL key matches
    a NULL key in the batch DELETE ... USING and the stream DELETE, so such rows do not pile up."""
    adapter = RedshiftWarehouse("rs", destination(pg_datasource))
    contract = TestRedshiftAdapter()
    try:
        created = contract.create(adapter, "n", {"a": S, "b": INT, "v": S})
        target = Table("n", created.columns, ("a", "b"))
        columns = {"a": S, "b": INT, "v": S, ORDER_COLUMN: INT}
        for run in range(2):
            rows = [[None, None, f"both{run}", 1], ["x", None, f"b{run}", 2], [None, 1, f"a{run}", 3], ["x", 1, "k", 4]]
            chunk = contract.stage(adapter, f"job{run}", columns, rows)
            adapter.commit(Load("d", target, [chunk], [f"l{run}"], ordered=True))
        stream = [
            {"a": None, "b": None, "v": "both-s"},
            {"a": "x", "b": None, "v": "b-s"},
            {"a": "y", "b": 2, "v": "y"},
        ]
        adapter.insert(target, stream)
        rows = pg(f"SELECT a, b, v FROM {contract.name(adapter, 'n')} ORDER BY a NULLS FIRST, b NULLS FIRST")
        assert rows == [(None, None, "both-s"), (None, 1, "a1"), ("x", None, "b-s"), ("x", 1, "k"), ("y", 2, "y")]
        one_key = Table("n", created.columns, ("a",))
        adapter.insert(one_key, [{"a": None, "b": 5, "v": "one"}, {"a": "y", "b": 6, "v": "y6"}])
        rows = pg(f"SELECT a, b, v FROM {contract.name(adapter, 'n')} ORDER BY a NULLS FIRST, b NULLS FIRST")
        assert rows == [(None, 5, "one"), ("x", None, "b-s"), ("x", 1, "k"), ("y", 6, "y6")]
    finally:
        adapter.close()


def exception_chain(error: BaseException) -> list[BaseException]:
    """`error`, its causes and contexts, theirs..."""
    chain: list[BaseException] = []
    todo: list[BaseException | None] = [error]
    while todo:
        found = todo.pop()
        if found is not None and found not in chain:
            chain.append(found)
            todo += [found.__cause__, found.__context__]
    return chain


SECRET, TOKEN = "SECRETKEYsecretkey0123456789", "SESSIONTOKENtoken0123456789"
ROLE = "arn:aws:iam::123456789012:role/Loader"


@pytest.mark.parametrize("authorization", ["keys", "iam_role"])
def test_the_real_copy_keeps_keys_out_of_its_error(
    authorization: str, pg_datasource: dict[str, Any], moto_s3: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real `_copy_from_s3` (keys from boto3's chain, with a session token; or `iam_role`) on
    PostgreSQL, which refuses the COPY with a syntax error: the error raised names neither the
    secret key nor the token, nor does any exception chained to it (no driver error, which may
    quote the statement, is chained); nothing is committed. With `iam_role` the COPY holds no key."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    block = {k: v for k, v in s3_block(moto_s3, s3_bucket).items() if k not in ("access_key_id", "secret_access_key")}
    if authorization == "iam_role":
        block["iam_role"] = ROLE
    uploads = RedshiftWarehouse("rs", destination(pg_datasource, s3_block(moto_s3, s3_bucket)))
    adapter = RedshiftWarehouse("rs", destination(pg_datasource, block))
    contract = TestRedshiftAdapter()
    try:
        target = contract.create(adapter, "c", {"n": INT})
        chunk = contract.stage(uploads, "jobc", {"n": INT}, [[1]])
        statements: list[str] = []
        real_execute = RedshiftClient.execute

        def spy(self: RedshiftClient, statement: str, doing: str, params: Any = None) -> None:
            statements.append(statement)
            real_execute(self, statement, doing, params)

        monkeypatch.setattr(RedshiftClient, "execute", spy)
        with pytest.raises(TerminalError) as caught:
            adapter.commit(Load("d", target, [chunk], ["l1"]))
        (copy,) = [s for s in statements if s.startswith("COPY")]
        if authorization == "keys":
            assert SECRET in copy and TOKEN in copy, "the COPY did carry the keys"
        else:
            assert f"IAM_ROLE '{ROLE}'" in copy and "AKIAEXAMPLE" not in copy and SECRET not in copy
        assert "syntax error" in str(caught.value)
        chain = exception_chain(caught.value)
        assert all(not isinstance(e, psycopg.Error) for e in chain), [str(e) for e in chain]
        for error in chain:
            text = f"{error!s} {error!r} {getattr(error, 'args', '')}"
            assert SECRET not in text and TOKEN not in text, type(error)
        assert adapter.loaded_files("d", ["l1"]) == set()
        assert pg(f"SELECT count(*) FROM {contract.name(adapter, 'c')}") == [(0,)]
    finally:
        adapter.close()
        uploads.close()


def test_a_copy_error_quoting_the_keys_is_masked(pg_datasource: dict[str, Any], moto_s3: str, s3_bucket: str) -> None:
    """A server error that quotes the statement (PostgreSQL's first line did not reach the keys
    above): the real `_copy_from_s3` raises it again, same class, keys masked, nothing chained."""
    block = {**s3_block(moto_s3, s3_bucket), "access_key_id": "AKIAEXAMPLE", "secret_access_key": SECRET}
    adapter = RedshiftWarehouse("rs", destination(pg_datasource, block))

    def echo(client: RedshiftClient, statement: str, staging: str, manifest_key: str, doing: str) -> None:
        raise TransientError(f"redshift: {doing}: error near {statement}") from ValueError(statement)

    adapter._run_copy = echo  # type: ignore[method-assign]
    with pytest.raises(TransientError) as caught:
        adapter._copy_from_s3(None, '"s"', "k/manifest-1.json", "loading")  # type: ignore[arg-type]
    assert "SECRET_ACCESS_KEY '***'" in str(caught.value) and SECRET not in str(caught.value)
    assert exception_chain(caught.value) == [caught.value]


def test_copy_statement_with_an_iam_role() -> None:
    """`s3.iam_role` (an eventspark extension of EventNative's block): COPY ... IAM_ROLE, no keys."""
    dest = destination({"db": "x"}, {"bucket": "b", "iam_role": "arn:aws:iam::123456789012:role/Loader"})
    assert dest.s3 is not None
    settings = s3.S3Settings.of(dest.s3)
    statement = s3.copy_statement('"s"', "s3://b/m.json", settings.copy_authorization(), "us-east-1")
    assert statement == (
        """COPY "s" FROM 's3://b/m.json' IAM_ROLE 'arn:aws:iam::123456789012:role/Loader' REGION 'us-east-1' """
        "FORMAT AS JSON 'auto' GZIP MANIFEST TIMEFORMAT 'auto' COMPUPDATE OFF STATUPDATE OFF"
    )


def test_the_key_constraint_name_is_cut_to_127_bytes() -> None:
    """EventNative's `<schema>_<table>_pk`, cut at a character boundary to Redshift's 127 bytes
    (not 127 characters: a multibyte name would then be refused)."""
    adapter = RedshiftWarehouse("rs", destination({"db": "x", "schema": "events"}))
    clause = adapter._key_clause("é" * 60, ("id",))  # events_ + 120 bytes + _pk: 130 bytes
    name = clause.split('"')[1]
    assert clause == f'CONSTRAINT "{name}" PRIMARY KEY ("id")'
    assert name == "events_" + "é" * 60 and len(name.encode()) == 127
