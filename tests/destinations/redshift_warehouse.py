"""The contract's `Warehouse` for `redshift`: no emulator runs Redshift, so its SQL path runs on
the machine's PostgreSQL (a fresh schema per test, through a TcpProxy for the outage test),
without an `s3` block (executors stage rows with INSERTs). The S3 path is tested in
test_redshift.py."""

from __future__ import annotations

from typing import Any

from tests.conftest import PG_HOST, PG_PORT
from tests.destinations.warehouses import PostgresWarehouse


class RedshiftWarehouse(PostgresWarehouse):
    type_name = "redshift"
    host, port = PG_HOST, PG_PORT

    def destination(self, mode: str, layout: dict[str, Any], interruptible: bool = False) -> dict[str, Any]:
        host, port = self._endpoint(interruptible)
        datasource = {**self.datasource, "host": host, "port": port}
        return {"type": "redshift", "mode": mode, "datasource": datasource, "data_layout": layout}
