"""JSON columns and the unmapped column on every SQL destination, batch and stream (each mode its
type has), end to end as `tests/destinations/test_contract.py` runs them: a config file, rotated
logs and a batch pass, or the stream queue and its worker; what the warehouse holds is read with
its own driver and compared as JSON (docs/json-columns.md)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from eventspark.steps.typing import DataType
from tests.destinations import conftest as destination_fixtures
from tests.destinations.test_contract import CASES, KEY, Case, eid, event, start

# Fixtures of a conftest this directory does not see (the warehouses ask for them by name).
clickhouse_server = destination_fixtures.clickhouse_server
clickhouse_db = destination_fixtures.clickhouse_db
mysql_db = destination_fixtures.mysql_db

JSON_RULES = [
    {"src": "/props", "action": "cast", "type": "json"},
    {"src": "/list", "dst": "/items", "action": "move", "type": "json"},
    {"src": "/count", "action": "cast", "type": "json"},
    {"src": "/label", "action": "cast", "type": "json"},
]
LITERAL_JSON_TYPE = {
    "postgres": "jsonb",
    "redshift": "SUPER",
    "mysql": "JSON",
    "duckdb": "JSON",
    "clickhouse": "String",
    "snowflake": "VARIANT",
    "bigquery": "JSON",
}


def as_json(value: Any) -> Any:
    """A JSON column's stored value as Python data, whatever the driver gave (text or parsed)."""
    if isinstance(value, bytes | bytearray):
        value = value.decode()
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value  # a driver that parsed a JSON string already (psycopg)
    return value


def absent(case: Case) -> Any:
    """How a JSON column reads where the event had no value: NULL, or '' in ClickHouse's String."""
    return case.absent(DataType.STRING)


def json_rows(case: Case, table: str, json_columns: list[str], other: list[str]) -> list[tuple[Any, ...]]:
    """`other` columns as stored, then `json_columns` as JSON data, sorted by the first column."""
    columns = [*other, *json_columns]
    stored = case.warehouse.select(table, columns)
    split = len(other)
    rows = [(*row[:split], *(as_json(v) for v in row[split:])) for row in stored]
    return sorted(rows, key=lambda row: str(row[0]))


def prepare(request: pytest.FixtureRequest, dest_type: str) -> None:
    """The Redshift contract runs on PostgreSQL, which has no SUPER nor JSON_PARSE: a domain and
    a function of the test's own schema stand in for them (found through the search path)."""
    if dest_type != "redshift":
        return
    import psycopg

    from tests.conftest import pg_conninfo

    schema = request.getfixturevalue("pg_schema")
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE DOMAIN "{schema}".super AS jsonb')
        conn.execute(
            f'CREATE FUNCTION "{schema}".json_parse(text) RETURNS jsonb AS $$ SELECT $1::jsonb $$ LANGUAGE sql'
        )
    datasource = request.getfixturevalue("pg_datasource")
    datasource["parameters"] = {"options": f"-c search_path={schema},public"}


def start_case(request: pytest.FixtureRequest, dest_type: str, mode: str, layout: dict[str, Any]) -> Case:
    prepare(request, dest_type)
    return start(request, dest_type, mode, {"table_name_template": "events", **layout})


@pytest.mark.parametrize(("dest_type", "mode"), CASES)
def test_json_columns_hold_whole_subtrees(request: pytest.FixtureRequest, dest_type: str, mode: str) -> None:
    case = start_case(request, dest_type, mode, {"mappings": {"keep_unmapped": True, "fields": JSON_RULES}})
    sent = [
        event(0, props={"b": {"c": [1, 2]}, "a": "x"}, list=[1, {"k": "v"}], count=3, label="hello world", n=0),
        event(1, props={"a": None, "z": True}, list=[], count=2.5, label="", n=1),
        event(2, n=2),  # no JSON field: NULLs
    ]
    case.send(sent)
    case.deliver()

    columns = case.columns("events")
    assert "props_a" not in columns and "props_b_c" not in columns, columns  # not flattened
    assert {"props", "items", "count", "label", "n"} <= columns.keys(), columns
    assert "list" not in columns
    rows = json_rows(case, "events", ["props", "items", "count", "label"], [KEY])
    assert rows[2] == (eid(2), *[absent(case)] * 4)
    assert rows[:2] == [
        (eid(0), {"a": "x", "b": {"c": [1, 2]}}, [1, {"k": "v"}], 3, "hello world"),
        (eid(1), {"a": None, "z": True}, [], 2.5, ""),
    ]
    assert case.failed() == []


@pytest.mark.parametrize(("dest_type", "mode"), CASES)
def test_each_warehouse_json_type_by_its_own_name(request: pytest.FixtureRequest, dest_type: str, mode: str) -> None:
    rule = {"src": "/props", "action": "cast", "type": LITERAL_JSON_TYPE[dest_type]}
    case = start_case(request, dest_type, mode, {"mappings": {"keep_unmapped": True, "fields": [rule]}})
    case.send([event(0, props={"q": [1, "two"], "p": {"r": 1.5}}), event(1, props={"s": "t"})])
    case.deliver()
    assert "props_q" not in case.columns("events")
    assert json_rows(case, "events", ["props"], [KEY]) == [
        (eid(0), {"p": {"r": 1.5}, "q": [1, "two"]}),
        (eid(1), {"s": "t"}),
    ]
    assert case.failed() == []


@pytest.mark.parametrize(("dest_type", "mode"), CASES)
def test_a_frozen_schema_puts_new_fields_in_the_unmapped_column(
    request: pytest.FixtureRequest, dest_type: str, mode: str
) -> None:
    case = start_case(request, dest_type, mode, {"unmapped_column": "extra", "schema_freeze": True})
    case.send([event(0, a=1)])  # the first load creates the table
    case.deliver()
    created = case.columns("events")
    assert set(created) == {"_timestamp", KEY, "a"}

    case.send([event(1, a=2, b="new", c={"x": 1.5, "y": [1]}), event(2, a=3), event(3, d=True)])
    case.deliver()

    columns = case.columns("events")
    assert set(columns) == {"_timestamp", KEY, "a", "extra"}, columns
    rows = json_rows(case, "events", ["extra"], [KEY])
    assert [(key, extra) for key, extra in rows if extra != absent(case)] == [
        (eid(1), {"b": "new", "c_x": 1.5, "c_y": "[1]"}),
        (eid(3), {"d": True}),
    ]
    assert case.failed() == []


@pytest.mark.parametrize(("dest_type", "mode"), CASES)
def test_fields_beyond_max_columns_go_to_the_unmapped_column(
    request: pytest.FixtureRequest, dest_type: str, mode: str
) -> None:
    case = start_case(request, dest_type, mode, {"unmapped_column": "extra", "max_columns": 4})
    case.send([event(0, a=1, b="x")])  # _timestamp, the id, a, b: the table is full
    case.deliver()
    assert set(case.columns("events")) == {"_timestamp", KEY, "a", "b"}

    case.send([event(1, a=2, c=5, d={"e": "f"}), event(2, b="y")])
    case.deliver()

    assert set(case.columns("events")) == {"_timestamp", KEY, "a", "b", "extra"}
    rows = json_rows(case, "events", ["extra"], [KEY, "a"])
    assert [(key, a, extra) for key, a, extra in rows if extra != absent(case)] == [(eid(1), 2, {"c": 5, "d_e": "f"})]
    assert case.failed() == []
