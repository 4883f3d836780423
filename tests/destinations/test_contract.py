"""The end-to-end contract every registered destination type passes, in each of its modes.

Each test runs once per (type, mode) of `destinations.registry.REGISTRY`, so a new type is part of
the suite as soon as it is registered, and fails until `tests/destinations/warehouses.py` knows how
to give it a fresh target. Events go the way a user's do: a config file loaded like the CLI does,
then rotated logs and one batch pass (`batch.process.run_pass` on the shared SparkSession), or the
destination's stream queue and its `StreamWorker`. The assertions read what the warehouse really
holds, with its own driver (`warehouses.Warehouse`), and the column types through the adapter.

The per-adapter contract (`contract.py`) checks each adapter method; this one checks the pipeline.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventspark.batch.job import JobResult
from eventspark.batch.process import run_pass
from eventspark.config import LoadedConfig
from eventspark.coordination import MemoryCoordination
from eventspark.destinations import build_destination
from eventspark.destinations.base import LOADS_TABLE, STAGE_PREFIX, DestinationError
from eventspark.destinations.registry import REGISTRY
from eventspark.logs.rotated import rotated_logs
from eventspark.steps.typing import DataType
from eventspark.stream.manager import StreamWorkers
from eventspark.stream.queue import QueueWriter, queue_dir
from eventspark.stream.worker import StreamSettings, StreamWorker
from tests.batch.helpers import make_config, put_log
from tests.destinations.warehouses import WAREHOUSES, Warehouse, instant, normalise

B, INT, F, T, S = DataType.BOOL, DataType.INT64, DataType.FLOAT64, DataType.TIMESTAMP, DataType.STRING
DEST = "target"
KEY = "eventn_ctx_event_id"
TIMESTAMP = "2026-11-01T10:00:00Z"  # whole seconds: ClickHouse and MySQL keep no fractions
CASES = [
    pytest.param(name, mode, id=f"{name}-{mode}")
    for name, entry in REGISTRY.items()
    if entry.capabilities.stage != "objects"  # the files family has no tables: tests/files
    if entry.capabilities.delivery == "tables"  # the HTTP family has no tables: tests/http
    for mode in sorted(entry.capabilities.modes)
]
FAST = StreamSettings(batch_wait_ms=20, retry_min_sec=0.2, retry_max_sec=1.0, poll_ms=5)


def event(number: int, timestamp: str = TIMESTAMP, /, **fields: Any) -> dict[str, Any]:
    """An event as the collector logs it, with id `e<nnn>`."""
    return {"_timestamp": timestamp, "eventn_ctx": {"event_id": eid(number)}, **fields}


def eid(n: int) -> str:
    return f"e{n:03d}"


# --- the two ways events reach a warehouse --------------------------------------------------------


class BatchRunner:
    """Each `send` is one rotated log; `load` is one pass over the waiting logs."""

    def __init__(self, loaded: LoadedConfig, root: Path, spark: Any) -> None:
        self.loaded, self.root, self.spark = loaded, root, spark
        self.coordination = MemoryCoordination("contract")

    def send(self, events: list[dict[str, Any]]) -> None:
        put_log(self.root, events)

    def run(self, fault: Callable[[str], None] | None = None) -> JobResult:
        return run_pass(self.loaded, self.coordination, fault=fault, session=self.spark)

    def load(self) -> str:
        """One pass; what failed ('' when every pair was uploaded)."""
        result = self.run()
        errors = {f"{d}/{t}": p.error for (d, t), p in result.pairs.items() if p.error}
        return f"the batch pass failed: {errors}" if errors else ""

    def logs(self) -> list[Path]:
        return rotated_logs(self.root / "events" / "incoming")

    def release(self) -> None:
        return None  # a pass closes its adapters

    def close(self) -> None:
        self.coordination.close()


class StreamRunner:
    """`send` appends to the destination's queue; `load` runs micro-batches until it is empty."""

    def __init__(self, loaded: LoadedConfig) -> None:
        self.loaded = loaded
        self.coordination = MemoryCoordination("contract")
        workers = StreamWorkers(loaded, self.coordination, FAST)
        self.worker: StreamWorker = workers.build(DEST, loaded.config.destinations[DEST])
        self.worker.open()
        self._stepping = True
        self.writer = QueueWriter(queue_dir(Path(loaded.config.log.path), DEST))

    def send(self, events: list[dict[str, Any]]) -> None:
        self.writer.append(b"".join(orjson.dumps(e) + b"\n" for e in events), len(events))

    def load(self) -> str:
        """Micro-batches until the queue is empty; what stopped the worker ('' when nothing did).
        (`serve` would log such an error and retry the same micro-batch, forever.)"""
        try:
            while self.worker.run_once() is not None:
                pass
        except DestinationError as exc:
            return f"the stream worker failed: {type(exc).__name__}: {exc}"
        return ""

    def release(self) -> None:
        """Closes the worker's connection (it reconnects on the next insert)."""
        self.worker.delivery.adapter.close()

    def hand_over(self) -> None:
        """Closes the step-driven worker, so that `serve` workers can consume the queue."""
        if self._stepping:
            self._stepping = False
            self.worker.close()

    def serve(self) -> StreamWorkers:
        """The destination's worker on its own thread, as `eventspark serve` runs it."""
        workers = StreamWorkers(self.loaded, self.coordination, FAST)
        workers.start()
        return workers

    def close(self) -> None:
        self.writer.close()
        self.hand_over()
        self.coordination.close()


