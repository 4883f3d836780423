"""An update that fails is not lost: its ids stay pending in the index and the next run settles
them; an unreachable Redis index never stops loading."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

from eventspark.destinations.base import TerminalError, TransientError
from tests.recognition.helpers import ANONYMOUS, EXPECTED, IDENTIFY, KEY, RECOGNITION, page
from tests.stream.helpers import Harness, duckdb_stream, make_config


def read(harness: Harness, path: Path, table: str) -> dict[str, Any]:
    harness.worker.delivery.adapter.close()
    with duckdb.connect(str(path)) as conn:
        return dict(conn.execute(f"SELECT {KEY}, user_id FROM {table}").fetchall())


def test_a_failed_update_is_retried_on_the_next_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "w.duckdb"
    harness = Harness.build(make_config(tmp_path, {"dd": duckdb_stream(path, "{{.event_type}}")}, **RECOGNITION), "dd")
    try:
        adapter = harness.worker.delivery.adapter
        real = adapter.recognize_users
        calls: list[str] = []

        def flaky(table: Any, *args: Any) -> None:
            calls.append(table.name)
            if len(calls) == 1:
                raise TransientError("duckdb: connection lost")
            real(table, *args)

        monkeypatch.setattr(adapter, "recognize_users", flaky)
        harness.append(*ANONYMOUS)
        harness.drain()
        harness.append(*IDENTIFY)
        harness.drain()
        recognition = harness.worker.recognition
        assert recognition is not None
        assert recognition.recognizer.index.pending() == {"a1"}
        assert read(harness, path, "click") == {"e0004": None}  # the first table tried ("click") failed
        assert read(harness, path, "pageview") == EXPECTED["pageview"]
        harness.append(page(8, "a9"))  # any later flush retries the pending ids
        harness.drain()
        assert read(harness, path, "click") == EXPECTED["click"]
        assert recognition.recognizer.index.pending() == set()
        assert harness.failed() == []
    finally:
        harness.close()


def test_an_unreachable_redis_index_does_not_stop_loading(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    meta = {"storage": {"redis": {"host": "127.0.0.1", "port": 1}}}  # nothing listens there
    config = make_config(tmp_path, {"dd": duckdb_stream(path, "{{.event_type}}")}, meta=meta, **RECOGNITION)
    harness = Harness.build(config, "dd")
    try:
        harness.append(*ANONYMOUS, *IDENTIFY)
        harness.drain()
        harness.worker.delivery.adapter.close()
        with duckdb.connect(str(path)) as conn:
            rows = conn.execute(f"SELECT {KEY} FROM pageview").fetchall()
        assert sorted(rows) == [("e0001",), ("e0002",), ("e0003",)]
        assert harness.failed() == []
    finally:
        harness.close()


def test_a_value_that_does_not_fit_its_column_fails_no_other(tmp_path: Path) -> None:
    """A user id that its column cannot take (text into a numeric user_id) is left out of the
    statement: the other ids of the table still get theirs, and nothing stays pending."""
    path = tmp_path / "w.duckdb"
    harness = Harness.build(make_config(tmp_path, {"dd": duckdb_stream(path, "{{.event_type}}")}, **RECOGNITION), "dd")
    try:
        harness.append(page(1, "a0", id=42), page(2, "a1"), page(3, "a2"))  # pageview.user_id: a number
        harness.drain()
        harness.append(page(4, "a1", "identify", id="abc"), page(5, "a2", "identify", id="7"))
        harness.drain()
        assert read(harness, path, "pageview") == {"e0001": 42, "e0002": None, "e0003": 7}
        recognition = harness.worker.recognition
        assert recognition is not None and recognition.recognizer.index.pending() == set()
        assert harness.failed() == []
    finally:
        harness.close()


def test_a_refused_update_is_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A statement the warehouse refuses (a ClickHouse key column, say) would fail every time:
    logged, and its table forgotten for those ids, not retried at every flush."""
    path = tmp_path / "w.duckdb"
    harness = Harness.build(make_config(tmp_path, {"dd": duckdb_stream(path, "{{.event_type}}")}, **RECOGNITION), "dd")
    try:
        adapter = harness.worker.delivery.adapter
        calls: list[str] = []

        def refuse(table: Any, *args: Any) -> None:
            calls.append(table.name)
            raise TerminalError("Cannot UPDATE key column")

        monkeypatch.setattr(adapter, "recognize_users", refuse)
        harness.append(*ANONYMOUS, *IDENTIFY)
        harness.drain()
        assert sorted(calls) == ["click", "pageview"]
        recognition = harness.worker.recognition
        assert recognition is not None and recognition.recognizer.index.pending() == set()
        harness.append(page(8, "a9"))
        harness.drain()
        assert sorted(calls) == ["click", "pageview"]  # not tried again
        assert harness.failed() == []
    finally:
        harness.close()
