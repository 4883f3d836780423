"""The contract every destination adapter passes; each warehouse's test module subclasses it.

A subclass provides the `adapter` fixture (a fresh, empty schema) and `query`, which runs SQL on
the warehouse and returns rows. Values are read back through CAST(... AS VARCHAR) so that the
same expectations hold everywhere.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from eventspark.destinations.base import ORDER_COLUMN, DestinationAdapter, Load, TerminalError, new_job_id
from eventspark.steps.diff import Table, TablePatch
from eventspark.steps.typing import DataType

B, INT, F, T, S = DataType.BOOL, DataType.INT64, DataType.FLOAT64, DataType.TIMESTAMP, DataType.STRING


class AdapterContract:
    def query(self, adapter: DestinationAdapter, sql: str) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def name(self, adapter: DestinationAdapter, table: str) -> str:
        """The qualified, quoted name of `table` for `query`."""
        schema: str = adapter.schema  # type: ignore[attr-defined]
        return f"{adapter.dialect.quote(schema)}.{adapter.dialect.quote(table)}"

    def create(self, adapter: DestinationAdapter, table: str, columns: dict[str, DataType], keys: tuple[str, ...] = ()):
        sql_types = {c: adapter.dialect.types[t] for c, t in columns.items()}
        adapter.patch(TablePatch(table, create=True, add_columns=sql_types, primary_keys=keys or None))
        found = adapter.read_table(table)
        assert found is not None
        return found

    def stage(self, adapter: DestinationAdapter, job: str, columns: dict[str, DataType], rows: list[list[Any]]):
        """Stages the rows as executors do: as JSON lines when the stage takes them."""
        target = adapter.stage_target(job)
        writer: Any = target.open()
        try:
            if target.json_lines:
                lines = b"".join(orjson.dumps(dict(zip(columns, row, strict=True))) + b"\n" for row in rows)
                return writer.write_json(columns, lines, len(rows))
            return writer.write(columns, rows)
        finally:
            writer.close()

    def test_new_schema_has_no_tables(self, adapter: DestinationAdapter) -> None:
        assert adapter.read_tables() == {}
        assert adapter.read_table("events") is None

    def test_create_then_add_columns_keeps_existing(self, adapter: DestinationAdapter) -> None:
        table = self.create(adapter, "events", {"id": S, "n": INT}, keys=("id",))
        assert list(table.columns) == ["id", "n"]
        assert table.primary_keys == ("id",)
        adapter.patch(TablePatch("events", add_columns={"extra col": adapter.dialect.types[F]}))
        after = adapter.read_table("events")
        assert after is not None
        assert list(after.columns) == ["id", "n", "extra col"]
        assert adapter.data_type_of(after.columns["n"]) is INT
        assert adapter.data_type_of(after.columns["extra col"]) is F
        assert set(adapter.read_tables()) == {"events"}

    def test_commit_casts_promoted_chunks_and_records_markers(self, adapter: DestinationAdapter) -> None:
        target = self.create(adapter, "t", {"flag": INT, "amount": F, "ts": T, "label": S})
        stamp = "2020-08-02T18:23:56.5+02:00"
        one = self.stage(adapter, "job1", {"flag": B, "amount": INT, "ts": T}, [[True, 3, stamp]])
        two = self.stage(adapter, "job1", {"flag": INT, "label": S}, [[7, "x"], [None, "y"]])
        adapter.commit(Load("d", target, [one, two], ["log-a", "log-b"]))
        rows = self.query(
            adapter,
            f"SELECT CAST(flag AS VARCHAR), CAST(amount AS VARCHAR), CAST(ts AS VARCHAR), label "
            f"FROM {self.name(adapter, 't')} ORDER BY label NULLS FIRST",
        )
        assert [r[0] for r in rows] == ["1", "7", None]
        assert [None if r[1] is None else float(r[1]) for r in rows] == [3.0, None, None]
        assert rows[0][2].startswith("2020-08-02 16:23:56.5")
        assert [r[3] for r in rows] == [None, "x", "y"]
        assert adapter.loaded_files("d", ["log-a", "log-b", "log-c"]) == {("log-a", "t"), ("log-b", "t")}
        assert adapter.loaded_files("other", ["log-a"]) == set()

    def test_upsert_keeps_the_last_row_of_each_key(self, adapter: DestinationAdapter) -> None:
        target = self.create(adapter, "u", {"id": S, "v": INT}, keys=("id",))
        columns = {"id": S, "v": INT, ORDER_COLUMN: INT}
        first = self.stage(adapter, "job1", columns, [["a", 1, 1], ["b", 1, 2]])
        adapter.commit(Load("d", target, [first], ["l1"], ordered=True))
        second = self.stage(adapter, "job2", columns, [["a", 3, 20], ["a", 2, 10], ["c", 1, 5]])
        adapter.commit(Load("d", target, [second], ["l2"], ordered=True))
        rows = self.query(adapter, f"SELECT id, CAST(v AS VARCHAR) FROM {self.name(adapter, 'u')} ORDER BY id")
        assert rows == [("a", "3"), ("b", "1"), ("c", "1")]

    def test_failed_commit_leaves_nothing(self, adapter: DestinationAdapter) -> None:
        target = self.create(adapter, "f", {"n": INT})
        good = self.stage(adapter, "job1", {"n": INT}, [[1]])
        bad = self.stage(adapter, "job1", {"n": S}, [["not a number"]])
        with pytest.raises(TerminalError, match="loading table 'f'"):
            adapter.commit(Load("d", target, [good, bad], ["l1"]))
        assert self.query(adapter, f"SELECT count(*) FROM {self.name(adapter, 'f')}") == [(0,)]
        assert adapter.loaded_files("d", ["l1"]) == set()

    def test_drop_stages_removes_uncommitted_chunks(self, adapter: DestinationAdapter) -> None:
        target = self.create(adapter, "s", {"n": INT})
        chunk = self.stage(adapter, "jobx", {"n": INT}, [[1]])
        adapter.drop_stages("jobx")
        with pytest.raises(TerminalError):
            adapter.commit(Load("d", target, [chunk], ["l1"]))
        assert adapter.read_tables().keys() == {"s"}

    def test_stale_stages_of_killed_jobs_are_dropped(self, adapter: DestinationAdapter) -> None:
        target = self.create(adapter, "st", {"n": INT})
        old = self.stage(adapter, new_job_id(time.time() - 7200), {"n": INT}, [[1]])
        recent = self.stage(adapter, new_job_id(time.time()), {"n": INT}, [[2]])
        adapter.drop_stale_stages(time.time() - 3600)
        with pytest.raises(TerminalError):
            adapter.commit(Load("d", target, [old], ["l1"]))
        adapter.commit(Load("d", target, [recent], ["l2"]))
        assert self.query(adapter, f"SELECT n FROM {self.name(adapter, 'st')}") == [(2,)]

    def test_insert_upserts_single_rows(self, adapter: DestinationAdapter) -> None:
        target = self.create(adapter, "i", {"id": S, "n": INT}, keys=("id",))
        adapter.insert(target, [{"id": "a", "n": 1}, {"id": "b", "n": 2}])
        adapter.insert(target, [{"id": "a", "n": 5}])
        rows = self.query(adapter, f"SELECT id, CAST(n AS VARCHAR) FROM {self.name(adapter, 'i')} ORDER BY id")
        assert rows == [("a", "5"), ("b", "2")]

    def test_quotes_untrusted_names(self, adapter: DestinationAdapter) -> None:
        name = 'we"ird; DROP TABLE x'
        target = self.create(adapter, name, {'co"l': S})
        chunk = self.stage(adapter, "jq", {'co"l': S}, [["v"]])
        adapter.commit(Load("d", target, [chunk], ["l1"]))
        assert self.query(adapter, f"SELECT * FROM {self.name(adapter, name)}") == [("v",)]


__all__ = ["AdapterContract", "Table"]
