"""The ClickHouse adapter: the shared contract and ClickHouse's own semantics on a real server
(Debian's 18.16, started by the `clickhouse_server` fixture), plus the DDL text of cluster mode."""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from eventspark.destinations import build_destination
from eventspark.destinations.base import ORDER_COLUMN, Load, StagedChunk, TerminalError, TransientError, new_job_id
from eventspark.destinations.clickhouse import load as ch_load
from eventspark.destinations.clickhouse.client import Client, _server_error, parse_dsn
from eventspark.destinations.clickhouse.configuration import ClickHouseDestination
from eventspark.destinations.clickhouse.ddl import add_column_statements, create_statements
from eventspark.destinations.clickhouse.dialect import data_type_of
from eventspark.destinations.clickhouse.load import MEMORY_STAGE_MAX_BYTES, casts_cannot_fail, key_columns, stage_engine
from eventspark.destinations.clickhouse.load import ClickHouseWarehouse as ClickHouseAdapter
from eventspark.steps.diff import Table, TablePatch
from eventspark.steps.typing import DataType
from tests.destinations.conftest import ClickHouseServer
from tests.destinations.contract import AdapterContract

B, N, F, T, S = DataType.BOOL, DataType.INT64, DataType.FLOAT64, DataType.TIMESTAMP, DataType.STRING
EVENT_COLUMNS = {"_timestamp": T, "eventn_ctx_event_id": S}


def destination(dsn: str, db: str, **clickhouse: Any) -> ClickHouseDestination:
    block = {"dsns": [dsn], "db": db, **clickhouse}
    return ClickHouseDestination.model_validate({"type": "clickhouse", "clickhouse": block})


def layout(**clickhouse: Any) -> Any:
    from eventspark.destinations.clickhouse.load import layout_of

    return layout_of(destination("http://h:8123/db", "db", **clickhouse).clickhouse)


