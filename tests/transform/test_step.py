"""The transform step and the chain around it: EventNative's doc examples and hostile transforms."""

import pickle
import signal
import threading
import time

import pytest

from eventspark.config.loading import ConfigError, build_loaded
from eventspark.destinations.duckdb.configuration import DuckDBDestination
from eventspark.steps import transform as transform_module
from eventspark.steps.chain import DestinationChain, Failure, Row
from eventspark.steps.transform import Transform, TransformFailed, TransformSyntaxError

EVENT = {
    "event_type": "pageview",
    "_timestamp": "2026-11-24T10:00:00.000000Z",
    "eventn_ctx": {"event_id": "e1", "user": {"anonymous_id": "a1"}},
    "properties": {"amount": 12.5, "items": [{"id": 1}, {"id": 2}]},
}


def chain_for(transform: str, **extra: object) -> DestinationChain:
    config = DuckDBDestination.model_validate(
        {"type": "duckdb", "transform": transform, "transform_timeout_ms": 300, **extra}
    )
    return DestinationChain.build("d", config, None, None)


def run(transform: str, event: dict | None = None, **extra: object):
    return chain_for(transform, **extra).process(dict(event or EVENT))


# --- EventNative's documented uses --------------------------------------------------------------


def test_skip_with_null() -> None:
    assert run('if ($.event_type == "pageview") { return null }; return $') is None
    assert isinstance(run('if ($.event_type == "click") { return null }; return $'), Row)


def test_expression_body_returns_its_value() -> None:
    row = run('$.event_type == "click" ? null : {...$, kind: "expr"}')
    assert isinstance(row, Row) and row.values["kind"] == "expr"


def test_multiply_gives_a_row_per_event_with_unique_ids() -> None:
    rows = run("return $.properties.items.map(item => ({...$, item_id: item.id, properties: undefined}))")
    assert isinstance(rows, list) and len(rows) == 2
    assert [row.values["item_id"] for row in rows] == [1, 2]
    assert [row.values["eventn_ctx_event_id"] for row in rows] == ["e1", "e1_1"]
    assert all(row.values["_timestamp"] == EVENT["_timestamp"] for row in rows)
    assert all(row.table == "events" for row in rows)


def test_array_ignores_null_and_false_and_empty_skips() -> None:
    row = run("return [null, false, $]")
    assert isinstance(row, Row)
    assert run("return []") is None
    assert run("return [null, false]") is None


def test_rename_table_with_jitsu_table_name() -> None:
    row = run('return {...$, JITSU_TABLE_NAME: "Custom Events"}')
    assert isinstance(row, Row) and row.table == "custom_events"
    assert "JITSU_TABLE_NAME" not in row.values and "jitsu_table_name" not in row.values
    rows = run('return [{...$, JITSU_TABLE_NAME: "a"}, {...$, JITSU_TABLE_NAME: "b"}]')
    assert [row.table for row in rows] == ["a", "b"]


def test_template_runs_on_the_transformed_event() -> None:
    row = run('$.event_type = "changed"; return $', data_layout={"table_name_template": "{{.event_type}}"})
    assert row.table == "changed"


def test_table_name_null_skips_and_reserved_fails() -> None:
    assert run('return {...$, JITSU_TABLE_NAME: "null"}') is None
    assert run('return {...$, JITSU_TABLE_NAME: ""}') is None
    failure = run('return {...$, JITSU_TABLE_NAME: "_eventspark_loads"}')
    assert isinstance(failure, Failure) and failure.error.startswith("transform: JITSU_TABLE_NAME")


def test_typed_fields_become_casts_of_the_flattened_columns() -> None:
    row = run(
        'return {...$, __sql_type_amount: "numeric(12,2)", amount: 3,'
        ' properties: {...$.properties, __sql_type_label: ["text", "varchar(64)"], label: "x"}}'
    )
    assert row.casts["amount"] == "numeric(12,2)"
    assert row.casts["properties_label"] == "varchar(64)"
    assert not any("sql_type" in key for key in row.values)
    assert row.casts["_timestamp"] == "TIMESTAMP"  # the mapping's casts are kept


def test_bad_sql_type_fails_the_event() -> None:
    failure = run('return {...$, __sql_type_a: "text; drop table x"}')
    assert isinstance(failure, Failure) and "__sql_type_a" in failure.error


def test_json_type_keeps_the_subtree_whole() -> None:
    row = run('return {...$, __sql_type_properties: "jsonb"}')
    assert row.casts["properties"] == "jsonb"
    assert row.values["properties"] == '{"amount":12.5,"items":[{"id":1},{"id":2}]}'


