import json
import re

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspark.steps import flatten as flatten_module
from eventspark.steps.flatten import (
    MAX_DEPTH,
    MAX_NAME_LENGTH,
    column_name,
    flatten,
    flatten_with_losses,
    sanitize_name,
)
from tests.shared_data import eventnative_data

TESTDATA = eventnative_data()
SAFE_NAME = re.compile(r"[a-z0-9_]{1,63}")

keys = st.one_of(
    st.text(max_size=12),
    st.text(alphabet="aB _-.$()[]{}@!#%&,;:^", max_size=6),
    st.text(alphabet="ab", min_size=60, max_size=70),
)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=3),
)
events = st.recursive(
    st.dictionaries(keys, leaves, max_size=5),
    lambda children: st.dictionaries(keys, st.one_of(leaves, children), max_size=5),
    max_leaves=30,
)


def count_leaves(obj: dict, depth: int = 1) -> int:
    total = 0
    for value in obj.values():
        if isinstance(value, dict) and value and depth < MAX_DEPTH:
            total += count_leaves(value, depth + 1)
        elif value is not None and value != {}:
            total += 1
    return total


def test_flattens_the_eventnative_fact() -> None:
    with open(f"{TESTDATA}/fact_output_1.0.json", "rb") as f:
        event = orjson.loads(f.read())
    assert flatten(event) == {
        "eventn_ctx_user_agent": "Go-http-client/1.1",
        "eventn_ctx_event_id": "123",
        "_timestamp": "2020-06-16T23:00:00.000000Z",
        "api_key": "c2stoken",
        "key1_inner_key_1": '["1","2","3"]',
        "key1_inner_key_2": "test",
        "key2": 5,
        "source_ip": "95.82.232.185",
    }


def test_mobile_event_keys_with_spaces() -> None:
    with open(f"{TESTDATA}/mobile_fact_output.json", "rb") as f:
        row = flatten(orjson.loads(f.read()))
    assert row["event_type"] == "user tapped purchase button"
    assert row["another_parameter_foo"] == "bar"
    assert row["parsed_ua_device_model"] == "iPhone 12"


def test_special_characters_and_case() -> None:
    row = flatten({"Hello World": 1, "a(b)$[c]{d}@!#%&,.;:^-e": 2, "tab\tnew\nline": 3, "q\"u`o'te\\": 4})
    assert row == {"hello_world": 1, "a_b___c__d____________e": 2, "tab_new_line": 3, "q_u_o_te_": 4}


def test_nulls_and_empty_objects_give_no_column_but_empty_arrays_do() -> None:
    assert flatten({"a": None, "b": {}, "c": {"d": None, "e": {}}, "f": []}) == {"f": "[]"}


def test_arrays_become_compact_json() -> None:
    row = flatten({"a": [1, "x", {"k": [True, None]}], "t": (1, 2), "big": [2**70]})
    assert row == {"a": '[1,"x",{"k":[true,null]}]', "t": "[1,2]", "big": f"[{2**70}]"}


def test_empty_key_gets_a_safe_name() -> None:
    assert flatten({"": 1, "a": {"": 2}}) == {"_": 1, "a__": 2}
    assert sanitize_name("") == "_"


def test_non_ascii_keys_stay_distinct_and_stable() -> None:
    row = flatten({"имя": 1, "дом": 2, "café": 3, "cafe": 4})
    assert len(row) == 4
    assert all(SAFE_NAME.fullmatch(name) for name in row)
    assert row["cafe"] == 4
    assert sanitize_name("имя") == sanitize_name("имя") != sanitize_name("дом")


def test_long_names_are_bounded_and_distinct() -> None:
    prefix = "x" * 80
    row = flatten({prefix + "a": 1, prefix + "b": 2, "n": {"y" * 40: {"z" * 40: 3}}})
    assert len(row) == 3
    assert all(len(name) == MAX_NAME_LENGTH and SAFE_NAME.fullmatch(name) for name in row)
    assert column_name(("n", "y" * 40, "z" * 40)) in row


def test_names_at_the_limit_are_kept_as_they_are() -> None:
    name = "k" * MAX_NAME_LENGTH
    assert flatten({name: 1}) == {name: 1}


