"""The adapter contract on the machine's Postgres, plus what is Postgres-specific."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from eventspark.destinations.base import TransientError
from eventspark.destinations.postgres.configuration import PostgresDestination
from eventspark.destinations.postgres.load import PostgresWarehouse as PostgresAdapter
from eventspark.steps.diff import TablePatch
from eventspark.steps.typing import DataType
from tests.conftest import pg_conninfo
from tests.destinations.contract import AdapterContract


def _destination(datasource: dict[str, Any]) -> PostgresDestination:
    return PostgresDestination.model_validate({"type": "postgres", "datasource": datasource})


class TestPostgresAdapter(AdapterContract):
    @pytest.fixture
    def adapter(self, pg_datasource: dict[str, Any]) -> Iterator[PostgresAdapter]:
        adapter = PostgresAdapter("pg", _destination(pg_datasource))
        yield adapter
        adapter.close()

    def query(self, adapter: Any, sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(pg_conninfo()) as conn:
            return conn.execute(sql).fetchall()

    def test_primary_key_gets_eventnative_constraint_name(self, adapter: PostgresAdapter, pg_schema: str) -> None:
        self.create(adapter, "k", {"a": DataType.STRING, "b": DataType.STRING}, keys=("a",))
        created = self.query(adapter, f"SELECT conname FROM pg_constraint WHERE conname LIKE '{pg_schema}%'")
        assert created == [(f"{pg_schema}_k_pk",)]
        adapter.patch(TablePatch("k", primary_keys=("a", "b")))
        found = adapter.read_table("k")
        assert found is not None and found.primary_keys == ("a", "b")
        names = self.query(adapter, f"SELECT conname FROM pg_constraint WHERE conname LIKE '{pg_schema}%'")
        assert names == [(f"{pg_schema}_k_pk",)]

    def test_stage_tables_are_unlogged_and_hidden(self, adapter: PostgresAdapter, pg_schema: str) -> None:
        chunk = self.stage(adapter, "jobu", {"n": DataType.INT64}, [[1]])
        kind = self.query(adapter, f"SELECT relpersistence FROM pg_class WHERE relname = '{chunk.ref}'")
        assert kind == [("u",)]
        assert adapter.read_tables() == {}

    def test_unreachable_server_is_transient(self, pg_datasource: dict[str, Any]) -> None:
        adapter = PostgresAdapter("pg", _destination({**pg_datasource, "port": 1}))
        with pytest.raises(TransientError, match="connecting"):
            adapter.read_tables()
