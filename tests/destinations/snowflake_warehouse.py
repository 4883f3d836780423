"""The contract's `Warehouse` for Snowflake: a fresh database on the session's fakesnow server,
reached through a TCP proxy when the test takes the server away. Reads go through the driver with
EventNative's name rule applied by hand (plain names upper-case), bypassing eventspark."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from eventspark.destinations.snowflake.dialect import logical_name, stored_name
from tests.destinations.warehouses import _Proxied
from tests.emulators.snowflake import SF_HOST, sf_rows

SCHEMA = "events"


def _q(name: str) -> str:
    stored = stored_name(name)
    return '"' + stored.replace('"', '""') + '"'


class SnowflakeWarehouse(_Proxied):
    type_name = "snowflake"
    host = SF_HOST

    def __init__(self, request: pytest.FixtureRequest) -> None:
        super().__init__(request)
        self.port = request.getfixturevalue("fakesnow_server")
        self.db: str = request.getfixturevalue("snowflake_db")

    def destination(self, mode: str, layout: dict[str, Any], interruptible: bool = False) -> dict[str, Any]:
        host, port = self._endpoint(interruptible)
        block = {
            "account": "fakesnow",
            "db": self.db,
            "schema": SCHEMA,
            "username": "fake",
            "password": "snow",
            "warehouse": "test_wh",
            "host": host,
            "port": port,
            "protocol": "http",
            # Fail fast while the proxy is down (the connector retries until these run out).
            "parameters": {"login_timeout": "1", "network_timeout": "0.5"} if interruptible else {},
        }
        return {"type": "snowflake", "mode": mode, "snowflake": block, "data_layout": layout}

    def _rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return sf_rows(self.port, sql, list(params) or None, database=self.db)

    def tables(self) -> set[str]:
        rows = self._rows(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = ?", stored_name(SCHEMA)
        )
        return {logical_name(r[0]) for r in rows}

    def select(self, table: str, columns: Sequence[str]) -> list[tuple[Any, ...]]:
        found = self._rows(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = ? AND table_name = ?",
            stored_name(SCHEMA),
            stored_name(table),
        )
        types = {logical_name(c): t for c, t in found}
        # fakesnow's server returns a NULL timestamp as 1970-01-01: read timestamps as text.
        names = ", ".join(
            f"CAST({_q(c)} AS VARCHAR)" if types.get(c, "").startswith("TIMESTAMP") else _q(c) for c in columns
        )
        return self._rows(f"SELECT {names} FROM {_q(SCHEMA)}.{_q(table)}")
