"""Many events per round trip to the engine (`Transform.run_many`, `DestinationChain.process_many`),
each with its own limits and failing alone; the engine's process life cycle and its sandbox."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventspark.steps import transform as transform_module
from eventspark.steps.chain import Failure, Row
from eventspark.steps.transform import Transform, TransformFailed, TransformSyntaxError
from tests.transform.test_step import EVENT, chain_for

HOSTILE = """
if ($.kind == "loop") { while (true) {} }
if ($.kind == "throw") throw new Error("bad " + $.n)
if ($.kind == "alloc") { var a = []; while (true) a.push("x".repeat(65536) + a.length) }
if ($.kind == "skip") return null
if ($.kind == "two") return [{...$, JITSU_TABLE_NAME: "a"}, {...$, JITSU_TABLE_NAME: "b"}]
return {...$, ok: true}
"""
KINDS = ["plain", "loop", "plain", "throw", "alloc", "skip", "loop", "two", "plain"]


def count_exchanges(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of round trips to engines, kept up to date in the returned list."""
    calls = [0]
    exchange = transform_module._Runner._exchange

    def counted(self: Any, payload: bytes, wall: float, limit: int) -> bytes:
        calls[0] += 1
        return exchange(self, payload, wall, limit)

    monkeypatch.setattr(transform_module._Runner, "_exchange", counted)
    return calls


def test_a_batch_goes_in_one_round_trip_and_each_event_has_its_own_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    transform = Transform(HOSTILE, timeout_ms=300, memory_mb=32)
    transform.run_text("{}")  # the engine starts
    calls = count_exchanges(monkeypatch)
    outcomes = transform.run_many([f'{{"n": {n}, "kind": "{kind}"}}' for n, kind in enumerate(KINDS)])
    assert calls[0] == 1
    assert [type(outcome).__name__ for outcome in outcomes] == [
        "str", "TransformFailed", "str", "TransformFailed", "TransformFailed", "NoneType", "TransformFailed", "str",
        "str",
    ]  # fmt: skip
    assert "ran longer than 300 ms" in str(outcomes[1]) and "ran longer than 300 ms" in str(outcomes[6])
    assert str(outcomes[3]) == "Error: bad 3"
    assert "used more than 32 MiB" in str(outcomes[4])
    assert outcomes[8] == '{"n":8,"kind":"plain","ok":true}'


def test_large_batches_are_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    transform = Transform("return {...$, ok: 1}")
    calls = count_exchanges(monkeypatch)
    outcomes = transform.run_many([f'{{"n": {n}}}' for n in range(2 * transform_module.BATCH_EVENTS + 1)])
    assert calls[0] == 1 + 3  # the engine's start, then three batches
    assert outcomes[-1] == f'{{"n":{2 * transform_module.BATCH_EVENTS},"ok":1}}'


def test_large_answers_come_in_several_round_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    transform = Transform("return {n: $.n, s: 'x'.repeat(12 * 1024 * 1024)}", memory_mb=128)
    calls = count_exchanges(monkeypatch)
    outcomes = transform.run_many([f'{{"n": {n}}}' for n in range(4)])
    assert calls[0] == 1 + 2  # the engine's start; three answers (36 MiB > 32 MiB), then the last
    assert [outcome[:8] for outcome in outcomes] == ['{"n":0,"', '{"n":1,"', '{"n":2,"', '{"n":3,"']


def test_an_engine_dying_mid_batch_fails_only_the_event_it_was_on() -> None:
    transform = Transform('if ($.kind == "slow") { while (true) {} }; return {...$, ok: 1}', timeout_ms=1500)
    engine = transform_module._context(transform).process
    killer = threading.Timer(0.5, engine.send_signal, (signal.SIGSEGV,))  # as QuickJS on some OOM paths
    killer.start()
    outcomes = transform.run_many(['{"n": 0}', '{"n": 1, "kind": "slow"}', '{"n": 2}'])
    killer.join()
    # The batch ran again event by event in a new engine: only the slow one fails (its own limit).
    assert outcomes[0] == '{"n":0,"ok":1}' and outcomes[2] == '{"n":2,"ok":1}'
    assert isinstance(outcomes[1], TransformFailed) and "ran longer than 1500 ms" in str(outcomes[1])
    assert transform_module._context(transform).process.pid != engine.pid


