"""The adapter contract on fakesnow's server, plus what is Snowflake-specific: EventNative's name
rule, catalog types, the stage and its leftovers, S3 staging, the end-to-end `eventspark process`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from eventspark.destinations.base import Load, TerminalError, TransientError
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
