"""The contract's `Warehouse` for BigQuery: a fresh dataset on the session's bqemulator, files
staged on its fake GCS; `down()` stops a proxy in front of the BigQuery endpoint."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tests.destinations.warehouses import _Proxied
from tests.emulators.bigquery import BigQueryEmulator


def _name(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


class BigQueryWarehouse(_Proxied):
    type_name = "bigquery"
    host = "127.0.0.1"

    def __init__(self, request: pytest.FixtureRequest) -> None:
        super().__init__(request)
        self.emulator: BigQueryEmulator = request.getfixturevalue("bigquery_emulator")
        self.dataset: str = request.getfixturevalue("bq_dataset")
        self.port = self.emulator.rest_port

    def destination(self, mode: str, layout: dict[str, Any], interruptible: bool = False) -> dict[str, Any]:
        host, port = self._endpoint(interruptible)
        block = self.emulator.google_block(self.dataset, endpoint=f"http://{host}:{port}")
        return {"type": "bigquery", "mode": mode, "google": block, "data_layout": layout}

    def tables(self) -> set[str]:
        client = self.emulator.bigquery()
        try:
            return {t.table_id for t in client.list_tables(self.dataset, retry=None, timeout=30)}
        except Exception as exc:  # no dataset yet: eventspark creates it on connecting
            if type(exc).__name__ == "NotFound":
                return set()
            raise
        finally:
            client.close()

    def select(self, table: str, columns: Sequence[str]) -> list[tuple[Any, ...]]:
        client = self.emulator.bigquery()
        try:
            names = ", ".join(_name(c) for c in columns)
            job = client.query(f"SELECT {names} FROM {_name(self.dataset)}.{_name(table)}", job_retry=None)
            return [tuple(row.values()) for row in job.result(timeout=60)]
        finally:
            client.close()
