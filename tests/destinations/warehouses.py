"""One `Warehouse` per registered destination type, for the end-to-end contract (`test_contract.py`).

A warehouse gives a test a fresh, empty target and everything it needs around it:

* `destination(mode, layout, interruptible)`: the destination's config dict as a user writes it
  (through a `TcpProxy` when `interruptible`, so that the test can take the server away);
* `down()` / `up()`: the target becomes unreachable, then reachable again, without touching the
  machine's servers (network warehouses: the proxy; DuckDB: another process holds the file lock);
* `tables()`, `select()`: what is really stored, read with the warehouse's own driver, bypassing
  eventspark (and the proxy); `absent(type)`: how a value the event lacked reads back.

`WAREHOUSES` maps a type name to a factory taking the test's `pytest.FixtureRequest`; a type of the
registry missing here fails the contract with a message saying so.
"""

from __future__ import annotations

import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlencode
from urllib.request import Request, urlopen

import orjson
import pytest

from eventspark.steps.typing import DataType
from tests.conftest import PG_HOST, PG_PORT, pg_conninfo
from tests.destinations.conftest import MYSQL_HOST, MYSQL_PORT, ClickHouseServer, mysql_connect
from tests.destinations.proxy import TcpProxy


class Warehouse(ABC):
    """A fresh target of one destination type, and ways to look into it and take it away."""

    type_name: ClassVar[str]
    exclusive_file: ClassVar[bool] = False
    """Only one process (and connection) may open the target: close eventspark's before reading."""
    readable_while_down: ClassVar[bool] = True
    """`select` works while `down()` (it bypasses what `down` breaks)."""

    @abstractmethod
    def destination(self, mode: str, layout: dict[str, Any], interruptible: bool = False) -> dict[str, Any]:
        """The destination's config (`type`, `mode`, the type's own block, `data_layout`)."""

    @abstractmethod
    def down(self) -> None:
        """Eventspark can no longer reach the target (refused, reset or locked)."""

    @abstractmethod
    def up(self) -> None:
        """The target is reachable again."""

    @abstractmethod
    def tables(self) -> set[str]:
        """Every table of the target, eventspark's own ones included."""

    @abstractmethod
    def select(self, table: str, columns: Sequence[str]) -> list[tuple[Any, ...]]:
        """`columns` of every row of `table` (deduplicated as the warehouse promises), as the driver
        returns them, in no particular order."""

    def absent(self, data_type: DataType) -> Any:
        """What a column of `data_type` holds for an event without the field (after `normalise`)."""
        return None


class _Proxied(Warehouse):
    """A network warehouse: `down` stops the proxy between eventspark and the server."""

    host: str
    port: int

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._proxy: TcpProxy | None = None
        self._request = request

    def _endpoint(self, interruptible: bool) -> tuple[str, int]:
        if not interruptible:
            return self.host, self.port
        if self._proxy is None:
            self._proxy = TcpProxy(self.host, self.port)
            self._proxy.start()
            self._request.addfinalizer(self._proxy.stop)
        return "127.0.0.1", self._proxy.port

    def down(self) -> None:
        assert self._proxy is not None, "down() needs a destination(..., interruptible=True)"
        self._proxy.stop()

    def up(self) -> None:
        assert self._proxy is not None, "up() needs a destination(..., interruptible=True)"
        self._proxy.start()


def _dq(name: str) -> str:
    """A double-quoted identifier (Postgres, DuckDB)."""
    return '"' + name.replace('"', '""') + '"'


def _bq(name: str) -> str:
    """A backquoted MySQL identifier."""
    return "`" + name.replace("`", "``") + "`"


# --- postgres -----------------------------------------------------------------------------------