def test_process_many_gives_what_process_gives() -> None:
    chain = chain_for(HOSTILE)
    events = [{**EVENT, "n": n, "kind": kind} for n, kind in enumerate(KINDS)]
    one_by_one = [chain.process(dict(event)) for event in events]
    together = chain.process_many([dict(event) for event in events])
    assert together == one_by_one
    assert [type(result).__name__ for result in together] == [
        "Row", "Failure", "Row", "Failure", "Failure", "NoneType", "Failure", "list", "Row",
    ]  # fmt: skip
    assert [row.table for row in together[7]] == ["a", "b"]
    assert isinstance(together[1], Failure) and together[1].error.startswith("transform: the transform ran longer")
    plain = chain_for("return $")
    plain.transform = None  # without a transform: the chain's usual path
    assert all(type(result) is Row for result in plain.process_many([dict(EVENT), dict(EVENT)]))


def test_a_result_that_is_not_valid_json_fails_the_event_alone() -> None:
    """JSON.stringify writes a lone surrogate as `\\ud800`, which orjson refuses: before, the
    error escaped the chain (a stream worker retried its micro-batch forever)."""
    chain = chain_for("return $.bad ? {s: String.fromCharCode(0xd800)} : $")
    results = chain.process_many([{**EVENT, "bad": True}, dict(EVENT)])
    assert isinstance(results[0], Failure) and results[0].error.startswith("transform: the result is not valid JSON")
    assert isinstance(results[1], Row)


# --- the engine's process ------------------------------------------------------------------------

PARENT = """
import os, subprocess, sys, time
from eventspark.steps import transform
t = transform.Transform("return $")
t.run({})
# A process that keeps the engine's stdin open (as a fork would): EOF cannot end the engine.
engine = transform._context(t).process
os.set_inheritable(engine.stdin.fileno(), True)
holder = subprocess.Popen(["sleep", "60"], close_fds=False)
print(engine.pid, holder.pid, flush=True)
time.sleep(60)
"""


def gone(pid: int) -> bool:
    """The process is dead (reaped, or a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def wait_gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_engine_dies_with_its_parent_even_if_its_pipe_stays_open() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        engine, holder = (int(pid) for pid in parent.stdout.readline().split())
        assert not gone(engine)
        parent.kill()  # kill -9: no clean-up code runs
        parent.wait()
        assert wait_gone(engine), "the engine outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        if "holder" in locals():
            os.kill(holder, signal.SIGKILL)


def test_the_engine_ends_with_its_thread() -> None:
    pids: list[int] = []

    def work() -> None:
        transform = Transform("return $")
        transform.run({})
        pids.append(transform_module._context(transform).process.pid)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert wait_gone(pids[0]), "the engine of a finished thread is still running"


# --- the sandbox ---------------------------------------------------------------------------------

STANDARD = set(
    [
        "AggregateError",
        "Array",
        "ArrayBuffer",
        "Atomics",
        "BigInt",
        "BigInt64Array",
        "BigUint64Array",
        "Boolean",
        "DataView",
        "Date",
        "Error",
        "EvalError",
        "Float32Array",
        "Float64Array",
        "Function",
        "Infinity",
        "Int16Array",
        "Int32Array",
        "Int8Array",
        "InternalError",
        "JSON",
        "Map",
        "Math",
        "NaN",
        "Number",
        "Object",
        "Promise",
        "Proxy",
        "RangeError",
        "ReferenceError",
        "Reflect",
        "RegExp",
        "Set",
        "SharedArrayBuffer",
        "String",
        "Symbol",
        "SyntaxError",
        "TypeError",
        "URIError",
        "Uint16Array",
        "Uint32Array",
        "Uint8Array",
        "Uint8ClampedArray",
        "WeakMap",
        "WeakSet",
        "decodeURI",
        "decodeURIComponent",
        "encodeURI",
        "encodeURIComponent",
        "escape",
        "eval",
        "globalThis",
        "isFinite",
        "isNaN",
        "parseFloat",
        "parseInt",
        "undefined",
        "unescape",
    ]
)
"""ECMAScript's globals: no `std`, `os`, `require`, `fetch`, `XMLHttpRequest`, `process`..."""


