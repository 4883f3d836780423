"""The MySQL adapter on the machine's MariaDB: the shared contract and MySQL's own semantics.

"Server down" is simulated with a TCP proxy in front of MariaDB that the test closes and reopens,
so the machine's server itself keeps running for everything else.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventspark.destinations import build_destination
from eventspark.destinations.base import ORDER_COLUMN, Load, StagedChunk, TerminalError, TransientError
from eventspark.destinations.mysql.configuration import MySQLDestination
from eventspark.destinations.mysql.dialect import DIALECT, data_type_of
from eventspark.destinations.mysql.load import MySQLWarehouse as MySQLAdapter
from eventspark.destinations.mysql.load import build
from eventspark.destinations.sql.statements import copy_statements
from eventspark.steps.diff import Table, TablePatch
from eventspark.steps.typing import DataType
from tests.destinations.conftest import MYSQL_HOST, MYSQL_PORT, MYSQL_USER, free_port, mysql_connect
from tests.destinations.contract import AdapterContract
from tests.destinations.proxy import TcpProxy

B, N, F, T, S = DataType.BOOL, DataType.INT64, DataType.FLOAT64, DataType.TIMESTAMP, DataType.STRING


def destination(db: str, port: int = MYSQL_PORT, **datasource: Any) -> MySQLDestination:
    block = {"host": MYSQL_HOST, "port": port, "db": db, "username": MYSQL_USER, **datasource}
    return MySQLDestination.model_validate({"type": "mysql", "datasource": block})


def rows_of(db: str, sql: str) -> list[tuple[Any, ...]]:
    conn = mysql_connect(db)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


class TestMySQLAdapter(AdapterContract):
    @pytest.fixture
    def adapter(self, mysql_db: str) -> Iterator[MySQLAdapter]:
        adapter = build("my", destination(mysql_db), Path("."))
        yield adapter
        adapter.close()

    def query(self, adapter: Any, sql: str) -> list[tuple[Any, ...]]:
        # The contract's portable SQL, in MySQL's words (NULLs sort first ascending anyway).
        sql = sql.replace(" AS VARCHAR)", " AS CHAR)").replace(" NULLS FIRST", "")
        return rows_of(adapter.schema, sql)

    def test_commit_casts_promoted_chunks_and_records_markers(self, adapter: MySQLAdapter) -> None:
        # MySQL's version of the contract: DATETIME keeps whole seconds.
        target = self.create(adapter, "t", {"flag": N, "amount": F, "ts": T, "label": S})
        one = self.stage(adapter, "job1", {"flag": B, "amount": N, "ts": T}, [[True, 3, "2020-08-02T18:23:56.5+02:00"]])
        two = self.stage(adapter, "job1", {"flag": N, "label": S}, [[7, "x"], [None, "y"]])
        adapter.commit(Load("d", target, [one, two], ["log-a", "log-b"]))
        rows = self.query(adapter, "SELECT flag, CAST(amount AS DOUBLE), CAST(ts AS CHAR), label FROM t ORDER BY label")
        assert rows == [(1, 3.0, "2020-08-02 16:23:56", None), (7, None, None, "x"), (None, None, None, "y")]
        assert adapter.loaded_files("d", ["log-a", "log-b", "log-c"]) == {("log-a", "t"), ("log-b", "t")}
        assert adapter.read_tables().keys() == {"t"}  # the staging tables are gone

    def test_types_read_back(self, adapter: MySQLAdapter) -> None:
        table = self.create(adapter, "types", {"b": B, "n": N, "f": F, "s": S, "t": T}, keys=("s",))
        assert [adapter.data_type_of(t) for t in table.columns.values()] == [B, N, F, S, T]
        assert table.columns["s"] == "varchar(255)"  # a TEXT key needs a length
        assert data_type_of("bigint(20) unsigned") is N and data_type_of("longtext") is S
        assert data_type_of("json") is None

    def test_keys_compare_exactly(self, adapter: MySQLAdapter) -> None:
        target = self.create(adapter, "k", {"id": S, "v": N}, keys=("id",))
        adapter.insert(target, [{"id": "a", "v": 1}, {"id": "A", "v": 2}, {"id": "a ", "v": 3}])
        assert len(self.query(adapter, "SELECT id FROM k")) == 3

    def test_add_columns_twice_and_set_key_later(self, adapter: MySQLAdapter) -> None:
        self.create(adapter, "p", {"id": S, "n": N})
        adapter.patch(TablePatch("p", add_columns={"x": "TEXT"}))
        adapter.patch(TablePatch("p", add_columns={"x": "TEXT", "y": "BIGINT"}))  # x exists: not an error
        adapter.patch(TablePatch("p", primary_keys=("id",)))
        table = adapter.read_table("p")
        assert table is not None and list(table.columns) == ["id", "n", "x", "y"]
        assert table.primary_keys == ("id",) and table.columns["id"] == "varchar(255)"
        adapter.patch(TablePatch("p", primary_keys=("id", "n")))
        assert adapter.read_table("p").primary_keys == ("id", "n")  # type: ignore[union-attr]

    def test_hostile_names(self, adapter: MySQLAdapter) -> None:
        names = ["a`b", "back\\slash", "it's", "50%s", "x) VALUES (", "naïve ünïcode"]
        table = "t`%s'\"; DROP x"
        target = self.create(adapter, table, dict.fromkeys(names, S) | {"n m": N}, keys=("n m",))
        chunk = self.stage(adapter, "jh", dict.fromkeys(names, S) | {"n m": N}, [[*names, 1]])
        adapter.commit(Load("d", target, [chunk], ["l"]))
        adapter.insert(target, [{n: n.upper() for n in names} | {"n m": 2}])
        adapter.insert(target, [{n: "again" for n in names} | {"n m": 2}])
        rows = self.query(adapter, f"SELECT * FROM {self.name(adapter, table)} ORDER BY `n m`")
        assert rows == [(*names, 1), (*["again"] * len(names), 2)]
        assert set(adapter.read_table(table).columns) == {*names, "n m"}  # type: ignore[union-attr]

    def test_promotions_and_bool_text(self, adapter: MySQLAdapter) -> None:
        target = self.create(adapter, "p", {"id": S, "n": F, "s": S})
        ints = self.stage(adapter, "jp", {"id": S, "n": N, "s": B}, [["a", 2, True]])
        floats = self.stage(adapter, "jp", {"id": S, "n": F, "s": F}, [["b", 2.5, 1.5]])
        adapter.commit(Load("d", target, [ints, floats], ["l"]))
        rows = self.query(adapter, "SELECT id, CAST(n AS DOUBLE), s FROM p ORDER BY id")
        assert rows == [("a", 2.0, "true"), ("b", 2.5, "1.5")]

    def test_upsert_across_chunks_keeps_the_last_by_order_column(self, adapter: MySQLAdapter) -> None:
        target = self.create(adapter, "u", {"id": S, "v": N}, keys=("id",))
        columns = {"id": S, "v": N, ORDER_COLUMN: N}
        late = self.stage(adapter, "ju", columns, [["a", 9, 90], ["b", 1, 10]])
        early = self.stage(adapter, "ju", columns, [["a", 5, 50], ["b", 2, 20]])
        adapter.commit(Load("d", target, [late, early], ["l"], ordered=True))
        assert self.query(adapter, "SELECT id, v FROM u ORDER BY id") == [("a", 9), ("b", 2)]

    def test_staging_warning_is_terminal(self, adapter: MySQLAdapter) -> None:
        with pytest.raises(TerminalError, match="staging 1 rows"):
            self.stage(adapter, "jw", {"n": N}, [[2**70]])

    def test_stream_insert_converts_timestamps(self, adapter: MySQLAdapter) -> None:
        # Values come converted to their columns' types (stream.delivery); timestamps as RFC 3339.
        target = self.create(adapter, "s", {"id": S, "t": T, "b": B}, keys=("id",))
        adapter.insert(target, [{"id": "a", "t": "2020-08-02T18:23:56.291383+02:00", "b": True}, {"id": "b"}])
        assert self.query(adapter, "SELECT id, CAST(t AS CHAR), b FROM s ORDER BY id") == [
            ("a", "2020-08-02 16:23:56", 1),
            ("b", None, None),
        ]
        with pytest.raises(TerminalError, match="inserting 1 rows into 's'"):
            adapter.insert(target, [{"id": "c", "t": "yesterday"}])
        assert len(self.query(adapter, "SELECT id FROM s")) == 2

    def test_unreachable_server_is_transient(self, mysql_db: str) -> None:
        adapter = build("my", destination(mysql_db, port=free_port()), Path("."))
        with pytest.raises(TransientError, match="connecting"):
            adapter.read_tables()

    def test_server_down_then_up_loses_nothing(self, mysql_db: str) -> None:
        proxy = TcpProxy(MYSQL_HOST, MYSQL_PORT)
        proxy.start()
        adapter = build("my", destination(mysql_db, port=proxy.port), Path("."))
        try:
            target = self.create(adapter, "events", {"id": S, "n": N}, keys=("id",))
            chunk = self.stage(adapter, "jd", {"id": S, "n": N}, [["e1", 1], ["e2", 2]])
            proxy.stop()
            with pytest.raises(TransientError):
                adapter.commit(Load("d", target, [chunk], ["l"]))
            with pytest.raises(TransientError):
                adapter.insert(target, [{"id": "s", "n": 9}])
            proxy.start()
            adapter.commit(Load("d", target, [chunk], ["l"]))
            adapter.insert(target, [{"id": "s", "n": 9}])
        finally:
            adapter.close()
            proxy.stop()
        assert rows_of(mysql_db, "SELECT id, n FROM events ORDER BY n") == [("e1", 1), ("e2", 2), ("s", 9)]
        assert rows_of(mysql_db, "SELECT file, table_name FROM _eventspark_loads") == [("l", "events")]

    def test_unknown_parameter_is_terminal(self, mysql_db: str) -> None:
        with pytest.raises(TerminalError, match="parameter 'tls'"):
            build("my", destination(mysql_db, parameters={"tls": "true"}), Path("."))


def test_build_destination_makes_the_adapter(tmp_path: Any) -> None:
    assert isinstance(build_destination("my", destination("db"), tmp_path), MySQLAdapter)


# --- end to end: batch passes on the shared SparkSession ---------------------------------------


def _batch(spark: Any, loaded: Any, fault: Any = None) -> Any:
    from eventspark.batch.process import run_pass
    from eventspark.coordination import MemoryCoordination

    return run_pass(loaded, MemoryCoordination("test"), fault=fault, session=spark)


def _config(root: Any, db: str, template: str, port: int = MYSQL_PORT, **layout: Any) -> Any:
    from tests.batch.helpers import make_config

    datasource = {"host": MYSQL_HOST, "port": port, "db": db, "username": MYSQL_USER}
    dest = {"type": "mysql", "datasource": datasource, "data_layout": {"table_name_template": template, **layout}}
    return make_config(root, {"my": dest})


@pytest.mark.spark
def test_batch_loads_the_fixture_log(spark: Any, tmp_path: Any, mysql_db: str) -> None:
    from tests.batch.helpers import FIXTURE_LOG, MONTHLY, put_log

    log = put_log(tmp_path, FIXTURE_LOG)
    result = _batch(spark, _config(tmp_path, mysql_db, MONTHLY))
    assert result.ok and not log.exists()
    counts = {"notification_2020_08": 1, "null_2020_08": 1, "skipped_2020_08": 1, "user_2020_07": 1, "user_2020_08": 3}
    for table, count in counts.items():
        assert rows_of(mysql_db, f"SELECT count(*) FROM `{table}`") == [(count,)]
    types = dict(
        rows_of(
            mysql_db,
            "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS "
            f"WHERE TABLE_SCHEMA = '{mysql_db}' AND TABLE_NAME = 'user_2020_08'",
        )
    )
    assert types["_timestamp"] == "datetime" and types["key10_sib1_1"] == "text"
    assert types["_geo_data_zip"].startswith("bigint")
    assert rows_of(mysql_db, "SELECT key10_sib1_1 FROM user_2020_08 ORDER BY 1") == [(None,), ("50.0",), ("k",)]


@pytest.mark.spark
def test_batch_upserts_and_survives_a_crash(spark: Any, tmp_path: Any, mysql_db: str) -> None:
    from tests.batch.helpers import event, put_log

    loaded = _config(tmp_path, mysql_db, "t", primary_key_fields=["eventn_ctx_event_id"])
    put_log(tmp_path, [event("a", n=1), event("b", n=1), event("a", n=2)])
    assert _batch(spark, loaded).ok
    log = put_log(tmp_path, [event("b", n=3), event("c", n=1)])

    def crash(at: str) -> None:
        if at == "committed":
            raise SystemExit("crash after the commit, before the status file")

    with pytest.raises(SystemExit):
        _batch(spark, loaded, fault=crash)
    assert log.exists()
    assert _batch(spark, loaded).ok and not log.exists()
    assert rows_of(mysql_db, "SELECT eventn_ctx_event_id, n FROM t ORDER BY 1") == [("a", 2), ("b", 3), ("c", 1)]


@pytest.mark.spark
def test_batch_with_the_server_down_keeps_the_log_then_loads_it(spark: Any, tmp_path: Any, mysql_db: str) -> None:
    from tests.batch.helpers import event, put_log

    proxy = TcpProxy(MYSQL_HOST, MYSQL_PORT)
    loaded = _config(tmp_path, mysql_db, "t", port=proxy.port)
    log = put_log(tmp_path, [event(str(i), n=i) for i in range(5)])
    down = _batch(spark, loaded)
    assert not down.ok and log.exists()
    proxy.start()
    try:
        assert _batch(spark, loaded).ok and not log.exists()
    finally:
        proxy.stop()
    assert rows_of(mysql_db, "SELECT count(*) FROM t") == [(5,)]


COPY_ARGS: Any = ("on_duplicate_key", DIALECT.quote, "`t`", lambda c: f"`{c.ref}`", lambda col, _stage, _sql: col)


def test_commit_statements_follow_the_tables_key() -> None:
    chunks = [
        StagedChunk("s1", {"id": DataType.STRING, "v": DataType.INT64}, 1),
        StagedChunk("s2", {"v": DataType.INT64}, 1),
    ]
    plain = Table("t", {"id": "VARCHAR(255)", "v": "BIGINT"})
    statements = copy_statements(Load("d", plain, chunks, []), *COPY_ARGS)
    assert len(statements) == 2 and not any("DUPLICATE" in s or "UNION" in s for s in statements)
    # A key the table has though the config names none (no order column): still an upsert.
    keyed = Table("t", {"id": "VARCHAR(255)", "v": "BIGINT"}, primary_keys=("id",))
    (statement,) = copy_statements(Load("d", keyed, chunks, []), *COPY_ARGS)
    assert "ON DUPLICATE KEY UPDATE `v` = VALUES(`v`)" in statement and "ORDER BY" not in statement