class PostgresWarehouse(_Proxied):
    type_name = "postgres"
    host, port = PG_HOST, PG_PORT

    def __init__(self, request: pytest.FixtureRequest) -> None:
        super().__init__(request)
        self.datasource: dict[str, Any] = request.getfixturevalue("pg_datasource")
        self.schema: str = self.datasource["schema"]

    def destination(self, mode: str, layout: dict[str, Any], interruptible: bool = False) -> dict[str, Any]:
        host, port = self._endpoint(interruptible)
        datasource = {**self.datasource, "host": host, "port": port}
        return {"type": "postgres", "mode": mode, "datasource": datasource, "data_layout": layout}

    def _rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(pg_conninfo()) as conn:
            return conn.execute(sql.encode(), params or None).fetchall()

    def tables(self) -> set[str]:
        rows = self._rows("SELECT table_name FROM information_schema.tables WHERE table_schema = %s", self.schema)
        return {r[0] for r in rows}

    def select(self, table: str, columns: Sequence[str]) -> list[tuple[Any, ...]]:
        names = ", ".join(_dq(c) for c in columns)
        return self._rows(f"SELECT {names} FROM {_dq(self.schema)}.{_dq(table)}")


# --- mysql --------------------------------------------------------------------------------------


class MySQLWarehouse(_Proxied):
    type_name = "mysql"
    host, port = MYSQL_HOST, MYSQL_PORT

    def __init__(self, request: pytest.FixtureRequest) -> None:
        super().__init__(request)
        self.db: str = request.getfixturevalue("mysql_db")

    def destination(self, mode: str, layout: dict[str, Any], interruptible: bool = False) -> dict[str, Any]:
        host, port = self._endpoint(interruptible)
        datasource = {"host": host, "port": port, "db": self.db, "username": "root"}
        return {"type": "mysql", "mode": mode, "datasource": datasource, "data_layout": layout}

    def _rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        conn = mysql_connect(self.db)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params or None)
                return [tuple(r) for r in cur.fetchall()]
        finally:
            conn.close()

    def tables(self) -> set[str]:
        rows = self._rows("SELECT table_name FROM information_schema.tables WHERE table_schema = %s", self.db)
        return {r[0] for r in rows}

    def select(self, table: str, columns: Sequence[str]) -> list[tuple[Any, ...]]:
        names = ", ".join(_bq(c) for c in columns)
        # No parameters: pymysql leaves a % in a name alone.
        return self._rows(f"SELECT {names} FROM {_bq(table)}")


# --- clickhouse ---------------------------------------------------------------------------------


