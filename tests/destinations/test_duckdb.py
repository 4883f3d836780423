"""The adapter contract on a DuckDB file, plus what is DuckDB-specific."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventspark.destinations.base import Load, TerminalError
from eventspark.destinations.duckdb.load import DuckDBWarehouse as DuckDBAdapter
from eventspark.steps.diff import TablePatch
from eventspark.steps.typing import DataType
from tests.destinations.contract import AdapterContract


class TestDuckDBAdapter(AdapterContract):
    @pytest.fixture
    def adapter(self, tmp_path: Path) -> Iterator[DuckDBAdapter]:
        adapter = DuckDBAdapter("dd", tmp_path / "db" / "w.duckdb", "analytics", tmp_path / "staging")
        yield adapter
        adapter.close()

    def query(self, adapter: Any, sql: str) -> list[tuple[Any, ...]]:
        return adapter._connection().rows(sql, "test query")

    def test_changing_a_primary_key_is_refused(self, adapter: DuckDBAdapter) -> None:
        self.create(adapter, "k", {"a": DataType.STRING, "b": DataType.STRING}, keys=("a",))
        with pytest.raises(TerminalError, match="cannot change"):
            adapter.patch(TablePatch("k", primary_keys=("a", "b")))

    def test_a_key_can_be_added_once_and_committed_chunks_are_deleted(self, adapter: DuckDBAdapter) -> None:
        self.create(adapter, "k", {"a": DataType.STRING})
        adapter.patch(TablePatch("k", primary_keys=("a",)))
        target = adapter.read_table("k")
        assert target is not None and target.primary_keys == ("a",)
        chunk = self.stage(adapter, "jobd", {"a": DataType.STRING}, [["x"]])
        adapter.commit(Load("d", target, [chunk], ["l1"]))
        assert not Path(chunk.ref).exists()
        assert self.query(adapter, "SELECT a FROM analytics.k") == [("x",)]

    def test_chunks_are_parquet_files_under_the_staging_folder(self, adapter: DuckDBAdapter, tmp_path: Path) -> None:
        chunk = self.stage(adapter, "jobp", {"n": DataType.INT64, "s": DataType.STRING}, [[1, "a"], [True, None]])
        assert Path(chunk.ref).is_relative_to(tmp_path / "staging" / "jobp") and chunk.ref.endswith(".parquet")
        assert self.query(adapter, f"SELECT n, s FROM read_parquet('{chunk.ref}')") == [(1, "a"), (1, None)]
