from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspark.steps.paths import MISSING, get_path, parse_path, pop_path, set_path


@pytest.mark.parametrize(
    ("path", "keys"),
    [
        ("/a/b", ("a", "b")),
        ("a/b", ("a", "b")),
        ("/a/b/", ("a", "b")),
        ("  / a / b ", ("a", "b")),
        ("/another parameter/foo", ("another parameter", "foo")),
        ("/a//b", ("a", "", "b")),
        ("/", ()),
        ("", ()),
    ],
)
def test_parse_path(path: str, keys: tuple[str, ...]) -> None:
    assert parse_path(path) == keys


def test_parse_path_reuses_parsed_tuples() -> None:
    assert parse_path("/eventn_ctx/user_agent") is parse_path("/eventn_ctx/user_agent")


def test_get_path_walks_nested_objects() -> None:
    event = {"a": {"b": {"c": 1}}, "n": None}
    assert get_path(event, ("a", "b", "c")) == 1
    assert get_path(event, "/a/b") == {"c": 1}
    assert get_path(event, ()) is event


def test_get_path_missing_gives_default() -> None:
    event: dict[str, Any] = {"a": {"b": 1}, "s": "text", "l": [{"x": 1}], "n": None}
    assert get_path(event, "/a/zz") is None
    assert get_path(event, "/zz/b", default=7) == 7
    assert get_path(event, "/s/x", MISSING) is MISSING  # a string has no children
    assert get_path(event, "/l/0", MISSING) is MISSING  # arrays are not indexed
    assert get_path(event, "/n", MISSING) is None  # present but null
    assert get_path(event, "/n/x", MISSING) is MISSING


def test_set_path_creates_parents() -> None:
    event: dict[str, Any] = {"keep": 1, "nulled": None}
    assert set_path(event, "/a/b/c", 5)
    assert set_path(event, ("nulled", "x"), True)
    assert event == {"keep": 1, "a": {"b": {"c": 5}}, "nulled": {"x": True}}


def test_set_path_overwrites_leaf_but_never_a_scalar_parent() -> None:
    event: dict[str, Any] = {"a": {"b": 1}, "s": "text"}
    assert set_path(event, "/a/b", {"new": 1})
    assert not set_path(event, "/s/x", 1)
    assert event == {"a": {"b": {"new": 1}}, "s": "text"}


def test_set_path_root_merges_objects_only() -> None:
    event = {"a": 1, "b": 2}
    assert set_path(event, "/", {"b": 3, "c": 4})
    assert not set_path(event, "/", "scalar")
    assert event == {"a": 1, "b": 3, "c": 4}


def test_pop_path_removes_and_returns() -> None:
    event: dict[str, Any] = {"a": {"b": 1, "c": 2}, "s": "text"}
    assert pop_path(event, "/a/b") == 1
    assert pop_path(event, "/a/b", "gone") == "gone"
    assert pop_path(event, "/s/x", "gone") == "gone"
    assert pop_path(event, "/missing/x") is None
    assert event == {"a": {"c": 2}, "s": "text"}
    assert pop_path(event, "/a/c") == 2
    assert event == {"a": {}, "s": "text"}  # emptied parents stay


def test_pop_path_root_takes_everything() -> None:
    event: dict[str, Any] = {"a": {"b": 1}}
    taken = pop_path(event, "/")
    assert taken == {"a": {"b": 1}}
    assert event == {}


_keys = st.lists(st.text(alphabet="abcxyz_ 1", min_size=1).map(str.strip).filter(bool), min_size=1, max_size=4)


@given(
    keys=_keys,
    value=st.one_of(st.integers(), st.text(), st.none(), st.dictionaries(st.text(), st.integers())),
)
def test_set_get_pop_round_trip(keys: list[str], value: Any) -> None:
    path = "/" + "/".join(keys)
    assert parse_path(path) == tuple(keys)
    event: dict[str, Any] = {}
    assert set_path(event, path, value)
    assert get_path(event, path, MISSING) == value
    assert pop_path(event, tuple(keys), MISSING) == value
    assert get_path(event, path, MISSING) is MISSING