def _ch_name(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _ch_literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# Columns are not Nullable (the default layout): a missing value is the type's default.
_CLICKHOUSE_DEFAULTS = {DataType.BOOL: False, DataType.INT64: 0, DataType.FLOAT64: 0.0, DataType.STRING: ""}


class ClickHouseWarehouse(_Proxied):
    """Reads with FINAL: ReplacingMergeTree tables promise one row per key only after merges."""

    type_name = "clickhouse"
    host = "127.0.0.1"

    def __init__(self, request: pytest.FixtureRequest) -> None:
        super().__init__(request)
        self.server: ClickHouseServer = request.getfixturevalue("clickhouse_server")
        self.db: str = request.getfixturevalue("clickhouse_db")
        self.port = self.server.http_port

    def destination(self, mode: str, layout: dict[str, Any], interruptible: bool = False) -> dict[str, Any]:
        from eventspark.config.base import DestinationStream

        host, port = self._endpoint(interruptible)
        block = {"dsns": [f"http://default:@{host}:{port}/{self.db}"], "db": self.db}
        config: dict[str, Any] = {"type": "clickhouse", "mode": mode, "clickhouse": block, "data_layout": layout}
        if "min_insert_interval_sec" in DestinationStream.model_fields:
            config["stream"] = {"min_insert_interval_sec": 0}  # deliver each micro-batch at once
        return config

    def _rows(self, sql: str) -> list[tuple[Any, ...]]:
        """Rows of a SELECT over plain HTTP (ClickHouse's own interface), numbers as JSON numbers."""
        query = urlencode({"output_format_json_quote_64bit_integers": 0})
        request = Request(
            f"http://127.0.0.1:{self.server.http_port}/?{query}", data=f"{sql} FORMAT JSONCompact".encode()
        )
        with urlopen(request, timeout=30) as response:
            return [tuple(row) for row in orjson.loads(response.read())["data"]]

    def tables(self) -> set[str]:
        return {r[0] for r in self._rows(f"SELECT name FROM system.tables WHERE database = {_ch_literal(self.db)}")}

    def select(self, table: str, columns: Sequence[str]) -> list[tuple[Any, ...]]:
        ((engine,),) = self._rows(
            f"SELECT engine FROM system.tables WHERE database = {_ch_literal(self.db)} AND name = {_ch_literal(table)}"
        )
        final = " FINAL" if "Replacing" in engine else ""
        names = ", ".join(_ch_name(c) for c in columns)
        return self._rows(f"SELECT {names} FROM {_ch_name(self.db)}.{_ch_name(table)}{final}")

    def absent(self, data_type: DataType) -> Any:
        return _CLICKHOUSE_DEFAULTS[data_type]


# --- duckdb -------------------------------------------------------------------------------------

_HOLD_LOCK = """
import sys, duckdb
conn = duckdb.connect(sys.argv[1])
print("locked", flush=True)
sys.stdin.read()
conn.close()
"""


class DuckDBWarehouse(Warehouse):
    """A file under the test's tmp_path; `down` = another process holds its write lock."""

    type_name = "duckdb"
    exclusive_file = True
    readable_while_down = False

    def __init__(self, request: pytest.FixtureRequest) -> None:
        tmp_path: Path = request.getfixturevalue("tmp_path")
        self.path = tmp_path / "warehouse" / "target.duckdb"
        self._holder: subprocess.Popen[str] | None = None
        request.addfinalizer(self.up)

    def destination(self, mode: str, layout: dict[str, Any], interruptible: bool = False) -> dict[str, Any]:
        return {"type": "duckdb", "mode": mode, "duckdb": {"path": str(self.path)}, "data_layout": layout}

    def down(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD_LOCK, str(self.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None
        if holder.stdout.readline().strip() != "locked":
            holder.kill()
            raise AssertionError(f"the process meant to lock {self.path} did not get the lock")
        self._holder = holder

    def up(self) -> None:
        holder, self._holder = self._holder, None
        if holder is not None:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(30)

    def _rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        import duckdb

        with duckdb.connect(str(self.path)) as conn:
            return conn.execute(sql, list(params)).fetchall()

    def tables(self) -> set[str]:
        if not self.path.exists():
            return set()
        return {r[0] for r in self._rows("SELECT table_name FROM information_schema.tables")}

    def select(self, table: str, columns: Sequence[str]) -> list[tuple[Any, ...]]:
        names = ", ".join(_dq(c) for c in columns)
        return self._rows(f"SELECT {names} FROM {_dq(table)}")


def _cloud_warehouses() -> list[type[Warehouse]]:
    """The warehouses of the cloud types, each in its own module (tests/destinations/<type>_warehouse.py)."""
    found: list[type[Warehouse]] = []
    from tests.destinations.snowflake_warehouse import SnowflakeWarehouse

    found.append(SnowflakeWarehouse)
    from tests.destinations.bigquery_warehouse import BigQueryWarehouse

    found.append(BigQueryWarehouse)
    from tests.destinations.redshift_warehouse import RedshiftWarehouse

    found.append(RedshiftWarehouse)
    return found


WAREHOUSES: dict[str, Callable[[pytest.FixtureRequest], Warehouse]] = {
    cls.type_name: cls
    for cls in (PostgresWarehouse, MySQLWarehouse, ClickHouseWarehouse, DuckDBWarehouse, *_cloud_warehouses())
}


# --- values -------------------------------------------------------------------------------------


def normalise(value: Any, data_type: DataType | None) -> Any:
    """A stored value as the Python value of its DataType, whatever the driver returned: 1 for
    true (MySQL, ClickHouse), Decimal for numeric, naive or aware datetimes or text for instants."""
    if value is None:
        return None
    if data_type is DataType.BOOL:
        return bool(int(value)) if not isinstance(value, bool) else value
    if data_type is DataType.INT64:
        return int(value)
    if data_type is DataType.FLOAT64:
        return float(value) if isinstance(value, int | float | Decimal | str) else value
    if data_type is DataType.TIMESTAMP:
        return instant(value)
    return value


def instant(value: datetime | str) -> datetime:
    """An aware UTC datetime; naive values and text without an offset are UTC (how every
    warehouse here stores event times)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