class TestClickHouseAdapter(AdapterContract):
    @pytest.fixture
    def adapter(self, clickhouse_server: ClickHouseServer, clickhouse_db: str) -> Iterator[ClickHouseAdapter]:
        self.server = clickhouse_server
        adapter = ClickHouseAdapter("ch", destination(clickhouse_server.url, clickhouse_db))
        yield adapter
        adapter.close()

    def query(self, adapter: Any, sql: str) -> list[tuple[Any, ...]]:
        """Rows of `sql` after merging every table: what the adapter promises holds after
        `OPTIMIZE TABLE ... FINAL`."""
        db = adapter.layout.db
        tables = self.server.query(
            f"SELECT name FROM system.tables WHERE database = '{db}' AND engine LIKE '%MergeTree'"
        )
        for (table,) in tables:
            self.server.query(f"OPTIMIZE TABLE {adapter.dialect.quote(db)}.{adapter.dialect.quote(table)} FINAL")
        return [tuple(row) for row in self.server.query(sql)]

    def test_commit_casts_promoted_chunks_and_records_markers(self, adapter: ClickHouseAdapter) -> None:
        # ClickHouse's version of the contract: DateTime has whole seconds, and a NULL in a
        # non-nullable column becomes the type's default.
        target = self.create(adapter, "t", {"flag": N, "amount": F, "ts": T, "label": S})
        one = self.stage(adapter, "job1", {"flag": B, "amount": N, "ts": T}, [[True, 3, "2020-08-02T18:23:56.5+02:00"]])
        two = self.stage(adapter, "job1", {"flag": N, "label": S}, [[7, "x"], [None, "y"]])
        adapter.commit(Load("d", target, [one, two], ["log-a", "log-b"]))
        rows = self.query(
            adapter, f"SELECT flag, amount, toString(ts, 'UTC'), label FROM {self.name(adapter, 't')} ORDER BY label"
        )
        zero_date = rows[1][2]  # '0000-00-00 00:00:00' on 18.x, '1970-01-01 00:00:00' on later releases
        assert zero_date in ("0000-00-00 00:00:00", "1970-01-01 00:00:00")
        assert rows == [(1, 3.0, "2020-08-02 16:23:56", ""), (7, 0.0, zero_date, "x"), (0, 0.0, zero_date, "y")]
        assert adapter.loaded_files("d", ["log-a", "log-b", "log-c"]) == {("log-a", "t"), ("log-b", "t")}
        assert adapter.loaded_files("other", ["log-a"]) == set()
        assert adapter.read_tables().keys() == {"t"}  # stage and prepared tables are gone

    def test_default_table_is_replacing_merge_tree(self, adapter: ClickHouseAdapter) -> None:
        self.create(adapter, "events", {**EVENT_COLUMNS, "n": N})
        (engine,) = self.server.query(
            f"SELECT engine_full FROM system.tables WHERE database = '{adapter.schema}' AND name = 'events'"
        )
        assert engine[0].startswith(
            "ReplacingMergeTree(_timestamp) PARTITION BY toYYYYMM(_timestamp) ORDER BY eventn_ctx_event_id"
        )
        found = adapter.read_table("events")
        assert found is not None and found.primary_keys == ("eventn_ctx_event_id",)
        assert found.columns == {"_timestamp": "DateTime", "eventn_ctx_event_id": "String", "n": "Int64"}

    def test_nullable_fields_keep_nulls(self, clickhouse_server: ClickHouseServer, clickhouse_db: str) -> None:
        self.server = clickhouse_server
        adapter = ClickHouseAdapter(
            "ch",
            destination(clickhouse_server.url, clickhouse_db, engine={"nullable_fields": ["n", "eventn_ctx_event_id"]}),
        )
        target = self.create(adapter, "e", {**EVENT_COLUMNS, "n": N, "m": N})
        # The ORDER BY column stays non-nullable: ClickHouse keys cannot hold NULL.
        assert target.columns["n"] == "Nullable(Int64)" and target.columns["eventn_ctx_event_id"] == "String"
        chunk = self.stage(
            adapter, "j", {**EVENT_COLUMNS, "n": N, "m": N}, [["2020-08-02T18:23:56Z", "e1", None, None]]
        )
        adapter.commit(Load("d", target, [chunk], ["l"]))
        assert self.query(adapter, f"SELECT n, m FROM {self.name(adapter, 'e')}") == [(None, 0)]
        adapter.close()

    def test_rerun_after_a_crash_before_the_marker_collapses_duplicates(self, adapter: ClickHouseAdapter) -> None:
        target = self.create(adapter, "events", {**EVENT_COLUMNS, "v": S})
        rows = [[f"2020-08-02T18:23:5{i}Z", f"id{i}", f"v{i}"] for i in range(5)]
        columns = {**EVENT_COLUMNS, "v": S}
        first = self.stage(adapter, "crashed", columns, rows)
        adapter.commit(Load("d", target, [first], []))  # the copy went in, the marker never did
        assert adapter.loaded_files("d", ["log"]) == set()
        again = self.stage(adapter, "rerun", columns, rows)
        adapter.commit(Load("d", target, [again], ["log"]))
        counted = self.query(
            adapter, f"SELECT count(), uniqExact(eventn_ctx_event_id) FROM {self.name(adapter, 'events')}"
        )
        assert counted == [(5, 5)]
        assert adapter.loaded_files("d", ["log"]) == {("log", "events")}

    def test_hostile_names(self, adapter: ClickHouseAdapter) -> None:
        names = ["a`b", "back\\slash", "it's", "x`; DROP TABLE y; --", "naïve ünïcode"]
        table = "t`\\'\"; DROP DATABASE x"
        target = self.create(adapter, table, {n: S for n in names} | {"n m": N})
        chunk = self.stage(adapter, "jh", {n: S for n in names} | {"n m": N}, [[*names, 1]])
        adapter.commit(Load("d", target, [chunk], ["l"]))
        adapter.insert(target, [{n: n.upper() for n in names} | {"n m": 2}])
        rows = self.query(adapter, f"SELECT * FROM {self.name(adapter, table)} ORDER BY `n m`")
        assert rows == [(*names, 1), (*(n.upper() for n in names), 2)]
        assert set(adapter.read_table(table).columns) == {*names, "n m"}  # type: ignore[union-attr]
        assert adapter.loaded_files("d", ["l"]) == {("l", table)}

    def test_tsv_and_json_stages_load_the_same_rows(self, adapter: ClickHouseAdapter) -> None:
        columns = {"a`b": S, "it's": S, "n": N, "f": F, "b": B, "ts": T}
        rows = [
            ['tab\tnew\nline\\ \x00 "q" é — 😀', "\\N", -(2**63), 1e300, True, "2020-08-02T18:23:56.5+02:00"],
            [None, "", None, -0.5, False, None],
            ["int in a float column", "", 7, 3, None, None],  # JSON: 3, read as Float64
        ]
        for table in ("via_tsv", "via_json"):
            target = self.create(adapter, table, columns)
            writer: Any = adapter.stage_target("jt").open()
            if table == "via_tsv":
                chunk = writer.write(columns, rows)
            else:
                lines = b"".join(orjson.dumps(dict(zip(columns, r, strict=True))) + b"\n" for r in rows)
                chunk = writer.write_json(columns, lines, len(rows))
            writer.close()
            adapter.commit(Load("d", target, [chunk], [table]))
        select = "SELECT `a``b`, `it\\'s`, n, f, b, toString(ts, 'UTC') FROM {} ORDER BY f"
        via_tsv = self.query(adapter, select.format(self.name(adapter, "via_tsv")))
        assert via_tsv == self.query(adapter, select.format(self.name(adapter, "via_json")))
        assert via_tsv[2][:5] == (rows[0][0], "\\N", -(2**63), 1e300, 1)
        assert via_tsv[1][:5] == ("int in a float column", "", 7, 3.0, 0)
        assert via_tsv[0][:5] == ("", "", 0, -0.5, 0)  # NULLs in non-nullable columns: the defaults

    def test_json_lines_may_name_columns_the_chunk_lacks(self, adapter: ClickHouseAdapter) -> None:
        # A key whose value is null in every row of a chunk gets no staging column.
        target = self.create(adapter, "nul", {"a": S, "gone": S})
        writer: Any = adapter.stage_target("jn").open()
        chunk = writer.write_json({"a": S}, b'{"a":"x","gone":null}\n', 1)
        writer.close()
        adapter.commit(Load("d", target, [chunk], ["l"]))
        assert self.query(adapter, f"SELECT a, gone FROM {self.name(adapter, 'nul')}") == [("x", "")]

    def test_small_passes_stage_in_memory_and_a_lost_stage_fails_the_commit(self, adapter: ClickHouseAdapter) -> None:
        assert stage_engine(0) == "Log" and stage_engine(MEMORY_STAGE_MAX_BYTES + 1) == "Log"
        target = self.create(adapter, "mem", {"n": N})
        staged = adapter.stage_target("jm", pass_bytes=1000)
        assert staged.engine == "Memory"
        writer = staged.open()
        chunks = [writer.write_json({"n": N}, b'{"n":1}\n{"n":2}\n{"n":3}\n', 3) for _ in range(2)]
        writer.close()
        engines = self.server.query(
            f"SELECT engine FROM system.tables WHERE database = '{adapter.schema}' AND name = '{chunks[0].ref}'"
        )
        assert engines == [["Memory"]]
        # What a server restart does to a Memory table: it is still there, empty.
        self.server.query(f"TRUNCATE TABLE {self.name(adapter, chunks[1].ref)}")
        with pytest.raises(TransientError, match="holds 0 of its 3 rows"):
            adapter.commit(Load("d", target, chunks, ["l"]))
        assert adapter.loaded_files("d", ["l"]) == set()
        assert self.query(adapter, f"SELECT count() FROM {self.name(adapter, 'mem')}") == [(0,)]  # nothing copied

    def test_a_killed_pass_memory_stages_go_after_an_hour(self, adapter: ClickHouseAdapter) -> None:
        two_hours_ago = new_job_id(time.time() - 7200)
        memory = adapter.stage_target(two_hours_ago, pass_bytes=1000).open()
        log_stage = adapter.stage_target(two_hours_ago).open()
        kept = [memory.write_json({"n": N}, b'{"n":1}\n', 1), log_stage.write_json({"n": N}, b'{"n":1}\n', 1)]
        memory.close()
        log_stage.close()
        adapter.drop_stale_stages(time.time() - 24 * 3600)
        left = self.server.query(
            f"SELECT name FROM system.tables WHERE database = '{adapter.schema}' AND name LIKE '_es_stage_%'"
        )
        assert left == [[kept[1].ref]]  # the Log stage waits for the day

    def test_a_large_pair_is_copied_by_several_inserts_at_once(
        self, adapter: ClickHouseAdapter, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(ch_load, "MIN_COPY_ROWS", 2)
        running = [0, 0]  # copies running now, most at once
        lock = threading.Lock()
        execute = Client.execute

        def spy(client: Client, sql: str, *args: Any, **kwargs: Any) -> bytes:
            if not (sql.startswith("INSERT INTO") and " SELECT " in sql):
                return execute(client, sql, *args, **kwargs)
            with lock:
                running[0] += 1
                running[1] = max(running)
            try:
                time.sleep(0.2)  # long enough for every copy to have started
                return execute(client, sql, *args, **kwargs)
            finally:
                with lock:
                    running[0] -= 1

        monkeypatch.setattr(Client, "execute", spy)
        target = self.create(adapter, "par", {**EVENT_COLUMNS, "n": N})
        columns = {**EVENT_COLUMNS, "n": N}
        chunks = [
            self.stage(adapter, "jp", columns, [["2020-08-02T18:23:56Z", f"id{c}-{i}", i] for i in range(2 + c)])
            for c in range(5)
        ]
        assert len(ch_load.copy_groups(Load("d", target, chunks, []))) == 4
        adapter.commit(Load("d", target, chunks, ["l"]))
        assert self.query(adapter, f"SELECT count(), sum(n) FROM {self.name(adapter, 'par')}") == [(20, 35)]
        assert running[1] == 4  # the four INSERTs ran at once
        # One of the inserts failing fails the commit and no marker is written; the others went
        # in (the rerun inserts them again: ReplacingMergeTree collapses the copies).
        again = [
            self.stage(adapter, "jq", columns, [["2020-08-02T18:23:56Z", f"x{c}-{i}", 1] for i in range(2)])
            for c in range(3)
        ]
        self.server.query(f"TRUNCATE TABLE {self.name(adapter, again[1].ref)}")
        with pytest.raises(TransientError, match="holds 0 of its 2 rows"):
            adapter.commit(Load("d", target, again, ["l2"]))  # found short before any copy
        self.server.query(f"DROP TABLE {self.name(adapter, again[1].ref)}")
        monkeypatch.setattr(ClickHouseAdapter, "_check_stage", lambda *args: None)
        with pytest.raises(TerminalError):
            adapter.commit(Load("d", target, again, ["l2"]))
        assert adapter.loaded_files("d", ["l2"]) == set()
        partial = self.server.query(
            f"SELECT count() FROM {self.name(adapter, 'par')} WHERE startsWith(eventn_ctx_event_id, 'x')"
        )
        assert partial == [[4]]  # the two chunks whose INSERTs succeeded

    def test_add_columns_and_promote(self, adapter: ClickHouseAdapter) -> None:
        target = self.create(adapter, "p", {**EVENT_COLUMNS, "n": F})
        adapter.patch(TablePatch("p", add_columns={"s": "String", "b": "UInt8"}))
        adapter.patch(TablePatch("p", add_columns={"s": "String"}))  # already there: not an error
        target = adapter.read_table("p")
        assert target is not None and list(target.columns) == [*EVENT_COLUMNS, "n", "s", "b"]
        ints = self.stage(
            adapter, "jp", {**EVENT_COLUMNS, "n": N, "s": N, "b": B}, [["2020-01-01T00:00:00Z", "a", 2, 5, True]]
        )
        floats = self.stage(adapter, "jp", {**EVENT_COLUMNS, "n": F, "s": F}, [["2020-01-01T00:00:00Z", "b", 2.5, 1.5]])
        texts = self.stage(
            adapter, "jp", {**EVENT_COLUMNS, "s": S, "b": B}, [["2020-01-01T00:00:00Z", "c", "t", False]]
        )
        adapter.commit(Load("d", target, [ints, floats, texts], ["l"]))
        rows = self.query(
            adapter, f"SELECT eventn_ctx_event_id, n, s, b FROM {self.name(adapter, 'p')} ORDER BY eventn_ctx_event_id"
        )
        assert rows == [("a", 2.0, "5", 1), ("b", 2.5, "1.5", 0), ("c", 0.0, "t", 0)]

    def test_bool_promoted_to_text_prints_true_false(self, adapter: ClickHouseAdapter) -> None:
        target = self.create(adapter, "b", {"s": S})
        chunk = self.stage(adapter, "jb", {"s": B}, [[True], [False], [None]])
        adapter.commit(Load("d", target, [chunk], ["l"]))
        assert self.query(adapter, f"SELECT s FROM {self.name(adapter, 'b')} ORDER BY s") == [
            ("",),
            ("false",),
            ("true",),
        ]

    def test_stream_insert_converts_values_and_fills_defaults(self, adapter: ClickHouseAdapter) -> None:
        target = self.create(adapter, "events", {**EVENT_COLUMNS, "n": N, "f": F, "b": B, "s": S})
        adapter.insert(
            target,
            [
                {"_timestamp": "2020-08-02T18:23:56.291383+02:00", "eventn_ctx_event_id": "a", "n": 1, "b": True},
                {"_timestamp": "2020-08-02T18:23:57Z", "eventn_ctx_event_id": "b", "f": 1.5, "s": "x\ty\nz"},
                {"_timestamp": "2020-08-02T18:23:58Z", "eventn_ctx_event_id": "c", "n": None},
            ],
        )
        rows = self.query(
            adapter,
            f"SELECT toString(_timestamp, 'UTC'), eventn_ctx_event_id, n, f, b, s "
            f"FROM {self.name(adapter, 'events')} ORDER BY eventn_ctx_event_id",
        )
        assert rows == [
            ("2020-08-02 16:23:56", "a", 1, 0.0, 1, ""),
            ("2020-08-02 18:23:57", "b", 0, 1.5, 0, "x\ty\nz"),
            ("2020-08-02 18:23:58", "c", 0, 0.0, 0, ""),
        ]
        with pytest.raises(TerminalError, match="not a number"):
            adapter.insert(target, [{"eventn_ctx_event_id": "d", "n": "not a number"}])

    def test_server_down_is_transient_and_nothing_is_lost(self, adapter: ClickHouseAdapter) -> None:
        target = self.create(adapter, "events", {**EVENT_COLUMNS, "n": N})
        columns = {**EVENT_COLUMNS, "n": N}
        chunk = self.stage(adapter, "jd", columns, [["2020-01-01T00:00:00Z", f"e{i}", i] for i in range(3)])
        self.server.stop()
        try:
            with pytest.raises(TransientError):
                adapter.commit(Load("d", target, [chunk], ["l"]))
            with pytest.raises(TransientError):
                adapter.insert(target, [{"_timestamp": "2020-01-01T00:00:00Z", "eventn_ctx_event_id": "s", "n": 9}])
            with pytest.raises(TransientError):
                adapter.loaded_files("d", ["l"])
        finally:
            self.server.start()
        # The retries after the server is back: the staged chunk survived the restart.
        adapter.commit(Load("d", target, [chunk], ["l"]))
        adapter.insert(target, [{"_timestamp": "2020-01-01T00:00:00Z", "eventn_ctx_event_id": "s", "n": 9}])
        rows = self.query(adapter, f"SELECT eventn_ctx_event_id, n FROM {self.name(adapter, 'events')} ORDER BY n")
        assert rows == [("e0", 0), ("e1", 1), ("e2", 2), ("s", 9)]
        assert adapter.loaded_files("d", ["l"]) == {("l", "events")}

    def test_key_change_is_refused(self, adapter: ClickHouseAdapter) -> None:
        self.create(adapter, "k", {**EVENT_COLUMNS, "a": S})
        with pytest.raises(TerminalError, match="ORDER BY key"):
            adapter.patch(TablePatch("k", primary_keys=("a",)))

    def test_upsert_within_a_load_keeps_last_by_order_column(self, adapter: ClickHouseAdapter) -> None:
        target = self.create(adapter, "u", {"id": S, "v": N}, keys=("id",))
        chunk = self.stage(adapter, "ju", {"id": S, "v": N, ORDER_COLUMN: N}, [["a", 1, 5], ["a", 2, 9], ["a", 3, 7]])
        adapter.commit(Load("d", target, [chunk], ["l"], ordered=True))
        # Without merging: one row went in, the one with the highest order column.
        assert [tuple(r) for r in self.server.query(f"SELECT id, v FROM {self.name(adapter, 'u')}")] == [("a", 2)]

    def test_unreachable_server_is_transient(self, clickhouse_db: str) -> None:
        from tests.destinations.conftest import free_port

        adapter = ClickHouseAdapter("ch", destination(f"http://127.0.0.1:{free_port()}", clickhouse_db))
        with pytest.raises(TransientError, match="connecting"):
            adapter.read_tables()

    def test_second_dsn_is_used_when_the_first_is_down(
        self, clickhouse_server: ClickHouseServer, clickhouse_db: str
    ) -> None:
        from tests.destinations.conftest import free_port

        dest = destination(f"http://127.0.0.1:{free_port()}", clickhouse_db)
        dest.clickhouse.dsns.append(clickhouse_server.url)
        adapter = ClickHouseAdapter("ch", dest)
        assert adapter.read_tables() == {}
        assert adapter.stage_target("j").endpoint.port == clickhouse_server.http_port
        adapter.close()


# --- without a server -------------------------------------------------------------------------


def test_default_ddl_text() -> None:
    columns = {"_timestamp": "DateTime", "eventn_ctx_event_id": "String", "n": "Int64"}
    (statement,) = create_statements(layout(), "events", columns, ())
    assert statement == (
        "CREATE TABLE IF NOT EXISTS `db`.`events` (`_timestamp` DateTime, `eventn_ctx_event_id` String, "
        "`n` Int64) ENGINE = ReplacingMergeTree(`_timestamp`) PARTITION BY (toYYYYMM(`_timestamp`)) "
        "ORDER BY (`eventn_ctx_event_id`)"
    )


def test_cluster_ddl_text() -> None:
    columns = {"_timestamp": "DateTime", "eventn_ctx_event_id": "String", "n": "Int64"}
    table, dist = create_statements(layout(cluster="main"), "ev", columns, ())
    assert table == (
        "CREATE TABLE IF NOT EXISTS `db`.`ev` ON CLUSTER `main` (`_timestamp` DateTime, "
        "`eventn_ctx_event_id` String, `n` Int64) ENGINE = ReplicatedReplacingMergeTree("
        "'/clickhouse/tables/{shard}/db/ev', '{replica}', `_timestamp`) PARTITION BY (toYYYYMM(`_timestamp`)) "
        "ORDER BY (`eventn_ctx_event_id`)"
    )
    assert dist == (
        "CREATE TABLE IF NOT EXISTS `db`.`dist_ev` ON CLUSTER `main` AS `db`.`ev` "
        "ENGINE = Distributed('main', 'db', 'ev', cityHash64(`eventn_ctx_event_id`))"
    )
    assert add_column_statements(layout(cluster="main"), "ev", {"x": "String"}) == [
        "ALTER TABLE `db`.`ev` ON CLUSTER `main` ADD COLUMN `x` String",
        "ALTER TABLE `db`.`dist_ev` ON CLUSTER `main` ADD COLUMN `x` String",
    ]
    assert layout(cluster="main").insert_target("ev") == "`db`.`dist_ev`"


def test_configured_engine_ddl_text() -> None:
    engine = {
        "partition_fields": [{"function": "toYYYYMMDD", "field": "_timestamp"}],
        "order_fields": [{"field": "user"}, {"function": "toStartOfHour", "field": "_timestamp"}],
        "primary_keys": ["user"],
        "nullable_fields": ["note", "user"],
    }
    columns = {"_timestamp": "DateTime", "user": "String", "note": "String"}
    (statement,) = create_statements(layout(engine=engine), "t", columns, ())
    assert statement == (
        "CREATE TABLE IF NOT EXISTS `db`.`t` (`_timestamp` DateTime, `user` String, `note` Nullable(String)) "
        "ENGINE = ReplacingMergeTree(`_timestamp`) PARTITION BY (toYYYYMMDD(`_timestamp`)) "
        "ORDER BY (`user`, toStartOfHour(`_timestamp`)) PRIMARY KEY (`user`)"
    )
    raw = layout(engine={"raw_statement": "ENGINE = MergeTree() ORDER BY tuple()"})
    assert create_statements(raw, "t", {"a": "String"}, ())[0].endswith(
        "(`a` String) ENGINE = MergeTree() ORDER BY tuple()"
    )


def test_ddl_without_event_columns_never_collapses_everything() -> None:
    (plain,) = create_statements(layout(), "t", {"a": "String"}, ())
    assert plain.endswith("ENGINE = MergeTree() ORDER BY tuple()")
    (keyed,) = create_statements(layout(), "t", {"a": "String"}, ("a",))
    assert keyed.endswith("ENGINE = ReplacingMergeTree() ORDER BY (`a`)")


def test_bad_key_function_is_terminal() -> None:
    with pytest.raises(TerminalError, match="not a function name"):
        layout(engine={"order_fields": [{"function": "x); DROP TABLE y; --", "field": "a"}]})


def test_dsn_parsing() -> None:
    ep = parse_dsn("https://u%40x:p%3Aw@host/db?timeout=1m&max_execution_time=5&tls_config=main", {"main": "/ca.pem"})
    assert (ep.scheme, ep.host, ep.port, ep.user, ep.password) == ("https", "host", 8443, "u@x", "p:w")
    assert ep.settings == (("max_execution_time", "5"),) and ep.timeout == 60.0 and ep.ca_file == "/ca.pem"
    assert parse_dsn("http://h/db").port == 8123 and parse_dsn("http://h/db").user == "default"
    for bad in ("tcp://h:9000/db", "http:///db", "http://h/db?tls_config=none", "http://h/db?timeout=soon"):
        with pytest.raises(TerminalError):
            parse_dsn(bad)


def test_errors_are_classified() -> None:
    assert isinstance(
        _server_error(500, b"Code: 209, e.displayText() = DB::NetException: Timeout", "x"), TransientError
    )
    assert isinstance(_server_error(500, b"Code: 6, e.displayText() = DB::Exception: Cannot parse", "x"), TerminalError)
    assert isinstance(_server_error(503, b"Service Unavailable", "x"), TransientError)
    assert isinstance(_server_error(403, b"Forbidden", "x"), TerminalError)
    with pytest.raises(TransientError):
        Client(parse_dsn("http://127.0.0.1:1/db")).execute("SELECT 1")


def test_sorting_key_and_type_parsing() -> None:
    assert key_columns("eventn_ctx_event_id") == ("eventn_ctx_event_id",)
    assert key_columns("a, `b, c`, toStartOfHour(_timestamp), `x\\`y`") == ("a", "b, c", "x`y")
    assert key_columns("") == ()
    assert data_type_of("Nullable(Int64)") is N and data_type_of("UInt8") is B
    assert data_type_of("LowCardinality(Nullable(String))") is S and data_type_of("DateTime('UTC')") is T
    assert data_type_of("Decimal(12, 2)") is F and data_type_of("Array(String)") is None


def test_build_destination_makes_the_adapter(tmp_path: Any) -> None:
    adapter = build_destination("ch", destination("http://h:8123/db", "db"), tmp_path)
    assert isinstance(adapter, ClickHouseAdapter)


# --- end to end: batch passes on the shared SparkSession ---------------------------------------


def _batch(spark: Any, loaded: Any, fault: Any = None) -> Any:
    from eventspark.batch.process import run_pass
    from eventspark.coordination import MemoryCoordination

    return run_pass(loaded, MemoryCoordination("test"), fault=fault, session=spark)


def _config(root: Any, server: ClickHouseServer, db: str, template: str, **layout: Any) -> Any:
    from tests.batch.helpers import make_config

    dest = {"type": "clickhouse", "clickhouse": {"dsns": [server.url], "db": db}}
    return make_config(root, {"ch": {**dest, "data_layout": {"table_name_template": template, **layout}}})


def _final(server: ClickHouseServer, db: str, sql: str) -> list[tuple[Any, ...]]:
    for (table,) in server.query(
        f"SELECT name FROM system.tables WHERE database = '{db}' AND engine LIKE '%MergeTree'"
    ):
        server.query(f"OPTIMIZE TABLE `{db}`.`{table}` FINAL")
    return [tuple(r) for r in server.query(sql)]


def _line_id(line: bytes) -> str:
    """The id a line without one gets at load: the first 122 bits of its SHA-256 in a version 8 UUID."""
    raw = bytearray(hashlib.sha256(line.strip()).digest()[:16])
    raw[6] = 0x80 | (raw[6] & 0x0F)  # version 8
    raw[8] = 0x80 | (raw[8] & 0x3F)  # RFC 9562 variant
    return str(uuid.UUID(bytes=bytes(raw)))


@pytest.mark.spark
def test_batch_loads_the_fixture_log(
    spark: Any, tmp_path: Any, clickhouse_server: ClickHouseServer, clickhouse_db: str
) -> None:
    from tests.batch.helpers import FIXTURE_LOG, MONTHLY, put_log

    loaded = _config(tmp_path, clickhouse_server, clickhouse_db, MONTHLY)
    log = put_log(tmp_path, FIXTURE_LOG)
    result = _batch(spark, loaded)
    assert result.ok and not log.exists()
    counts = {"notification_2020_08": 1, "null_2020_08": 1, "skipped_2020_08": 1, "user_2020_07": 1, "user_2020_08": 3}
    for table, count in counts.items():
        assert clickhouse_server.query(f"SELECT count() FROM `{clickhouse_db}`.`{table}`") == [[count]]
    types = dict(
        tuple(r)
        for r in clickhouse_server.query(
            f"SELECT name, type FROM system.columns WHERE database = '{clickhouse_db}' AND table = 'user_2020_08'"
        )
    )
    assert types["_timestamp"] == "DateTime" and types["key10_sib1_1"] == "String"
    assert types["_geo_data_zip"] == "Int64"
    # Mixed values of one column are promoted within the batch; NULL is '' in a String column.
    values = clickhouse_server.query(f"SELECT key10_sib1_1 FROM `{clickhouse_db}`.user_2020_08 ORDER BY key10_sib1_1")
    assert values == [[""], ["50.0"], ["k"]]
    # The fixture's lines have no event id: each gets one derived from the line at load (as
    # EventNative gave one), so the table is EventNative's default, keyed by the event id.
    (engine,) = clickhouse_server.query(
        f"SELECT engine_full FROM system.tables WHERE database = '{clickhouse_db}' AND name = 'user_2020_08'"
    )
    assert engine[0].startswith(
        "ReplacingMergeTree(_timestamp) PARTITION BY toYYYYMM(_timestamp) ORDER BY eventn_ctx_event_id "
    )
    ids = clickhouse_server.query(f"SELECT eventn_ctx_event_id FROM `{clickhouse_db}`.user_2020_08")
    lines = [line for line in FIXTURE_LOG.read_bytes().splitlines() if line.strip()]
    august_users = [line for line in lines if b'"event_type":"user"' in line and b'"_timestamp":"2020-08' in line]
    assert len(august_users) == 3
    assert sorted(i for (i,) in ids) == sorted(_line_id(line) for line in august_users)
    stages = clickhouse_server.query(
        f"SELECT count() FROM system.tables WHERE database = '{clickhouse_db}' AND name LIKE '\\\\_es\\\\_%'"
    )
    assert stages == [[0]]


@pytest.mark.spark
def test_batch_adds_columns_promotes_and_fails_misfits(
    spark: Any, tmp_path: Any, clickhouse_server: ClickHouseServer, clickhouse_db: str
) -> None:
    from tests.batch.helpers import event, failed_lines, put_log

    loaded = _config(tmp_path, clickhouse_server, clickhouse_db, "t")
    put_log(tmp_path, [event("a", n=1, f=1), event("b", n=2, f=2.5)])
    assert _batch(spark, loaded).ok
    put_log(tmp_path, [event("c", n=1.5, extra="new"), event("d", n=4, extra="x")])
    result = _batch(spark, loaded)
    assert result.ok and result.pairs["ch", "t"].failed == 1
    rows = _final(
        clickhouse_server,
        clickhouse_db,
        f"SELECT eventn_ctx_event_id, n, f, extra FROM `{clickhouse_db}`.t ORDER BY eventn_ctx_event_id",
    )
    assert rows == [("a", 1, 1.0, ""), ("b", 2, 2.5, ""), ("d", 4, 0.0, "x")]
    assert [f["event_id"] for f in failed_lines(tmp_path, "ch")] == ["c"]


@pytest.mark.spark
def test_batch_crash_between_copy_and_marker_then_rerun(
    spark: Any, tmp_path: Any, clickhouse_server: ClickHouseServer, clickhouse_db: str, monkeypatch: Any
) -> None:
    from tests.batch.helpers import event, put_log

    loaded = _config(tmp_path, clickhouse_server, clickhouse_db, "t")
    log = put_log(tmp_path, [event(str(i), n=i) for i in range(20)])
    real_commit = ClickHouseAdapter.commit

    def crash_before_marker(self: ClickHouseAdapter, load: Load) -> None:
        real_commit(self, Load(load.dest_id, load.table, load.chunks, [], load.ordered))
        raise SystemExit("crash after the copy, before the marker")

    monkeypatch.setattr(ClickHouseAdapter, "commit", crash_before_marker)
    with pytest.raises(SystemExit):
        _batch(spark, loaded)
    monkeypatch.setattr(ClickHouseAdapter, "commit", real_commit)
    assert log.exists()
    assert _batch(spark, loaded).ok and not log.exists()
    rows = _final(clickhouse_server, clickhouse_db, f"SELECT count(), uniqExact(n) FROM `{clickhouse_db}`.t")
    assert rows == [(20, 20)]


@pytest.mark.spark
def test_batch_with_a_server_restart_between_stage_and_commit_loses_nothing(
    spark: Any, tmp_path: Any, clickhouse_server: ClickHouseServer, clickhouse_db: str
) -> None:
    from tests.batch.helpers import event, put_log

    loaded = _config(tmp_path, clickhouse_server, clickhouse_db, "t")
    log = put_log(tmp_path, [event(str(i), n=i) for i in range(20)])

    def restart(point: str) -> None:
        if point == "staged":  # the executors' Memory staging tables come back empty
            clickhouse_server.stop()
            clickhouse_server.start()

    first = _batch(spark, loaded, fault=restart)
    assert not first.ok and log.exists()
    assert "holds 0 of its" in first.pairs["ch", "t"].error
    assert _batch(spark, loaded).ok and not log.exists()
    assert _final(clickhouse_server, clickhouse_db, f"SELECT count(), uniqExact(n) FROM `{clickhouse_db}`.t") == [
        (20, 20)
    ]


@pytest.mark.spark
def test_batch_with_the_server_down_keeps_the_log_then_loads_it(
    spark: Any, tmp_path: Any, clickhouse_server: ClickHouseServer, clickhouse_db: str
) -> None:
    from tests.batch.helpers import event, put_log

    loaded = _config(tmp_path, clickhouse_server, clickhouse_db, "t")
    log = put_log(tmp_path, [event(str(i), n=i) for i in range(5)])
    clickhouse_server.stop()
    try:
        down = _batch(spark, loaded)
    finally:
        clickhouse_server.start()
    assert not down.ok and log.exists()
    assert _batch(spark, loaded).ok and not log.exists()
    assert clickhouse_server.query(f"SELECT count() FROM `{clickhouse_db}`.t") == [[5]]


def test_rows_skip_the_prepared_table_only_when_no_cast_can_fail() -> None:
    columns = {"n": "Nullable(Int64)", "f": "Float64", "s": "Nullable(String)", "ts": "DateTime", "d": "Decimal(9,2)"}
    table = Table("t", dict(columns))

    def safe(*stages: dict[str, DataType]) -> bool:
        chunks = [StagedChunk(f"c{i}", stage, 1) for i, stage in enumerate(stages)]
        load = Load("d", table, chunks, [])
        return casts_cannot_fail(load, [c for c in columns if any(c in s for s in stages)])

    assert safe({"n": DataType.BOOL, "f": DataType.INT64}, {"s": DataType.FLOAT64, "ts": DataType.TIMESTAMP})
    assert not safe({"n": DataType.STRING})  # text into a number can be refused
    assert not safe({"f": DataType.INT64}, {"d": DataType.FLOAT64})  # a literal Decimal can overflow


def test_copy_groups_balance_whole_chunks_and_keep_keyed_loads_whole() -> None:
    table = Table("t", {"id": "String"}, primary_keys=("id",))
    sizes = [90_000, 60_000, 50_000, 40_000, 10_000]
    chunks = [StagedChunk(f"c{i}", {"id": DataType.STRING}, rows) for i, rows in enumerate(sizes)]
    groups = ch_load.copy_groups(Load("d", table, chunks, []))
    assert len(groups) == 2 and sorted(sum(c.rows for c in g.chunks) for g in groups) == [120_000, 130_000]
    assert sorted(c.ref for g in groups for c in g.chunks) == [c.ref for c in chunks]
    keyed = Load("d", table, chunks, [], ordered=True)
    assert ch_load.copy_groups(keyed) == [keyed]
    assert len(ch_load.copy_groups(Load("d", table, chunks[:1], []))) == 1
    assert len(ch_load.copy_groups(Load("d", table, chunks[3:], []))) == 1  # 50,000 rows: one insert
