"""One executor task in-process: routing, counts, spools and a stage that fails."""

from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventspark.batch.partition import process_splits
from eventspark.batch.plan import JobPlan, token_routes
from eventspark.batch.results import TaskResult
from eventspark.batch.splits import Split
from eventspark.config.models import ApiKey
from eventspark.destinations.base import ORDER_COLUMN, StagedChunk, TransientError
from eventspark.destinations.duckdb.configuration import DuckDBDestination
from eventspark.steps.context import line_event_id
from eventspark.steps.typing import DataType


class RecordingStage:
    """A stage that keeps chunks in memory and refuses the tables it is told to."""

    json_lines = False

    def __init__(self, refuse: set[str]) -> None:
        self.refuse = refuse
        self.written: list[tuple[dict[str, DataType], list[list[Any]]]] = []

    def open(self) -> RecordingStage:
        return self

    def write(self, columns: Mapping[str, DataType], rows: Sequence[Sequence[Any]]) -> StagedChunk:
        if any(row[list(columns).index("event_type")] in self.refuse for row in rows):
            raise TransientError("stage is down")
        self.written.append((dict(columns), [list(r) for r in rows]))
        return StagedChunk(f"chunk{len(self.written)}", dict(columns), len(rows))

    def close(self) -> None:
        return None


class RecordingJsonStage(RecordingStage):
    """The same, for a stage that takes JSON lines: each line is decoded into a row."""

    json_lines = True

    def write_json(self, columns: Mapping[str, DataType], lines: bytes | bytearray, rows: int) -> StagedChunk:
        objects = [orjson.loads(line) for line in bytes(lines).splitlines()]
        # A key without a staging column must be null in every row (the stage skips such keys).
        assert all(v is None for o in objects for k, v in o.items() if k not in columns)
        decoded = [[o.get(c) for c in columns] for o in objects]
        assert len(decoded) == rows
        return self.write(columns, decoded)


def _plan(tmp_path: Path, stage: RecordingStage, chunk_rows: int = 50_000) -> JobPlan:
    dest = DuckDBDestination.model_validate(
        {"type": "duckdb", "data_layout": {"table_name_template": "{{.event_type}}"}}
    )
    plan = JobPlan("job", str(tmp_path / "staging"), {"dd": dest}, {}, {}, (), {"log": "web"}, {"log": 0})
    routes = token_routes([ApiKey(id="web", client_secret="s")], {"dd": dest})
    plan.secret_tokens, plan.token_destinations, plan.default_destinations = routes
    plan.stages = {"dd": stage}  # type: ignore[dict-item]
    plan.chunk_rows = chunk_rows
    return plan


def _run(tmp_path: Path, plan: JobPlan, lines: list[bytes]) -> TaskResult:
    path = tmp_path / "log"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    (result,) = process_splits(plan, 3, [Split(str(path), 0, path.stat().st_size)])
    return result


@pytest.mark.parametrize("stage_class", [RecordingStage, RecordingJsonStage])
def test_counts_chunks_and_failed_spools(tmp_path: Path, stage_class: type[RecordingStage]) -> None:
    stage = stage_class(refuse=set())
    lines = [orjson.dumps({"event_type": "a", "n": i}) for i in range(5)] + [b"{oops", b'{"event_type": ""}']
    result = _run(tmp_path, _plan(tmp_path, stage, chunk_rows=2), lines)
    counts = {(c.file, c.table): (c.rows, c.failed, c.skipped) for c in result.counts}
    assert counts == {("log", "a"): (5, 0, 0), ("log", ""): (0, 1, 1)}
    assert [(s.dest_id, s.table, s.chunk.rows) for s in result.staged] == [("dd", "a", n) for n in (2, 2, 1)]
    assert result.staged[0].header.fields["n"].type is DataType.INT64
    # issue 17: a line without an event id gets one at load, derived from the line (EventNative 1.41)
    assert [row for _, rows in stage.written for row in rows][-1] == ["a", 4, line_event_id(lines[4])]
    (spool,) = [c.spool for c in result.counts if c.spool]
    assert orjson.loads(Path(spool).read_bytes())["event"] == "{oops"


@pytest.mark.parametrize("stage_class", [RecordingStage, RecordingJsonStage])
def test_a_stage_failure_fails_its_pair_and_the_task_goes_on(tmp_path: Path, stage_class: type[RecordingStage]) -> None:
    stage = stage_class(refuse={"down"})
    lines = [orjson.dumps({"event_type": t}) for t in ("down", "up", "down")]
    result = _run(tmp_path, _plan(tmp_path, stage), lines)
    assert result.errors == {("dd", "down"): "staging: stage is down"}
    assert [s.table for s in result.staged] == ["up"]


def test_an_event_that_breaks_a_step_fails_alone(tmp_path: Path, monkeypatch: Any) -> None:
    from eventspark.steps.chain import DestinationChain

    real = DestinationChain.process

    def fragile(self: DestinationChain, event: dict[str, Any]) -> Any:
        if event.get("poison"):
            raise RecursionError("too deep")
        return real(self, event)

    monkeypatch.setattr(DestinationChain, "process", fragile)
    stage = RecordingStage(refuse=set())
    lines = [orjson.dumps({"event_type": "a", "poison": True}), orjson.dumps({"event_type": "a"})]
    result = _run(tmp_path, _plan(tmp_path, stage), lines)
    counts = {c.table: (c.rows, c.failed) for c in result.counts}
    assert counts == {"": (0, 1), "a": (1, 0)}
    (spool,) = [c.spool for c in result.counts if c.spool]
    assert "RecursionError: too deep" in orjson.loads(Path(spool).read_bytes())["error"]


def test_the_cycle_collector_is_left_as_it_was(tmp_path: Path) -> None:
    stage = RecordingStage(refuse=set())
    lines = [orjson.dumps({"event_type": "a", "n": i}) for i in range(3)]
    try:
        for enabled in (True, False):
            if enabled:
                gc.enable()
            else:
                gc.disable()
            result = _run(tmp_path, _plan(tmp_path, stage), lines)
            assert gc.isenabled() is enabled
            assert [c.rows for c in result.counts] == [3]
    finally:
        gc.enable()


def test_json_lines_carry_the_same_rows_and_the_order_column(tmp_path: Path) -> None:
    lines = [
        orjson.dumps({"event_type": "a", "id": i, "v": v, "t": "2020-08-02T18:23:56Z"})
        for i, v in enumerate([1, 2.5, "x", None, True])
    ]
    written = {}
    for stage_class in (RecordingStage, RecordingJsonStage):
        stage = stage_class(refuse=set())
        plan = _plan(tmp_path, stage)
        plan.primary_keys = {"dd": ("id",)}
        _run(tmp_path, plan, lines)
        written[stage_class] = stage.written
    assert written[RecordingJsonStage] == written[RecordingStage]
    ((columns, rows),) = written[RecordingStage]
    assert columns["v"] is DataType.STRING and [row[2] for row in rows] == ["1", "2.5", "x", None, "true"]
    assert columns[ORDER_COLUMN] is DataType.INT64 and len({row[-1] for row in rows}) == 5