def test_the_transform_sees_only_ecmascript() -> None:
    transform = Transform("return {names: Object.getOwnPropertyNames(globalThis)}")
    names = set(transform.run({})[0]["names"])
    extra = {name for name in names - STANDARD if not name.startswith("__")}
    assert not extra, extra


@pytest.mark.parametrize("module", ["std", "os", "/etc/passwd", "node:fs", "https://example.com/x.js"])
def test_modules_cannot_be_imported(module: str) -> None:
    with pytest.raises(TransformSyntaxError, match="SyntaxError"):
        Transform.compile(f"import * as m from {module!r}; return $")
    # A dynamic import is a promise that never settles: no module loader, no job ever runs.
    source = (
        f'if ($.n == 0) import({module!r}).then(m => globalThis.m = m, e => globalThis.m = "" + e);'
        " return {m: globalThis.m}"
    )
    transform = Transform(source)
    assert [transform.run({"n": n}) for n in (0, 1, 2)] == [[{}], [{}], [{}]]  # `m` never set


def test_the_engine_cannot_start_processes_nor_write_files(tmp_path: Path) -> None:
    """The second wall, should a bug give the transform a way out: the engine's process limits."""
    transform = Transform("return $")
    transform.run({})
    pid = transform_module._context(transform).process.pid
    limits = Path(f"/proc/{pid}/limits").read_text()
    assert any(line.startswith("Max file size") and line.split()[3] == "0" for line in limits.splitlines()), limits
    assert any(line.startswith("Max processes") and line.split()[2] == "0" for line in limits.splitlines()), limits


# --- a Spark task's events ------------------------------------------------------------------------


def test_a_spark_task_sends_its_events_in_batches_keeps_their_order_and_skips_done_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eventspark.batch.partition import process_splits
    from eventspark.batch.splits import Split
    from eventspark.destinations.base import ORDER_COLUMN
    from eventspark.destinations.duckdb.configuration import DuckDBDestination
    from tests.batch.test_partition import RecordingJsonStage, _plan

    stage = RecordingJsonStage(refuse=set())
    plan = _plan(tmp_path, stage)
    plan.destinations["dd"] = DuckDBDestination.model_validate(
        {
            "type": "duckdb",
            "data_layout": {"table_name_template": "{{.event_type}}"},
            "transform": 'if ($.id == 7) throw new Error("bad");'
            ' return [{...$, event_type: "a"}, {...$, event_type: "b"}]',
        }
    )
    plan.primary_keys = {"dd": ("id",)}
    plan.done = {("log", "dd"): frozenset({"a"})}  # a rerun: this log's rows of table `a` are loaded already
    path = tmp_path / "log"
    path.write_bytes(b"".join(orjson.dumps({"event_type": "x", "id": n}) + b"\n" for n in range(1200)))
    calls = count_exchanges(monkeypatch)
    (result,) = process_splits(plan, 3, [Split(str(path), 0, path.stat().st_size)])
    assert calls[0] < 30, calls  # a few sampled events alone, then batches: not 1200 round trips
    counts = {c.table: (c.rows, c.failed) for c in result.counts}
    assert counts == {"": (0, 1), "b": (1199, 0)}  # nothing for `a` again; the throwing event failed
    rows = [dict(zip(columns, row, strict=True)) for columns, chunk in stage.written for row in chunk]
    assert {row["event_type"] for row in rows} == {"b"} and len(rows) == 1199
    assert len({row[ORDER_COLUMN] for row in rows}) == 1199  # one per line: the last of a key wins an upsert
    by_line = sorted(rows, key=lambda row: row[ORDER_COLUMN])
    assert [row["id"] for row in by_line] == [n for n in range(1200) if n != 7]  # each its own line's seq