@pytest.mark.parametrize(
    "event",
    [
        {"a b": 1, "a_b": 2},
        {"a_b": 2, "a b": 1},
        {"a": {"b": 1}, "a_b": 2},
        {"a_b": 2, "a": {"b": 1}},
        {"A": 1, "a": 2},
    ],
)
def test_collisions_keep_one_value_whatever_the_key_order(event: dict) -> None:
    row, lost = flatten_with_losses(event)
    assert flatten(event) == row
    assert len(row) == 1
    assert len(lost) == 1
    reordered = dict(reversed(list(event.items())))
    assert flatten(reordered) == row


def test_events_without_collisions_skip_the_slow_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # flatten counts the leaves it writes to spot collisions; a miscount would send every event
    # down the slow path (too many) or let a collision through (too few).
    def slow_path(event: dict) -> None:
        raise AssertionError("slow path taken")

    monkeypatch.setattr(flatten_module, "flatten_with_losses", slow_path)
    deep: dict = {"leaf": 1}
    for _ in range(MAX_DEPTH + 2):
        deep = {"k": deep}
    event = {"a": None, "b": {}, "c": {"d": None, "e": {}, "f": [1], "g": {"h": 1}}, "i": (), "deep": deep}
    assert len(flatten(event)) == 4


def test_collision_rule_prefers_the_unsanitised_key() -> None:
    assert flatten_with_losses({"a b": 1, "a_b": 2}) == ({"a_b": 2}, ["/a b"])
    assert flatten_with_losses({"A": 1, "a": 2}) == ({"a": 2}, ["/A"])


def test_lost_paths_escape_slashes() -> None:
    _, lost = flatten_with_losses({"a/b": 1, "a_b": 2})
    assert lost == ["/a~1b"]


def test_depth_is_bounded() -> None:
    event: dict = {"leaf": 1}
    for _ in range(200):
        event = {"k": event}
    row = flatten(event)
    assert len(row) == 1
    ((name, value),) = row.items()
    assert SAFE_NAME.fullmatch(name)
    assert isinstance(value, str)
    assert json.loads(value)["k"]["k"]


def cached_names(node: flatten_module._NameNode) -> int:
    return len(node.columns) + sum(1 + cached_names(child) for child in node.children.values())


def test_caches_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flatten_module, "_CACHE_LIMIT", 10)
    monkeypatch.setattr(flatten_module, "_sanitized_keys", {})
    monkeypatch.setattr(flatten_module, "_name_root", flatten_module._NameNode(""))
    monkeypatch.setattr(flatten_module, "_cached_names", 0)
    for i in range(100):
        flatten({f"key {i}": i, f"parent {i}": {"child": i}})
        assert len(flatten_module._sanitized_keys) <= 10
        assert cached_names(flatten_module._name_root) <= 10
    assert flatten({"key 5": 5, "parent 5": {"child": 5}}) == {"key_5": 5, "parent_5_child": 5}


def test_cached_names_are_reused() -> None:
    event = {"Parent Key": {"Child.Key": 1, "x" * 80: 2}}
    first = flatten(event)
    assert flatten(event) == first == {"parent_key_child_key": 1, column_name(("Parent Key", "x" * 80)): 2}


@given(events)
def test_names_are_safe_and_no_value_is_lost_unreported(event: dict) -> None:
    row, lost = flatten_with_losses(event)
    assert all(SAFE_NAME.fullmatch(name) for name in row)
    assert len(row) + len(lost) == count_leaves(event)
    assert flatten(event) == row


@given(events)
def test_flattening_does_not_depend_on_key_order(event: dict) -> None:
    def reverse(obj: dict) -> dict:
        return {k: reverse(v) if isinstance(v, dict) else v for k, v in reversed(list(obj.items()))}

    assert flatten(reverse(event)) == flatten(event)


@given(st.lists(keys, min_size=1, max_size=4), st.integers())
def test_column_name_is_where_flatten_puts_a_value(path: list[str], value: int) -> None:
    event: dict = {path[-1]: value}
    for key in reversed(path[:-1]):
        event = {key: event}
    assert flatten(event) == {column_name(path): value}


@given(st.text())
def test_sanitize_name_is_always_safe(name: str) -> None:
    assert SAFE_NAME.fullmatch(sanitize_name(name))


def test_non_string_keys_from_yaml_constants() -> None:
    assert flatten({"c": {1: "one"}}) == {"c_1": "one"}
    assert flatten({"c": {True: "yes"}}) == {"c_true": "yes"}  # True == 1 must not share a cache entry