def test_destination_variables_and_disabled_transform() -> None:
    row = run("return {...$, dest: destinationId, kind: destinationType}")
    assert row.values["dest"] == "d" and row.values["kind"] == "duckdb"
    assert "dest" not in run("return {...$, dest: 1}", transform_enabled=False).values
    layout = {"transform": "return null", "transform_enabled": True}  # EventNative's place
    assert run("", data_layout=layout) is None
    assert isinstance(run("", data_layout={**layout, "transform_enabled": False}), Row)


def test_non_flat_chains_get_the_transformed_event() -> None:
    config = DuckDBDestination.model_validate(
        {"type": "duckdb", "transform": "return {a: {b: 1}, __sql_type_x: 'text'}"}
    )
    row = DestinationChain.build("d", config, None, None, flat=False).process(dict(EVENT))
    assert row.values == {"a": {"b": 1}}


# --- failures ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("throw new Error('boom')", "transform: Error: boom"),
        ("while (true) {}", "transform: the transform ran longer than 300 ms"),
        ("var a = []; while (true) a.push('x'.repeat(4096) + a.length)", "transform: the transform used more than"),
        ("return {s: 'x'.repeat(1e9)}", "transform: the transform used more than"),
        ("function f(n) { return f(n + 1) + 1 }; return f(0)", "transform: stack overflow"),
        ("var a = []; for (var i = 0; i < 5000; i++) a.push({i}); return a", "transform: the result has 5000 events"),
        ("return 'text'", "transform: the result is a string"),
        ("return [$, 1]", "transform: the result holds a number"),
        ("return [true]", "transform: the result holds the boolean true"),
    ],
)
def test_hostile_or_wrong_transforms_fail_the_event_and_the_chain_goes_on(source: str, reason: str) -> None:
    chain = chain_for(source)
    started = time.monotonic()
    failure = chain.process(dict(EVENT))
    assert isinstance(failure, Failure) and failure.error.startswith(reason), failure
    assert time.monotonic() - started < 5
    fine = chain_for("return $")  # another transform in the same thread still works
    assert isinstance(fine.process(dict(EVENT)), Row)


def test_context_survives_a_timeout() -> None:
    transform = Transform("if ($.loop) { while (true) {} }; return $", timeout_ms=200)
    with pytest.raises(TransformFailed):
        transform.run({"loop": True})
    assert transform.run({"loop": False}) == [{"loop": False}]


def test_huge_result_is_refused() -> None:
    transform = Transform("return {s: 'x'.repeat(20 * 1024 * 1024)}", memory_mb=256)
    with pytest.raises(TransformFailed, match="larger than 16 MiB"):
        transform.run({})


def test_syntax_error_is_a_config_error() -> None:
    with pytest.raises(TransformSyntaxError):
        Transform.compile("return {")
    raw = {"destinations": {"pg": {"type": "duckdb", "transform": "return {"}}}
    with pytest.raises(ConfigError, match=r"destinations\.pg\.transform: SyntaxError"):
        build_loaded(raw, embedded=False)


def test_one_context_per_thread() -> None:
    transform = Transform("var n = 0; for (var i = 0; i < 20000; i++) n += i; return {...$, n}")
    results: list[object] = []

    def work() -> None:
        results.extend(transform.run({"t": 1})[0]["n"] for _ in range(200))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [199990000] * 800


def test_chain_with_transform_pickles() -> None:
    chain = chain_for("return {...$, x: 1}")
    copy = pickle.loads(pickle.dumps(chain))
    assert copy.process(dict(EVENT)).values == chain.process(dict(EVENT)).values


def test_a_crashed_engine_fails_the_event_and_a_new_one_starts() -> None:
    transform = Transform("return {...$, ok: 1}")
    assert transform.run({"a": 1}) == [{"a": 1, "ok": 1}]
    engine = transform_module._context(transform).process
    engine.send_signal(signal.SIGSEGV)  # what QuickJS does on some out-of-memory paths
    engine.wait()
    with pytest.raises(TransformFailed, match="the JavaScript engine crashed on this event"):
        transform.run({"a": 2})
    assert transform.run({"a": 3}) == [{"a": 3, "ok": 1}]
    assert transform_module._context(transform).process.pid != engine.pid


def test_a_stuck_engine_is_stopped_by_the_wall_clock_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transform_module, "WALL_LIMIT_MIN_SEC", 0.5)
    monkeypatch.setattr(transform_module, "WALL_LIMIT_FACTOR", 0.1)
    transform = Transform("return $", timeout_ms=2000)
    engine = transform_module._context(transform).process
    engine.send_signal(signal.SIGSTOP)  # alive, never answering
    started = time.monotonic()
    with pytest.raises(TransformFailed, match=r"did not answer within 0\.5 s"):
        transform.run({})
    assert time.monotonic() - started < 5
    assert engine.poll() is not None
    assert transform.run({"b": 1}) == [{"b": 1}]