@dataclass
class Case:
    """One destination of one type in one mode, with a fresh target."""

    warehouse: Warehouse
    loaded: LoadedConfig
    runner: BatchRunner | StreamRunner

    @property
    def events_dir(self) -> Path:
        return Path(self.loaded.config.log.path)

    def send(self, events: list[dict[str, Any]]) -> None:
        self.runner.send(events)

    def deliver(self) -> None:
        """Loads what was sent; fails the test if the load reports an error."""
        problem = self.runner.load()
        assert not problem, problem

    def _release(self) -> None:
        if self.warehouse.exclusive_file:
            self.runner.release()

    def down(self) -> None:
        self._release()
        self.warehouse.down()

    def up(self) -> None:
        self.warehouse.up()

    def columns(self, table: str) -> dict[str, DataType | None]:
        """The table's columns, in order, as the adapter reads them, with their DataTypes."""
        self._release()
        adapter = build_destination(DEST, self.loaded.config.destinations[DEST], self.events_dir)
        try:
            found = adapter.read_table(table)
            assert found is not None, f"table {table!r} does not exist"
            return {name: adapter.data_type_of(sql_type) for name, sql_type in found.columns.items()}
        finally:
            adapter.close()

    def rows(self, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
        """Those columns of every row, as Python values of their DataTypes, sorted."""
        types = self.columns(table)
        stored = self.warehouse.select(table, columns)
        return sorted(tuple(normalise(v, types[c]) for v, c in zip(row, columns, strict=True)) for row in stored)

    def tables(self) -> set[str]:
        """The warehouse's tables but eventspark's load markers."""
        self._release()
        return self.warehouse.tables() - {LOADS_TABLE}

    def absent(self, data_type: DataType) -> Any:
        return self.warehouse.absent(data_type)

    def failed(self) -> list[dict[str, Any]]:
        path = self.events_dir / "failed" / f"failed.dst={DEST}.log"
        return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def start(
    request: pytest.FixtureRequest, dest_type: str, mode: str, layout: dict[str, Any], interruptible: bool = False
) -> Case:
    """A fresh target of `dest_type` and a destination `DEST` loading it in `mode`."""
    factory = WAREHOUSES.get(dest_type)
    if factory is None:
        pytest.fail(
            f"destination type {dest_type!r} is registered but the contract cannot test it: add a "
            "Warehouse for it to WAREHOUSES in tests/destinations/warehouses.py",
            pytrace=False,
        )
    warehouse = factory(request)
    root: Path = request.getfixturevalue("tmp_path")
    loaded = make_config(root, {DEST: warehouse.destination(mode, layout, interruptible)})
    runner: BatchRunner | StreamRunner
    runner = BatchRunner(loaded, root, request.getfixturevalue("spark")) if mode == "batch" else StreamRunner(loaded)
    request.addfinalizer(runner.close)  # before the warehouse's own finalizers
    return Case(warehouse, loaded, runner)


# --- the scenarios ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("dest_type", "mode"), CASES)
def test_first_events_create_the_table_with_their_types(
    request: pytest.FixtureRequest, dest_type: str, mode: str
) -> None:
    case = start(request, dest_type, mode, {"table_name_template": "events"})
    sent = [
        event(i, n=i, price=i + 0.5, ok=i % 2 == 0, name=f"user {i}", page={"url": f"/p/{i}"}, tags=["a", str(i)])
        for i in range(12)
    ]
    case.send(sent)
    case.deliver()

    assert case.tables() == {"events"}
    columns = case.columns("events")
    assert columns == {"_timestamp": T, KEY: S, "n": INT, "price": F, "ok": B, "name": S, "page_url": S, "tags": S}
    rows = case.rows("events", [KEY, "_timestamp", "n", "price", "ok", "name", "page_url", "tags"])
    assert rows == [
        (eid(i), instant(TIMESTAMP), i, i + 0.5, i % 2 == 0, f"user {i}", f"/p/{i}", f'["a","{i}"]') for i in range(12)
    ]
    assert case.failed() == []


@pytest.mark.parametrize(("dest_type", "mode"), CASES)
def test_new_fields_add_columns_and_keep_old_ones_and_old_rows(
    request: pytest.FixtureRequest, dest_type: str, mode: str
) -> None:
    case = start(request, dest_type, mode, {"table_name_template": "events"})
    case.send([event(i, a=i, b=f"b{i}") for i in range(5)])
    case.deliver()
    before = case.columns("events")
    assert before == {"_timestamp": T, KEY: S, "a": INT, "b": S}

    case.send([event(i, a=i, c=i % 2 == 1, d={"x": i + 0.25}) for i in range(5, 10)])
    case.deliver()

    after = case.columns("events")
    assert list(after)[: len(before)] == list(before), "existing columns changed or moved"
    assert after == {**before, "c": B, "d_x": F}
    no_b, no_c, no_x = case.absent(S), case.absent(B), case.absent(F)
    assert case.rows("events", [KEY, "a", "b", "c", "d_x"]) == [
        *[(eid(i), i, f"b{i}", no_c, no_x) for i in range(5)],
        *[(eid(i), i, no_b, i % 2 == 1, i + 0.25) for i in range(5, 10)],
    ]
    assert case.failed() == []


@pytest.mark.parametrize(("dest_type", "mode"), CASES)
def test_types_promote_within_a_load_and_misfits_of_existing_columns_fail_alone(
    request: pytest.FixtureRequest, dest_type: str, mode: str
) -> None:
    """docs/batch.md "Values and types", docs/stream.md step 5: a new column takes the promoted
    type of its values (INT → FLOAT → STRING); a column never changes type, so a later value
    that does not fit it sends its event to failed/ with a reason naming the column."""
    case = start(request, dest_type, mode, {"table_name_template": "events"})
    case.send([event(0, v=1, w=10), event(1, v=2.5, w=11), event(2, v="x", w=12), event(3, w=13)])
    case.deliver()
    assert case.columns("events") == {"_timestamp": T, KEY: S, "v": S, "w": INT}

    second = [
        event(4, v=3, w="14"),  # an integer string fits the bigint column
        event(5, v=4.5, w=15.5),  # a fraction does not
        event(6, w="fifteen"),  # nor does text
        event(7, v="y", w=16, z=1),
        event(8, z=2.5),  # z is new: INT then FLOAT in one load → FLOAT
    ]
    case.send(second)
    case.deliver()

    assert case.columns("events") == {"_timestamp": T, KEY: S, "v": S, "w": INT, "z": F}
    no_v, no_w, no_z = case.absent(S), case.absent(INT), case.absent(F)
    assert case.rows("events", [KEY, "v", "w", "z"]) == [
        (eid(0), "1", 10, no_z),
        (eid(1), "2.5", 11, no_z),
        (eid(2), "x", 12, no_z),
        (eid(3), no_v, 13, no_z),
        (eid(4), "3", 14, no_z),
        (eid(7), "y", 16, 1.0),
        (eid(8), no_v, no_w, 2.5),
    ]
    failed = {f["event_id"]: f for f in case.failed()}
    assert sorted(failed) == [eid(5), eid(6)]
    for n, value in ((5, 15.5), (6, "fifteen")):
        assert failed[eid(n)]["event"]["w"] == value, "failed/ must hold the event as it was sent"
        assert "'w'" in failed[eid(n)]["error"], failed[eid(n)]["error"]


HOSTILE_TABLES = {
    'x"; DROP TABLE victim; --': "x___drop_table_victim____",
    "a`b'c\\d": "a_b_c_d",
    "Ünïcödé Tàble": "ünïcödé_tàble",
    "robert'); DROP TABLE victim;--": "robert____drop_table_victim___",
}
HOSTILE_KEYS = {
    'we"ird': "we_ird",
    "back`tick": "back_tick",
    "semi;colon": "semi_colon",
    "with space": "with_space",
    "DROP TABLE victim; --": "drop_table_victim____",
    "'; DROP TABLE victim; --": "___drop_table_victim____",
    "ünï": re.compile(r"_n__[0-9a-f]{8}"),  # non-ASCII keys get a hash of the key: docs of steps/flatten.py
    "名前": re.compile(r"___[0-9a-f]{8}"),
}
HOSTILE_VALUE = "'); DROP TABLE victim; -- \" ` \\ ; %s %% ünï 名前 😀"
HOSTILE_ID = "id'); DROP TABLE victim;--"


@pytest.mark.parametrize(("dest_type", "mode"), CASES)
def test_hostile_table_and_field_names_are_sanitised_and_quoted(
    request: pytest.FixtureRequest, dest_type: str, mode: str
) -> None:
    case = start(request, dest_type, mode, {"table_name_template": "{{.event_type}}"})
    case.send([event(i, event_type="victim", safe=i) for i in range(3)])
    case.deliver()
    hostile = []
    for i, event_type in enumerate(HOSTILE_TABLES):
        for n in (10 + 2 * i, 11 + 2 * i):
            hostile.append(event(n, event_type=event_type, **{k: f"{k} = {HOSTILE_VALUE}" for k in HOSTILE_KEYS}))
    hostile[0]["eventn_ctx"]["event_id"] = HOSTILE_ID
    case.send(hostile)
    case.deliver()

    assert case.tables() == {"victim", *HOSTILE_TABLES.values()}
    assert case.rows("victim", [KEY, "safe"]) == [(eid(i), i) for i in range(3)]
    for i, (event_type, table) in enumerate(HOSTILE_TABLES.items()):
        columns = case.columns(table)
        assert all(re.fullmatch(r"[a-z0-9_]{1,63}", c) for c in columns), list(columns)
        names = {}
        for key, expected in HOSTILE_KEYS.items():
            if isinstance(expected, str):
                names[key] = expected
            else:
                (names[key],) = [c for c in columns if expected.fullmatch(c)]
        assert set(columns) == {"_timestamp", KEY, "event_type", *names.values()}
        ids = [HOSTILE_ID, eid(11)] if i == 0 else [eid(10 + 2 * i), eid(11 + 2 * i)]
        expected_rows = sorted((id_, event_type, *(f"{k} = {HOSTILE_VALUE}" for k in names)) for id_ in ids)
        assert case.rows(table, [KEY, "event_type", *names.values()]) == expected_rows
    assert case.failed() == []


@pytest.mark.parametrize(("dest_type", "mode"), CASES)
def test_table_names_reserved_by_eventspark_fail_their_events_alone(
    request: pytest.FixtureRequest, dest_type: str, mode: str
) -> None:
    """A template can render the name of one of eventspark's own tables (`destinations.base`: the
    load markers, and `_es_stage_<job>_...` stages, which a later pass drops as stale). Such an
    event must not reach that table nor hold up the others: like an event with the reserved field
    `_es_seq` (batch), it goes to failed/ with a reason (or to a table of its own)."""
    case = start(request, dest_type, mode, {"table_name_template": "{{.event_type}}"})
    stage_name = f"{STAGE_PREFIX}00000000aaaaaa_x"  # a job id from 1970: stale for every pass
    case.send([event(0, event_type=LOADS_TABLE, a=0), event(1, event_type=stage_name, a=1)])
    case.send([event(2, event_type="page", a=2)])
    _assert_settled_alone(case, [eid(0), eid(1)], case.runner.load())


@pytest.mark.parametrize(("dest_type", "mode"), CASES)
def test_table_names_too_long_for_the_warehouse_fail_their_events_alone(
    request: pytest.FixtureRequest, dest_type: str, mode: str
) -> None:
    """70 characters: more than Postgres (63) and MySQL (64) take in a name. Whether the name is
    shortened (steps/template.py: "truncating ... is the destination's job") or refused
    (`Dialect.quote`), the event must end in a table or in failed/, not hold up the load."""
    case = start(request, dest_type, mode, {"table_name_template": "{{.event_type}}"})
    case.send([event(0, event_type="x" * 70, a=0), event(1, event_type="page", a=1)])
    _assert_settled_alone(case, [eid(0)], case.runner.load())


def _assert_settled_alone(case: Case, odd: list[str], problem: str) -> None:
    """The event after the `odd` ones (table `page`) is delivered; each odd one is in failed/ or
    in a table eventspark leaves alone; the load reports no error (nothing to retry)."""
    assert "page" in case.tables(), f"the other events were not delivered: {problem}"
    assert case.rows("page", [KEY, "a"]) == [(eid(len(odd)), len(odd))]
    failed = {f["event_id"] for f in case.failed()}
    tables = case.tables()
    stored = {row[0] for t in tables - {"page"} for row in case.warehouse.select(t, [KEY])}
    unsettled = [i for i in odd if i not in failed | stored]
    assert not unsettled, f"{unsettled} neither in failed/ nor in a table; the load said: {problem or 'nothing'}"
    assert not [t for t in tables if t.startswith(STAGE_PREFIX)], f"a table named like a stage: {tables}"
    assert problem == ""


@pytest.mark.parametrize(("dest_type", "mode"), CASES)
def test_primary_key_keeps_one_row_per_key_with_the_last_values(
    request: pytest.FixtureRequest, dest_type: str, mode: str
) -> None:
    case = start(request, dest_type, mode, {"table_name_template": "users", "primary_key_fields": ["id"]})
    # Within one load, the same id at the same second: the later line wins.
    case.send([event(0, id="a", v=1), event(1, id="b", v=1), event(2, id="a", v=2)])
    case.deliver()
    assert case.rows("users", ["id", "v", KEY]) == [("a", 2, eid(2)), ("b", 1, eid(1))]

    later = "2026-11-01T10:05:00Z"
    # Across loads: b and a again (a twice more), c new.
    case.send([event(3, later, id="b", v=3), event(4, later, id="c", v=1), event(5, later, id="a", v=4)])
    case.send([event(6, later, id="a", v=5)])  # batch: a second log of the same pass
    case.deliver()

    assert case.rows("users", ["id", "v", KEY]) == [("a", 5, eid(6)), ("b", 3, eid(3)), ("c", 1, eid(4))]
    assert case.columns("users")["id"] is S
    assert case.tables() == {"users"}
    assert case.failed() == []


@pytest.mark.parametrize(("dest_type", "mode"), CASES)
def test_warehouse_down_then_up_loses_nothing_and_loads_everything_once(
    request: pytest.FixtureRequest, dest_type: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    case = start(request, dest_type, mode, {"table_name_template": "events"}, interruptible=True)
    case.send([event(i, n=i) for i in range(5)])
    case.deliver()
    if isinstance(case.runner, BatchRunner):
        _batch_outage(case, case.runner)
    else:
        _stream_outage(case, case.runner, caplog)
    assert case.rows("events", [KEY, "n"]) == [(eid(i), i) for i in range(25)]
    assert case.failed() == []


def _stored_ids(case: Case) -> list[str] | None:
    """The ids in the table, read past whatever `down` broke; None when the target cannot be read."""
    if not case.warehouse.readable_while_down:
        return None
    return sorted(row[0] for row in case.warehouse.select("events", [KEY]))


def _batch_outage(case: Case, runner: BatchRunner) -> None:
    # Down before the pass: the destination cannot be prepared, its logs stay.
    case.down()
    case.send([event(i, n=i) for i in range(5, 15)])
    failed = runner.run()
    assert not failed.ok
    assert len(runner.logs()) == 1, "the log of the failed pair must be kept for the next pass"
    assert _stored_ids(case) in (None, [eid(i) for i in range(5)])
    case.up()

    # Down in the middle of a pass, after the rows are staged: the commit cannot happen. The events
    # bring a new column, so they are staged and committed by the driver (rows that fit the table
    # would be written by the executors themselves where the destination has `direct_writes`).
    case.send([event(i, n=i, m=i) for i in range(15, 25)])
    if not case.warehouse.exclusive_file:  # a DuckDB file stays open in the driver for the whole pass
        fired: list[str] = []

        def outage_before_commit(point: str) -> None:
            if point == "staged" and not fired:
                fired.append(point)
                case.down()

        failed = runner.run(fault=outage_before_commit)
        assert fired and not failed.ok
        assert len(runner.logs()) == 2
        # The first log's events fit the table: with direct writes, the executors wrote them
        # (each split with its marker) before the outage; the second log waits for its commit.
        direct = REGISTRY[case.loaded.config.destinations[DEST].type].capabilities.direct_writes
        assert _stored_ids(case) == [eid(i) for i in range(15 if direct else 5)]
        case.up()

    case.deliver()
    assert runner.logs() == [], "every log is uploaded once the warehouse is back"


def _stream_outage(case: Case, runner: StreamRunner, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="eventspark.stream.worker")
    runner.hand_over()  # from here on workers run on their threads, as in `serve`
    started: list[StreamWorkers] = []

    def serve() -> StreamWorker:
        started.append(runner.serve())
        return started[-1].workers[DEST]

    try:
        worker = serve()
        case.send([event(i, n=i) for i in range(5, 10)])
        wait_for(lambda: worker.delivered == 5, "the running worker to deliver 5 events")
        if case.warehouse.exclusive_file:  # the worker keeps the file open: `down` needs it closed
            started[-1].stop()
        case.warehouse.down()  # a network warehouse resets the worker's open connection
        case.send([event(i, n=i) for i in range(10, 25)])
        if case.warehouse.exclusive_file:
            worker = serve()
        delivered = worker.delivered
        time.sleep(1.5)
        assert worker.delivered == delivered and worker.failed == 0, "nothing can be delivered while down"
        assert case.failed() == []
        assert _stored_ids(case) in (None, [eid(i) for i in range(10)])
        assert any("retrying" in r.getMessage() for r in caplog.records), "no retry was logged"
        started[-1].stop()  # `serve` restarts during the outage: the undelivered events stay queued

        case.warehouse.up()
        worker = serve()
        wait_for(lambda: worker.delivered == 15, "the restarted worker to deliver the 15 queued events", 30.0)
    finally:
        for workers in started:
            workers.stop()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.02)


@pytest.mark.parametrize(("dest_type", "mode"), [case for case in CASES if case.values[1] == "batch"])
def test_the_load_markers_of_archived_logs_are_removed_and_no_others(
    request: pytest.FixtureRequest, dest_type: str, mode: str
) -> None:
    """A log's load markers keep its reruns from loading it twice while it waits in incoming/; once
    archived, no pass reads them: the archiving pass removes them, and only them (ClickHouse keeps
    them: a DELETE there is a mutation rewriting the table's parts)."""
    case = start(request, dest_type, mode, {"table_name_template": "t"})
    case.send([event(0, a=1), event(1, a=2)])
    [log] = case.runner.logs()
    others = {f"{log.name}.old", f"{log.name}.old@0-10"}  # another log, its name starting with this one's
    adapter = build_destination(DEST, case.loaded.config.destinations[DEST], case.events_dir)
    try:
        adapter.mark_loaded(DEST, "t", sorted(others))
    finally:
        adapter.close()

    case.deliver()

    assert not log.exists() and case.rows("t", [KEY]) == [(eid(0),), (eid(1),)]
    markers = {file for (file,) in case.warehouse.select(LOADS_TABLE, ["file"])}
    assert markers == (others | {log.name} if dest_type == "clickhouse" else others)
