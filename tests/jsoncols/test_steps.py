"""The pure parts of JSON columns (docs/json-columns.md): mapping rules that keep a subtree whole,
its JSON text, the dialects' JSON types, the unmapped rule, config checks and the dry run."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventspark.config import ConfigError
from eventspark.destinations.dialect import get_dialect
from eventspark.ops.dryrun import dry_run
from eventspark.steps.diff import ColumnLimitError, Table, TablePatch, UnmappedRule, check_column_limit, diff
from eventspark.steps.flatten import flatten, json_text
from eventspark.steps.mapping import Mapper
from eventspark.steps.typing import DataType, Field, header_for
from tests.batch.helpers import make_config

EVENT = {
    "src": "api",
    "props": {"z": 1, "a": [1, {"b": None}], "n": {"deep": "x"}},
    "list": [3, "4"],
    "obj": {"k": "v"},
    "name": "plain",
    "gone": None,
}


def mapped(keep_unmapped: bool, rules: list[dict[str, Any]], in_place: bool) -> tuple[dict[str, Any], dict[str, str]]:
    event = copy.deepcopy(EVENT)
    values, casts = Mapper.build(keep_unmapped, rules).apply(event, in_place=in_place)
    return flatten(values), dict(casts)


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("keep_unmapped", [True, False])
def test_a_json_cast_keeps_the_subtree_whole(keep_unmapped: bool, in_place: bool) -> None:
    rules = [
        {"src": "/props", "action": "cast", "type": "JSONB"},
        {"src": "/list", "dst": "/items/all", "action": "move", "type": "variant"},
        {"src": "/name", "action": "cast", "type": "json"},
        {"src": "/gone", "action": "cast", "type": "json"},
    ]
    row, casts = mapped(keep_unmapped, rules, in_place)
    assert row["props"] == '{"a":[1,{"b":null}],"n":{"deep":"x"},"z":1}'  # keys sorted
    assert row["items_all"] == '[3,"4"]'
    assert row["name"] == '"plain"'  # a scalar as JSON too
    assert "gone" not in row  # null stays NULL
    assert not any(name.startswith("props_") for name in row)
    assert ("obj_k" in row) is keep_unmapped and "list" not in row
    assert casts["props"] == "JSONB" and casts["items_all"] == "variant"
    assert EVENT["props"] == {"z": 1, "a": [1, {"b": None}], "n": {"deep": "x"}}


def test_the_generic_string_type_keeps_objects_as_json_and_scalars_as_they_are() -> None:
    rules = [{"src": "/obj", "action": "cast", "type": "String"}, {"src": "/name", "action": "cast", "type": "string"}]
    row, casts = mapped(True, rules, in_place=True)
    assert row["obj"] == '{"k":"v"}' and row["name"] == "plain"
    header = header_for("t", row, casts)
    assert header.fields["obj"] == Field(DataType.STRING)  # a generic type: the dialect's string


def test_other_types_still_flatten_and_cast_as_before() -> None:
    row, casts = mapped(True, [{"src": "/props/z", "action": "cast", "type": "numeric(12,2)"}], in_place=True)
    assert row["props_z"] == 1 and row["props_n_deep"] == "x" and casts["props_z"] == "numeric(12,2)"


def test_json_text_is_compact_sorted_and_takes_big_integers() -> None:
    assert json_text({"b": 1, "a": {"d": [1.5, None], "c": "é"}}) == '{"a":{"c":"é","d":[1.5,null]},"b":1}'
    assert orjson.loads(json_text({"x": 2**70})) == {"x": 2**70}


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [
        ("postgres", "json"),
        ("duckdb", "json"),
        ("mysql", "json"),
        ("bigquery", "json"),
        ("snowflake", "VARIANT"),
        ("redshift", "SUPER"),
        ("clickhouse", "String"),
    ],
)
def test_the_generic_json_type_is_each_dialects_json_type(dialect: str, expected: str) -> None:
    found = get_dialect(dialect)
    assert found.column_type(Field(DataType.STRING, "json")) == expected
    assert found.column_type(Field(DataType.STRING, "jsonb")) == "jsonb"  # literal types stay


# --- the unmapped rule ------------------------------------------------------------------------------


def test_fields_fitting_max_columns_all_become_columns() -> None:
    rule = UnmappedRule("extra", 5, False)
    assert set(rule.allowed({"a": "t", "extra": "json"}, {"b", "c", "d"})) == {"b", "c", "d"}
    assert rule.allowed(None, {"x"}) == {"x"}


def test_beyond_max_columns_the_first_fields_win_by_a_stable_order() -> None:
    rule = UnmappedRule("extra", 4, False, primary_keys=["zid"])
    new = {"b", "a", "zid", "_timestamp", "c"}
    assert set(rule.allowed(None, new)) == {"_timestamp", "zid", "a", "b"}
    assert set(rule.allowed({"q": "t", "extra": "json"}, new)) == {"_timestamp", "zid", "a"}
    assert rule.full({"a": "", "b": "", "c": "", "d": "", "extra": ""})
    assert not rule.full({"a": "", "b": "", "c": ""}) and not rule.full(None)


def test_place_moves_the_other_fields_into_one_merged_object() -> None:
    rule = UnmappedRule("extra", 2, False)
    row: dict[str, Any] = {"a": 1, "b": "x", "c_d": 2.5, "nil": None}
    assert rule.place(row, {"a": "bigint"}) is None
    assert row == {"a": 1, "nil": None, "extra": '{"b":"x","c_d":2.5}'}
    row["e"] = True  # placed again (a stream retry after a fresh schema): merged
    assert rule.place(row, {"a": "bigint"}) is None
    assert orjson.loads(row["extra"]) == {"b": "x", "c_d": 2.5, "e": True}
    untouched = {"a": 2}
    assert rule.place(untouched, {"a": "bigint"}) is None and untouched == {"a": 2}


def test_a_frozen_schema_without_an_unmapped_column_fails_the_event() -> None:
    rule = UnmappedRule(None, 0, True)
    row = {"a": 1, "new": 2}
    assert rule.full({"a": "bigint"})
    error = rule.place(row, {"a": "bigint"})
    assert error is not None and "'new'" in error and "schema_freeze" in error
    assert row == {"a": 1, "new": 2}


def test_casts_add_the_unmapped_columns_json_type_once_per_casts_dict() -> None:
    rule = UnmappedRule("extra", 3, False)
    casts = {"_timestamp": "TIMESTAMP"}
    assert rule.casts(casts) == {"_timestamp": "TIMESTAMP", "extra": "json"}
    assert rule.casts(casts) is rule.casts(casts)


def test_the_driver_patch_keeps_the_allowed_columns_and_asks_for_another_pass() -> None:
    rule = UnmappedRule("extra", 3, False)
    existing = Table("t", {"a": "bigint"})
    patch = diff(existing, Table("t", {"a": "bigint", "d": "text", "b": "text", "c": "text"}))
    reduced, reason = rule.limit(existing, patch, "jsonb")
    assert reduced.add_columns == {"b": "text", "c": "text", "extra": "jsonb"}
    assert "1 new field(s) (d)" in reason and "next pass" in reason
    check_column_limit(existing, reduced, 3, exempt="extra")  # the unmapped column is not counted
    with pytest.raises(ColumnLimitError):
        check_column_limit(existing, reduced, 3)
    fits = TablePatch("t", add_columns={"b": "text"})
    assert rule.limit(existing, fits, "jsonb") == (fits, "")


def test_a_frozen_table_only_gets_the_unmapped_column() -> None:
    rule = UnmappedRule("extra", 0, True)
    existing = Table("t", {"a": "bigint"})
    reduced, reason = rule.limit(existing, TablePatch("t", add_columns={"b": "text", "extra": "json"}), "json")
    assert reduced.add_columns == {"extra": "json"} and reason
    created, none = rule.limit(None, TablePatch("t", True, {"a": "bigint", "b": "text"}), "json")
    assert created.add_columns == {"a": "bigint", "b": "text"} and none == ""  # frozen once created


# --- config and dry run -----------------------------------------------------------------------------


def duckdb(**layout: Any) -> dict[str, Any]:
    return {"type": "duckdb", "duckdb": {"path": "w.duckdb"}, "data_layout": {"table_name_template": "t", **layout}}


@pytest.mark.parametrize("name", ["Extra", "a b", "x" * 64, ""])
def test_an_unmapped_column_must_be_a_plain_column_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="unmapped_column"):
        make_config(tmp_path, {"d": duckdb(unmapped_column=name)})


def test_the_unmapped_column_needs_a_table_destination(tmp_path: Path) -> None:
    webhook = {"type": "webhook", "mode": "stream", "webhook": {"url": "http://127.0.0.1:9/x"}}
    webhook["data_layout"] = {"schema_freeze": True}
    with pytest.raises(ConfigError, match="apply to SQL destinations"):
        make_config(tmp_path, {"w": webhook})


def test_dry_run_shows_json_columns_and_the_unmapped_column(tmp_path: Path) -> None:
    rules = [{"src": "/props", "action": "cast", "type": "json"}]
    loaded = make_config(tmp_path, {"d": duckdb(mappings={"fields": rules}, unmapped_column="extra", max_columns=3)})
    dest = loaded.config.destinations["d"]
    event = {"src": "api", "props": {"b": 1, "a": [2]}, "_timestamp": "2026-11-01T10:00:00Z", "x": 1, "y": "z"}
    [result] = dry_run("d", dest, tmp_path, None, [event], 100)
    assert result.status == "ok", result.error
    fields = {f["field"]: (f["type"], f["value"]) for f in result.fields}
    assert fields["props"] == ("json", '{"a":[2],"b":1}')
    assert fields["extra"] == ("json", '{"x":1,"y":"z"}')
    assert set(fields) == {"_timestamp", "props", "src", "extra"}


def test_a_json_type_the_warehouse_lacks_is_a_config_error(tmp_path: Path) -> None:
    mysql = {
        "type": "mysql",
        "datasource": {"host": "127.0.0.1", "db": "x", "username": "root"},
        "data_layout": {"mappings": {"fields": [{"src": "/p", "action": "cast", "type": "jsonb"}]}},
    }
    with pytest.raises(ConfigError, match=r"fields\[0\]: mysql has no type 'jsonb'; use json"):
        make_config(tmp_path, {"m": mysql})
    mysql["data_layout"]["mappings"]["fields"][0]["type"] = "JSON"
    assert make_config(tmp_path, {"m": mysql}).config.destinations["m"].type == "mysql"
